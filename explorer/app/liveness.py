"""A banner that tells the page when the kernel behind it has gone quiet (killed, culled, restarted).

Without it a page whose kernel died (out of memory, reclaimed by the server after the laptop slept,
a crash) looks alive: buttons press, nothing happens, nothing says why. The kernel sends a small
message every `period_s` seconds from a daemon thread; once the page has heard one, it shows the
banner when none has come for `timeout_s`, and hides it again if they resume (a sleeping laptop
that reconnects). A page that never heard one shows nothing: anywidget drops the messages of a
model that was slow to start (see figure_loader.js), and a false alarm would be worse than none.
"""

from __future__ import annotations

import threading

import anywidget
import traitlets as T

TEXT = ("This page has lost its session: no word from its kernel for {timeout} s. If the kernel stopped "
        "(out of memory, or reclaimed by the server after the tab was closed or idle), the controls and "
        "charts here no longer work: reload the page to start a new session.")

_ESM = """
export default {
  render({ model, el }) {
    el.classList.add("ie-lost");
    el.style.display = "none";
    let last = null;  // no beat heard yet: say nothing
    const beat = () => { last = Date.now(); el.style.display = "none"; };
    model.on("msg:custom", beat);
    const check = () => {
      const quiet = last !== null && Date.now() - last > model.get("timeout_s") * 1000;
      el.textContent = model.get("text");
      el.style.display = quiet ? "block" : "none";
    };
    const timer = setInterval(check, 1000);
    return () => { clearInterval(timer); model.off("msg:custom", beat); };
  },
};
"""

_CSS = """.ie-lost { position: sticky; top: 0; z-index: 1000; margin: 4px 0; padding: 10px 14px;
  background: #b00020; color: #fff; font-size: 15px; border-radius: 4px; }"""


class Liveness(anywidget.AnyWidget):
    """The heartbeat widget: put it on the page; it is invisible while the kernel answers."""

    _esm = T.Unicode(_ESM).tag(sync=True)
    _css = T.Unicode(_CSS).tag(sync=True)
    period_s = T.Float(5.0).tag(sync=True)
    timeout_s = T.Float(20.0).tag(sync=True)
    text = T.Unicode("").tag(sync=True)

    def __init__(self, period_s: float = 5.0, timeout_s: float = 20.0, *, beat: bool | None = None):
        if not 0 < period_s < timeout_s:
            raise ValueError(f"need 0 < period_s < timeout_s, got {period_s} and {timeout_s}")
        super().__init__(period_s=period_s, timeout_s=timeout_s, text=TEXT.format(timeout=f"{timeout_s:g}"))
        self.beats = 0
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        if beat if beat is not None else _in_kernel():
            self._thread = threading.Thread(target=self._beat, name="explorer-heartbeat", daemon=True)
            self._thread.start()

    def _beat(self) -> None:
        while not self._halt.wait(self.period_s):
            if self.comm is None:  # closed
                return
            try:
                self.send({"beat": self.beats})
            except Exception:  # the kernel is shutting down
                return
            self.beats += 1

    def close(self) -> None:
        halt = getattr(self, "_halt", None)  # absent when __init__ refused its arguments
        if halt is not None:
            halt.set()
        super().close()


def _in_kernel() -> bool:
    """True inside a Jupyter kernel (a plain Python process has nobody to send beats to)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None
