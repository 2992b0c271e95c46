"""This machine's measured peaks (bandwidth, FLOP/s), measured once per process on a background
thread, off the first click's path; and the known chips' published (modelled) ones."""

from __future__ import annotations

import threading


class PeakMeter:
    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.thread: threading.Thread | None = None

    def warm(self, device, dtype) -> None:
        """Start measuring the peaks of `device` at `dtype` in the background (cached per process)."""
        if not self.enabled:
            return
        from explorer.costs import hardware

        self.thread = threading.Thread(
            target=_quietly,
            args=(hardware.measure, device, dtype),
            name="explorer-peaks",
            daemon=True,
        )
        self.thread.start()

    def wait(self) -> None:
        """Wait for the measurement in progress (a step's roofline needs it)."""
        thread = self.thread
        if thread is not None and thread.is_alive():
            thread.join()

    def measure(self, device, dtype):
        """The measured peaks (None when measuring is off)."""
        if not self.enabled:
            return None
        from explorer.costs import hardware

        self.wait()
        return hardware.measure(device, dtype=dtype)


def known_chips(dtype: str) -> dict:
    """The known chips' published peaks at `dtype` (a chip with no figure for it is left out)."""
    from explorer.costs import hardware

    chips = {}
    for name in hardware.KNOWN_CHIPS:
        try:
            chips[name] = hardware.chip_peaks(name, dtype)
        except ValueError:  # the chip has no published figure for this dtype
            continue
    return chips


def _quietly(fn, *args) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - the step that needs the peaks measures again and reports
        pass
