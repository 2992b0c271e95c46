"""A banner that tells the page when the kernel behind it has gone quiet (killed, culled, restarted).

Without it a page whose kernel died (out of memory, reclaimed by the server after the laptop slept,
a crash) looks alive: buttons press, nothing happens, nothing says why. The page pings every
`period_s` seconds; while pings come (within LISTEN_S), the kernel sends a small message every
`period_s` from a daemon thread. Once the page has heard one, it shows the banner when none has come
for `timeout_s`, and hides it again if they resume (a sleeping laptop that reconnects). Beats only
while a page pings: a kernel whose tab closed goes quiet, so the server's idle culling reclaims it. A page that never heard one shows nothing: anywidget drops the messages of a
model that was slow to start (see figure_loader.js), and a false alarm would be worse than none.
"""

from __future__ import annotations

import threading
import time

import anywidget
import traitlets as T

TEXT = (
    "This page has lost its session: no word from its kernel for {timeout} s. If the kernel stopped "
    "(out of memory, or reclaimed by the server after the tab was closed or idle), the controls and "
    "charts here no longer work: reload the page to start a new session."
)

_ESM = """
export default {
  render({ model, el }) {
    el.classList.add("ie-lost");
    el.style.display = "none";
    el.textContent = model.get("text");
    let last = null;  // no beat heard yet: say nothing
    const beat = () => { last = Date.now(); el.style.display = "none"; };
    model.on("msg:custom", beat);
    const ping = () => model.send({ ping: 1 });
    ping();
    const pinger = setInterval(ping, model.get("period_s") * 1000);
    const check = () => {
      const quiet = last !== null && Date.now() - last > model.get("timeout_s") * 1000;
      el.style.display = quiet ? "block" : "none";
    };
    const timer = setInterval(check, 1000);
    return () => { clearInterval(timer); clearInterval(pinger); model.off("msg:custom", beat); };
  },
};
"""

_CSS = """.ie-lost { position: sticky; top: 0; z-index: 1000; margin: 4px 0; padding: 10px 14px;
  background: #b00020; color: #fff; font-size: 15px; border-radius: 4px; }"""


class Liveness(anywidget.AnyWidget):
    """The heartbeat widget: put it on the page; it is invisible while the kernel answers."""

    LISTEN_S = (
        20.0  # beats continue this long after the last ping (a busy shell thread delays pings)
    )

    _esm = T.Unicode(_ESM).tag(sync=True)
    _css = T.Unicode(_CSS).tag(sync=True)
    period_s = T.Float(5.0).tag(sync=True)
    timeout_s = T.Float(20.0).tag(sync=True)
    text = T.Unicode("").tag(sync=True)

    def __init__(self, period_s: float = 5.0, timeout_s: float = 20.0, *, beat: bool | None = None):
        if not 0 < period_s < timeout_s:
            raise ValueError(f"need 0 < period_s < timeout_s, got {period_s} and {timeout_s}")
        super().__init__(
            period_s=period_s, timeout_s=timeout_s, text=TEXT.format(timeout=f"{timeout_s:g}")
        )
        self.beats = 0
        self._last_ping: float | None = None
        self.on_msg(self._on_ping)
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        if beat if beat is not None else _in_kernel():
            self._thread = threading.Thread(
                target=self._beat, name="explorer-heartbeat", daemon=True
            )
            self._thread.start()

    def _on_ping(self, _widget, content, _buffers) -> None:
        if isinstance(content, dict) and "ping" in content:
            self._last_ping = time.monotonic()

    def _beat(self) -> None:
        while not self._halt.wait(self.period_s):
            if self.comm is None:  # closed
                return
            if self._last_ping is None or time.monotonic() - self._last_ping > self.LISTEN_S:
                continue  # no page listening: stay quiet (a beat is activity, and would stop culling)
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
