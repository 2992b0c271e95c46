"""Forward hooks that exist only inside a `with` block (TransformerLens' hooks() habit).

    with hooked({module: (pre_fn, post_fn), ...}):
        model(...)
    # every hook registered above has been removed here, even after an exception

pre_fn(module, args) and post_fn(module, args, output) follow torch's hook signatures; either may
be None. `hook_count(model)` counts what is still registered (tests check it is back to zero).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import contextmanager

from torch import nn


class InsideUnavailable(ValueError):
    """This model (or this trace without a model) cannot give the requested inside view; the
    message names what is missing."""


Pre = Callable[[nn.Module, tuple], object] | None
Post = Callable[[nn.Module, tuple, object], object] | None


@contextmanager
def hooked(hooks: Mapping[nn.Module, tuple[Pre, Post]]):
    """Register the given forward (pre-)hooks for the duration of the block; remove them in finally."""
    handles = []
    try:
        for module, (pre, post) in hooks.items():
            if pre is not None:
                handles.append(module.register_forward_pre_hook(pre))
            if post is not None:
                handles.append(module.register_forward_hook(post))
        yield
    finally:
        for handle in handles:
            handle.remove()


def hook_count(model: nn.Module) -> int:
    """Forward hooks and pre-hooks still registered anywhere in the model."""
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
