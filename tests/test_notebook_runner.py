"""The notebook runner: a missed wake-up costs one poll slice, not the cell's timeout; a real hang fails loudly."""

from __future__ import annotations

import asyncio
import time
from queue import Empty

import nbformat
import pytest
from notebook_runner import (
    POLL_SLICE_S,
    NotebookCellTimeout,
    NotebookRunner,
    next_message,
    reply_lag,
)


class MissedWakeChannel:
    """Behaves like a zmq.asyncio poll whose edge-triggered wake-up was lost: a message that arrives
    while get_msg waits is not seen until that wait's timeout ends (then the final level check finds it)."""

    def __init__(self, arrives_after_s: float):
        self.arrives = time.monotonic() + arrives_after_s
        self.msg = {"msg_type": "execute_reply", "parent_header": {"msg_id": "m"}, "header": {}}
        self.waits: list[float] = []  # the timeout of every get_msg call

    async def get_msg(self, timeout=None):
        self.waits.append(timeout)
        if time.monotonic() < self.arrives:
            await asyncio.sleep(timeout)  # nothing wakes us when the message comes
        if time.monotonic() >= self.arrives and self.msg is not None:
            msg, self.msg = self.msg, None
            return msg
        raise Empty


def _elapsed(coro) -> tuple[object, float]:
    t0 = time.monotonic()
    out = asyncio.run(coro)
    return out, time.monotonic() - t0


def test_one_long_poll_waits_out_its_timeout():
    """The failure mode itself: a single get_msg(timeout) returns the message only at the timeout."""
    msg, seconds = _elapsed(MissedWakeChannel(0.1).get_msg(timeout=2.0))
    assert msg["msg_type"] == "execute_reply" and seconds >= 2.0


def test_sliced_polling_sees_a_missed_message_within_one_slice():
    channel = MissedWakeChannel(0.1)
    msg = asyncio.run(next_message(channel, time.monotonic() + 30))
    assert msg["msg_type"] == "execute_reply"
    # no single wait is longer than a slice, so a missed wake-up costs at most one slice
    assert channel.waits and all(0 < w <= POLL_SLICE_S for w in channel.waits)


def test_sliced_polling_still_times_out_at_the_deadline():
    channel = MissedWakeChannel(60)
    t0 = time.monotonic()
    with pytest.raises(Empty):
        asyncio.run(next_message(channel, t0 + 1.0))
    assert time.monotonic() - t0 >= 1.0  # not before the deadline
    # each wait is cut to the time left, so together they never run past the deadline
    assert all(0 < w <= POLL_SLICE_S for w in channel.waits) and sum(channel.waits) <= 1.0 + 1e-3
    assert channel.waits[-1] < POLL_SLICE_S  # the last one was cut


def test_reply_lag_reads_the_header_date():
    from datetime import datetime, timedelta, timezone

    sent = datetime.now(timezone.utc) - timedelta(seconds=5)
    assert 4.9 < reply_lag({"header": {"date": sent}}) < 6
    assert 4.9 < reply_lag({"header": {"date": sent.isoformat()}}) < 6
    assert reply_lag({"header": {}}) is None


@pytest.mark.notebook
def test_a_hanging_cell_fails_loudly_within_its_timeout():
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_code_cell("# wait forever\nimport time\ntime.sleep(120)"),
    ]
    runner = NotebookRunner(nb, name="hang.ipynb", timeout=4, kernel_name="python3")
    with pytest.raises(NotebookCellTimeout) as info:
        runner.execute()
    text = str(info.value)
    assert (
        "hang.ipynb" in text and "cell 1" in text and "'# wait forever'" in text and "4 s" in text
    )
