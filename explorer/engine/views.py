"""Views on demand of one step of a Session: its profile, its logit lens, its attention, its
routing. Each replays the step on a copy of the cache (explorer.engine.replay); the session is
unchanged.

One idea: looking inside a step already taken. explorer.engine.session.Session mixes these in;
they read its lock (_exclusive), model, sampling, generator and trace.
"""

from __future__ import annotations

import torch

from explorer.engine.sampling import choose_token, process
from explorer.model.passes import accepts_logits_to_keep


class StepViews:
    """Profile, logit lens, attention and routing of a step (a mixin of explorer.engine.Session)."""

    def profile_step(self, step: int | None = None, *, repeats: int = 3) -> dict:
        """Run step `step` (default: the latest; the pending prefill before any) again under
        torch.profiler and group its time by part of the model (explorer.costs.profile)."""
        from explorer.costs import forward_cost
        from explorer.costs.profile import profile_replay

        with self._exclusive("profile_step()"):
            r = self._replay(step)
            rec = self.trace.steps[r.index] if r.index < len(self.trace.steps) else None
            cost = forward_cost(
                self.lm.info,
                batch=r.ids.shape[0],
                tokens_fed=r.feed.shape[1],
                context_len=r.ids.shape[1],
                use_cache=r.cache is not None,
                logits_positions=1,
            )
            return profile_replay(
                self.lm.model,
                r,
                sample=self._replay_sampler(r),
                cost=cost,
                peaks=self._peaks(),
                latency_s=None if rec is None else rec.latency_s,
                forward_kwargs=self._last_only_kwargs(),
                repeats=repeats,
            )

    def _replay_sampler(self, r):
        """The sampling chain of this session on a copy of its generator (its draws are unchanged)."""
        generator = torch.Generator(device="cpu")
        generator.set_state(self._gen.get_state())

        def sample(logits):  # [B, V]
            stages = process(logits, r.ids, self.sampling, r.mask)
            return choose_token(stages[-1][1], self.sampling.is_greedy, generator, greedy_cdf=False)

        return sample

    def _last_only_kwargs(self) -> dict:
        return {"logits_to_keep": 1} if accepts_logits_to_keep(self.lm.model) else {}

    def logit_lens(self, step: int | None = None, top_n: int = 5) -> list[dict]:
        """Per decoder layer: top tokens, prob of the chosen token, entropy, KL to the final
        distribution, for the newest position of row 0 at step `step` (explorer.inside.lens)."""
        from explorer.inside import logit_lens

        with self._exclusive("logit_lens()"):
            r = self._replay(step)
            kw = self._last_only_kwargs()
            run = lambda: r.run(self.lm.model, **kw)  # noqa: E731
            return logit_lens(self.lm.model, run, chosen=r.chosen, top_n=top_n, text=self._text)

    def attention(self, step: int | None = None) -> dict:
        """The newest token's attention over the context at step `step`, per layer and head
        (explorer.inside.attention): {"layers", "heads", "positions", "weights" [L][H][P], ...}."""
        from explorer.inside import attention

        with self._exclusive("attention()"):
            return attention(self.lm.model, self._replay(step), text=self._text)

    def routing(self, step: int | None = None) -> dict:
        """Which experts each MoE layer touched, per step, and the load per expert over the trace
        (explorer.engine.routing, recorded as each step ran); with `step`, also each token's
        chosen experts and weights at that step, fetched on demand by replaying it with the
        routers hooked (as attention; the session is unchanged). A dense model says so
        ({"dense": True, "message": ...})."""
        from explorer.engine.routing import capture, routing_of, with_choices

        with self._exclusive("routing()", wait=True):  # a step that runs ends first: one trace
            out = routing_of(self.trace, step)
            if step is None or out["dense"]:
                return out
            with capture(self.lm.model) as routers:
                self._replay(step).run(self.lm.model, **self._last_only_kwargs())
            return with_choices(out, routers.record() if routers is not None else None)

    def _replay(self, step: int | None):
        from explorer.engine.replay import replay_of

        return replay_of(self, step)
