"""The kernel pool's culler: ExplorerKernelManager reclaims kernels whose tab has closed, and no others.

    kernel_manager_class()   the class (built on first use: importing jupyter_server takes seconds)

Voila 0.5 leaks a kernel whenever a tab closes (the page's shutdown beacon is refused), so the
server runs with ExplorerKernelManager: idle kernels with no open tab are culled after
`cull_idle_timeout` seconds, while pooled kernels, kernels with an open tab, and kernels that were
handed to a page whose browser has not connected yet (for up to 2 minutes) are kept. It also times
the pool's starts (kernel start + the notebook's render, `start_seconds`): a page that waits for a
kernel says how long a start takes here (server.py serves them as explorer/starts.json). And a
refill a visitor claims starts at once (`start_when_claimed`): Voila refills the pool after
`fill_delay` seconds, and a visitor who took the refill before then waited the delay out on a blank
page before the kernel even began to start.

The Voila server process loads this file by its path (see server.py): it imports nothing from explorer.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from datetime import datetime, timedelta, timezone


def utcnow() -> datetime:
    """Aware UTC now, as jupyter_server stamps kernel.last_activity."""
    return datetime.now(timezone.utc)


_MANAGER_CLASS = None


def kernel_manager_class():
    """ExplorerKernelManager (built on first use: importing jupyter_server takes seconds, kernels never need it)."""
    global _MANAGER_CLASS
    if _MANAGER_CLASS is not None:
        return _MANAGER_CLASS
    from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
    from traitlets import Integer

    class ExplorerKernelManager(AsyncMappingKernelManager):
        """AsyncMappingKernelManager that reclaims kernels whose tab has closed, and no others.

        Voila wraps this class with its preheating pool (which already protects pooled kernels). Added
        here: the idle clock of a kernel restarts when its last tab disconnects, and a kernel handed to a
        page whose browser has not connected yet gets max(cull_idle_timeout, connect_grace) seconds to
        connect, counted from that moment or from its last activity (the notebook's render) if later.
        The stock culler reclaims a kernel that idled in the pool for longer than the timeout in the
        seconds between the page request and the widget connection, and one whose render took long on
        a loaded machine: the page then never becomes interactive.
        """

        connect_grace = Integer(
            120,
            config=True,
            help="Seconds a kernel handed to a page may wait for the browser's first connection.",
        )

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self._ever_connected: set[str] = set()
            self._unclaimed_since: dict = {}
            self.start_seconds: deque = deque(maxlen=5)  # the pool's last starts, in seconds
            _time_the_pool(self)

        def notify_connect(self, kernel_id: str) -> None:
            self._ever_connected.add(kernel_id)
            super().notify_connect(kernel_id)

        def notify_disconnect(self, kernel_id: str) -> None:
            super().notify_disconnect(kernel_id)
            kernel = self._kernels.get(kernel_id)
            if kernel is not None and self._kernel_connections.get(kernel_id, 0) == 0:
                kernel.last_activity = utcnow()  # idle from the moment the last tab went away

        async def cull_kernel_if_idle(self, kernel_id: str):
            if kernel_id not in self._kernels:
                return None
            if kernel_id not in self._ever_connected and _in_connect_grace(self, kernel_id):
                return None
            return await super().cull_kernel_if_idle(kernel_id)

        async def shutdown_kernel(self, kernel_id: str, *args, **kwargs):
            self._ever_connected.discard(kernel_id)
            self._unclaimed_since.pop(kernel_id, None)
            return await super().shutdown_kernel(kernel_id, *args, **kwargs)

    _MANAGER_CLASS = ExplorerKernelManager
    return _MANAGER_CLASS


def _time_the_pool(manager) -> None:
    """Voila's pool (the subclass that wraps ExplorerKernelManager) starts and renders a kernel with
    _initialize; its constructor fills the pool after ours returns, so each start meets the timer."""
    initialize = getattr(manager, "_initialize", None)
    if initialize is not None:
        manager._initialize = timed_start(initialize, manager.start_seconds)
        start_when_claimed(manager)


def _in_connect_grace(manager, kernel_id: str) -> bool:
    """Whether a kernel no browser has connected to yet is still within its grace. The grace runs
    from the later of: first seen outside the pool, last kernel activity (a kernel started cold for
    a page renders the notebook first; on a loaded machine that alone can take longer than the
    grace, and the browser connects only after it)."""
    first = manager._unclaimed_since.setdefault(kernel_id, utcnow())
    since = max(first, _last_activity(manager._kernels[kernel_id]) or first)
    grace = max(manager.cull_idle_timeout, manager.connect_grace)
    return utcnow() - since < timedelta(seconds=grace)


def timed_start(initialize, seconds: deque):
    """Voila's pool `_initialize` (start a kernel, begin rendering the notebook in it), timed: when
    the render finishes inside the pool, its seconds from the start are appended to `seconds`. A
    render a visitor took over midway (it then finishes in the page's handler) is not counted."""

    async def timed(*args, **kwargs):
        t0 = time.monotonic()
        content = await initialize(*args, **kwargs)
        task, renderer = content.get("task"), content.get("renderer")

        def done(t) -> None:
            if not t.cancelled() and t.exception() is None and not renderer.stop_generator:
                seconds.append(round(time.monotonic() - t0, 1))

        if task is not None and renderer is not None:
            task.add_done_callback(done)
        return content

    return timed


def start_when_claimed(manager) -> None:
    """Make Voila's delayed refill start as soon as a visitor takes it out of the pool.

    Voila schedules each refill as a task `wait_before(fill_delay, start)` kept in
    manager._pools[notebook]; a visitor pops the task and awaits it, delay included. The waiting is
    replaced (the module global Voila's fill_if_needed calls) by one that ends early once its task
    has left every pool: the kernel it was going to preheat now has someone waiting for it."""
    import voila.voila_kernel_manager as vkm

    async def wait_before(delay, aw):
        task = asyncio.current_task()
        end = time.monotonic() + (delay or 0)
        while time.monotonic() < end and claimed_later(manager, task) is False:
            await asyncio.sleep(min(0.25, max(0.0, end - time.monotonic())))
        return await aw

    vkm.wait_before = wait_before


def claimed_later(manager, task) -> bool:
    """True once `task` has left every one of the manager's pools (a visitor took it)."""
    pools = getattr(manager, "_pools", None) or {}
    return not any(task in pool for pool in pools.values())


def _last_activity(kernel) -> datetime | None:
    """kernel.last_activity, or None before it is set (reading the unset trait raises TraitError)."""
    from traitlets import TraitError

    try:
        return getattr(kernel, "last_activity", None)
    except TraitError:
        return None
