"""Inside one forward pass: scoped hooks, the logit lens, the newest token's attention.

    from explorer.inside import hooked, logit_lens, attention
    session.logit_lens(step=None, top_n=5)   # the Session methods call these on a replayed step
    session.attention(step=None)

Everything here runs on demand, on a replay of one step (explorer.engine.replay), with hooks that
exist only inside a `with` block; the normal step path never carries a hook.
"""

from explorer.inside.attention import attention
from explorer.inside.hooks import InsideUnavailable, hook_count, hooked
from explorer.inside.lens import logit_lens

__all__ = ["InsideUnavailable", "attention", "hook_count", "hooked", "logit_lens"]
