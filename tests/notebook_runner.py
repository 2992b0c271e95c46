"""Run a notebook with nbclient without the silent full-timeout wait.

The wait (seen as one cell of 02, 03 or 07 taking exactly the per-cell timeout, then passing):
the kernel sends its `execute_reply` on time, but nbclient 0.11 awaits it with one long
`shell_channel.get_msg(timeout=T)`, i.e. one `zmq.asyncio` poll. pyzmq wakes that poll from the
socket's ZMQ_FD, which is edge-triggered: if the edge is consumed without resolving the poll
(here, while a widget cell floods iopub on a loaded CPU), nothing wakes it again. When T runs out,
pyzmq's poll does a last level-triggered `zmq_poll(0)`, finds the reply and returns it as if it
had just come, so the cell "passes" T seconds late. Measured with two busy loops on 2 cores:
03's `interact` cell got its reply 120.0 s after the kernel had sent it (119.6 s by the reply's
own header date), exactly the 120 s timeout of that run.

The cure is the usual one for edge-triggered descriptors: never sleep on the edge alone.
`NotebookRunner` waits for every shell and iopub message in short slices (POLL_SLICE_S); each
slice ends in pyzmq's level-triggered check, so a missed wake-up costs at most one slice, while
the cell's own timeout still counts from the start. A cell that really hangs raises
`NotebookCellTimeout` naming the notebook, the cell and its first source line.
"""

from __future__ import annotations

import asyncio
from queue import Empty
from time import monotonic

from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError
from nbclient.util import ensure_async

POLL_SLICE_S = 0.5


class NotebookCellTimeout(AssertionError):
    """A cell did not finish within its timeout (the message names notebook, cell and first line)."""


async def next_message(channel, deadline: float | None, slice_s: float = POLL_SLICE_S) -> dict:
    """The next message on a jupyter_client async channel, waiting in slices; Empty at the deadline."""
    while True:
        left = None if deadline is None else deadline - monotonic()
        if left is not None and left <= 0:
            raise Empty
        try:
            return await ensure_async(
                channel.get_msg(timeout=slice_s if left is None else min(slice_s, left))
            )
        except Empty:
            continue


def reply_lag(msg: dict) -> float | None:
    """Seconds between the kernel stamping a message (its header date) and now."""
    from datetime import datetime, timezone

    sent = msg.get("header", {}).get("date")
    if isinstance(sent, str):
        sent = datetime.fromisoformat(sent.replace("Z", "+00:00"))
    if not isinstance(sent, datetime):
        return None
    if sent.tzinfo is None:
        sent = sent.replace(tzinfo=timezone.utc)
    return (datetime.now(timezone.utc) - sent).total_seconds()


class NotebookRunner(NotebookClient):
    """nbclient's NotebookClient, polling the kernel's replies in slices (see the module docstring)."""

    def __init__(self, nb, name: str = "notebook", **kw):
        kw.setdefault("iopub_timeout", 15)
        kw.setdefault("raise_on_iopub_timeout", True)  # lost outputs fail loudly too
        # the kernel is thrown away after the last cell: a graceful shutdown waited ~3 s per notebook
        kw.setdefault("shutdown_kernel", "immediate")
        super().__init__(nb, **kw)
        self.notebook_name = name
        self.current_cell: int | None = None
        self.reply_lags: dict = {}  # cell id -> seconds from the kernel sending its reply to us seeing it

    async def async_execute_cell(self, cell, cell_index, execution_count=None, store_history=True):
        self.current_cell = cell_index
        try:
            return await super().async_execute_cell(
                cell, cell_index, execution_count, store_history
            )
        except CellTimeoutError as err:
            lines = [line for line in cell.source.splitlines() if line.strip()]
            first = lines[0] if lines else ""
            raise NotebookCellTimeout(
                f"{self.notebook_name}: cell {cell_index} (first line: {first!r}) did not finish within "
                f"{self._get_timeout(cell)} s: {str(err).splitlines()[0]}"
            ) from None

    async def _async_poll_for_reply(
        self, msg_id, cell, timeout, task_poll_output_msg, task_poll_kernel_alive
    ):
        from nbclient.client import timestamp

        deadline = None if timeout is None else monotonic() + timeout
        while True:
            try:
                msg = await next_message(self.kc.shell_channel, deadline)
            except Empty:
                task_poll_kernel_alive.cancel()
                await self._async_check_alive()
                await self._async_handle_timeout(
                    timeout, cell
                )  # logs; raises unless interrupt_on_timeout
                raise CellTimeoutError.error_from_timeout_and_cell(
                    "Cell execution timed out", timeout, cell
                ) from None
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if self.record_timing:
                cell["metadata"]["execution"]["shell.execute_reply"] = timestamp(msg)
            self.reply_lags[cell.get("id", id(cell))] = reply_lag(msg)
            try:
                await asyncio.wait_for(task_poll_output_msg, self.iopub_timeout)
            except (asyncio.TimeoutError, Empty):
                task_poll_kernel_alive.cancel()
                raise CellTimeoutError.error_from_timeout_and_cell(
                    "Timeout waiting for IOPub output", self.iopub_timeout, cell
                ) from None
            task_poll_kernel_alive.cancel()
            return msg

    async def _async_poll_output_msg(self, parent_msg_id, cell, cell_index) -> None:
        from nbclient.exceptions import CellExecutionComplete

        while True:
            msg = await next_message(self.kc.iopub_channel, None)
            if msg["parent_header"].get("msg_id") == parent_msg_id:
                try:
                    self.process_message(
                        msg, cell, cell_index
                    )  # raises CellExecutionComplete at idle
                except CellExecutionComplete:
                    return
