"""Real-browser helpers for the browser tests and scripts/bench_*.py: an `explorer app` server and chromium
(playwright, a test dependency, is imported only by the functions that drive the browser).

AppServer(port=..., pool_size=1).start()   `explorer app --no-browser` in a subprocess, temp HOME/JUPYTER dirs
launch_chromium(playwright)                Debian chromium (or $EXPLORER_CHROMIUM) via playwright
answer_offline(context, server_url)        answer every request that is not for the server locally
open_dashboard(context, url)               -> (page, seconds from navigation to an enabled Step button)
click_and_time(page, "step")               -> ms from the click to the first change of strip and distribution
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from explorer.app.voila.capacity import (
    kernel_processes,
    tree_memory,
    wait_for_pool,
)
from explorer.app.voila.serve import wait_until_listening

REPO = Path(__file__).resolve().parents[3]  # the checkout: the server runs from its root

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--disable-crash-reporter",
    "--disable-breakpad",
]
HOME_VARS = (
    "JUPYTER_CONFIG_DIR",
    "JUPYTER_DATA_DIR",
    "JUPYTER_RUNTIME_DIR",
    "IPYTHONDIR",
    "MPLCONFIGDIR",
)
STEP_READY = "button.ie-step:not([disabled])"
# The bundled models end a document with <|endoftext|> every few dozen tokens, and a stopped session
# disables Step. Benchmarks untick "stop at end-of-text" (a new session starts) and wait for its message:
STOP_EOS = ".ie-stop-eos input"
EOS_OFF_JS = "() => document.querySelector('.ie-message').innerText.includes('end-of-text')"


# --- the browser ---------------------------------------------------------------------------------


def chromium_path() -> str | None:
    """$EXPLORER_CHROMIUM, else Debian's /usr/bin/chromium, else `chromium` on PATH."""
    for candidate in (
        os.environ.get("EXPLORER_CHROMIUM"),
        "/usr/bin/chromium",
        shutil.which("chromium"),
    ):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def browser_unavailable() -> str | None:
    """Why no browser test can run here (None when playwright and chromium are both present)."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[test]')"
    if chromium_path() is None:
        return (
            "no chromium found: run scripts/ensure_browser.sh as root (apt-get install chromium), "
            "or set EXPLORER_CHROMIUM=/path/to/chromium"
        )
    return None


def png_of_html(page_html: str, width: int = 1300, height: int = 900) -> bytes:
    """The first plot of an offline HTML page as PNG bytes, drawn by headless chromium
    (ValueError in one line where playwright or chromium is missing)."""
    why = browser_unavailable()
    if why:
        raise ValueError(f"a PNG needs a browser: {why}; the HTML page's camera button saves one")
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "page.html")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(page_html)
        with sync_playwright() as pw:
            browser = launch_chromium(pw)
            try:
                page = browser.new_page(viewport={"width": width, "height": height})
                page.goto(f"file://{path}")
                page.wait_for_selector(".plotly-graph-div .main-svg", timeout=30000)
                return page.locator(".plotly-graph-div").first.screenshot()
            finally:
                browser.close()


def launch_chromium(pw, headless: bool = True):
    """A fresh chromium (new temp profile per launch) driven by playwright; never downloads a browser."""
    return pw.chromium.launch(
        executable_path=chromium_path(), args=CHROMIUM_ARGS, headless=headless
    )


def answer_offline(context, server_url: str) -> list[str]:
    """Serve the app from the server; answer any other request (the template's CDN CSS) with an empty 200.

    Returns the list that collects the URLs so answered, for the report.
    """
    answered: list[str] = []
    origin = server_url.rstrip("/")

    def handle(route):
        url = route.request.url
        if url.startswith(origin) or url.startswith("data:") or url.startswith("blob:"):
            return route.continue_()
        answered.append(url)
        kind = (
            "text/css"
            if ".css" in url
            else "application/javascript"
            if ".js" in url
            else "text/plain"
        )
        return route.fulfill(status=200, body="", content_type=kind)

    context.route("**/*", handle)
    return answered


def open_dashboard(context, url: str, timeout_s: float = 60.0):
    """Open the app in a new page; return (page, seconds from navigation start to an enabled Step button)."""
    page = context.new_page()
    t0 = time.perf_counter()
    page.goto(url, wait_until="commit", timeout=timeout_s * 1000)
    page.wait_for_selector(STEP_READY, timeout=timeout_s * 1000)
    return page, time.perf_counter() - t0


# --- reading the page ----------------------------------------------------------------------------


def strip_text(page) -> str:
    """The token strip's text exactly as shown (textContent: a trailing-space token counts)."""
    return page.text_content(".ie-strip-text")


def token_count(page) -> int:
    """Generated tokens shown in the strip (`.ie-tok` spans)."""
    return page.locator(".ie-strip-text .ie-tok").count()


def step_count(page) -> str:
    return page.inner_text(".ie-step-count").strip()


def message_text(page) -> str:
    return page.inner_text(".ie-message").strip()


DIST_SIGNATURE_JS = """() => {
    const root = document.querySelector('.ie-dist');
    if (!root) return '';
    const bars = [...root.querySelectorAll('.bars path')].map(p => p.getAttribute('d')).join('|');
    const text = [...root.querySelectorAll('.xtick text, .ytick text, .gtitle')].map(t => t.textContent).join('|');
    return bars + '#' + text;
}"""


def dist_signature(page) -> str:
    """A string that changes when the distribution chart redraws (bar shapes, tick labels, title)."""
    return page.evaluate(DIST_SIGNATURE_JS)


def bar_boxes(page) -> list[dict]:
    """Bounding boxes of the distribution chart's bars (plotly draws them as `.bars path`), widest bar traces first."""
    return page.evaluate("""() => [...document.querySelectorAll('.ie-dist .bars path')]
        .map(p => p.getBoundingClientRect())
        .filter(r => r.width > 1 && r.height > 1)
        .map(r => ({x: r.x, y: r.y, width: r.width, height: r.height}))""")


TIMED_CLICK_JS = """async ([button, timeoutMs]) => {
    const distSig = DIST_SIGNATURE;
    const strip = document.querySelector('.ie-strip-text');
    const dist = document.querySelector('.ie-dist');
    const btn = document.querySelector('button.ie-' + button);
    if (!strip || !dist || !btn) return {error: 'missing .ie-strip-text, .ie-dist or button.ie-' + button};
    if (btn.disabled) return {error: 'button.ie-' + button + ' is disabled'};
    const before = {strip: strip.textContent, dist: distSig()};
    const seen = {};
    const check = () => {
        const now = performance.now();
        if (!('strip' in seen) && strip.textContent !== before.strip) seen.strip = now;
        if (!('dist' in seen) && distSig() !== before.dist) seen.dist = now;
    };
    const obs = new MutationObserver(check);
    for (const el of [strip, dist]) obs.observe(el, {subtree: true, childList: true, characterData: true,
                                                     attributes: true});
    // the step tab's picture, when it is shown: timed to its first redraw after the click
    const pic = document.querySelector('.ie-step-tab .js-plotly-plot');
    const picShown = pic !== null && pic.offsetParent !== null;
    const picObs = new MutationObserver(() => { if (!('pic' in seen)) seen.pic = performance.now(); });
    if (picShown) picObs.observe(pic, {subtree: true, childList: true, attributes: true});
    const t0 = performance.now();
    btn.click();
    while (!('strip' in seen && 'dist' in seen && (!picShown || 'pic' in seen))
           && performance.now() - t0 < timeoutMs) {
        await new Promise(r => setTimeout(r, 5));
        check();
    }
    obs.disconnect();
    picObs.disconnect();
    return {strip_ms: 'strip' in seen ? seen.strip - t0 : null, dist_ms: 'dist' in seen ? seen.dist - t0 : null,
            picture_ms: 'pic' in seen ? seen.pic - t0 : null};
}""".replace("DIST_SIGNATURE", DIST_SIGNATURE_JS)


def timed_result(out: dict) -> dict:
    """Add both_ms (the later of the two changes) to a TIMED_CLICK_JS result; raise on its error."""
    if "error" in out:
        raise AssertionError(out["error"])
    s, d = out["strip_ms"], out["dist_ms"]
    out["both_ms"] = max(s, d) if s is not None and d is not None else None
    return out


def click_and_time(page, button: str = "step", timeout_ms: float = 10000) -> dict:
    """Click button.ie-<button> in the page and time, on the page's clock, until the token strip's text and the
    distribution chart have changed. Returns {"strip_ms", "dist_ms", "both_ms"} (None: no change in time)."""
    return timed_result(page.evaluate(TIMED_CLICK_JS, [button, timeout_ms]))


# Resolves once the strip and the distribution have not changed for `settle` ms (or after `timeout` ms).
WAIT_QUIET_JS = """async ([settle, timeout]) => {
    let last = performance.now();
    const obs = new MutationObserver(() => { last = performance.now(); });
    for (const sel of ['.ie-strip-text', '.ie-dist', '.ie-step-count']) {
        const el = document.querySelector(sel); if (el) obs.observe(el, {subtree: true, childList: true,
            characterData: true, attributes: true});
    }
    const t0 = performance.now();
    while (performance.now() - last < settle && performance.now() - t0 < timeout) {
        await new Promise(r => setTimeout(r, 20));
    }
    obs.disconnect();
}"""


def wait_quiet(page, settle_ms: int = 150, timeout_ms: int = 10000) -> None:
    """Wait until the strip and the distribution have not changed for settle_ms (the step's redraw finished)."""
    page.evaluate(WAIT_QUIET_JS, [settle_ms, timeout_ms])


def set_value(page, name: str, value: str) -> None:
    """Type into control ie-<name>'s text box and commit it (the boxes update on Enter / blur)."""
    box = page.locator(f".ie-{name} input, .ie-{name} textarea").first
    box.fill(value)
    box.press("Enter")


def wait_text_change(page, selector: str, old: str, timeout_s: float = 20.0) -> str:
    """Wait until text_content(selector) differs from `old`; return the new text."""
    page.wait_for_function(
        "([sel, old]) => { const el = document.querySelector(sel);"
        " return el && el.textContent !== old; }",
        arg=[selector, old],
        timeout=timeout_s * 1000,
    )
    return page.text_content(selector)


# --- every tab: its main control, and what a person would see wrong --------------------------------

# (tab title, picture name, buttons to press in order: part names). Sweeps runs its first inner page
# (the KV cache sweep) at small sizes; Serving and Capacity run their defaults.
TAB_TOUR = [
    ("Latency", "latency", []),
    ("Memory traffic", "traffic", []),
    ("Roofline", "roofline", []),
    ("Why this time?", "why", ["why-profile-run"]),
    ("The step, drawn", "step", ["step-measure"]),
    ("Inside", "inside", ["inside-lens-run", "inside-attention-run"]),
    ("Sweeps", "sweeps", ["sweep-cache-run"]),
    ("Where does it pay?", "pays", ["pays-run"]),
    ("Serving", "serving", ["serve-run"]),
    ("Capacity", "capacity", ["cap-run"]),
    ("Speculative", "speculative", ["spec-run"]),
    ("Export", "export", ["export-button"]),
]
PLACEHOLDERS = ("Run a workload to draw this view",)

# Every plotly figure on the page that is shown: its axes' ranges (finite; a log axis within
# 10^-12..10^12), whether each trace's finite points fall inside them, and any placeholder text left
# in a chart that has data.
FIGURE_PROBLEMS_JS = r"""(placeholders) => {
    const out = [];
    for (const gd of document.querySelectorAll('.js-plotly-plot')) {
        if (!gd._fullLayout || gd.offsetParent === null) continue;  // hidden (another tab)
        const name = [...gd.closest('.jupyter-widgets, .widget-box, div').classList].join('.')
            + ' ' + ((gd._fullLayout.title || {}).text || '');
        const axes = Object.keys(gd._fullLayout).filter(k => /^[xy]axis\d*$/.test(k));
        const hasData = (gd._fullData || []).some(t => (t.x && t.x.length) || (t.y && t.y.length));
        for (const k of axes) {
            const ax = gd._fullLayout[k];
            if (!ax.visible || !ax.range) continue;
            const [a, b] = ax.range.map(Number);
            if (!isFinite(a) || !isFinite(b)) out.push(`${name}: ${k} range ${ax.range}`);
            else if (ax.type === 'log' && (Math.abs(a) > 12 || Math.abs(b) > 12))
                out.push(`${name}: ${k} log range 10^${a.toFixed(1)}..10^${b.toFixed(1)}`);
        }
        for (const t of gd._fullData || []) {
            if (t.visible !== true || !['scatter', 'bar'].includes(t.type)) continue;
            for (const dim of ['x', 'y']) {
                const ax = gd._fullLayout[(t[dim + 'axis'] || dim).replace(/^([xy])/, '$1axis')];
                const vals = t[dim];
                if (!ax || !ax.range || !vals || !vals.length || ax.type === 'category') continue;
                if (ax.autorange === false || ax.fixedrange) continue;  // a window chosen on purpose
                const nums = [...vals].filter(v => v !== null && v !== undefined && v !== '')
                    .map(Number).filter(v => isFinite(v) && (ax.type !== 'log' || v > 0));
                if (!nums.length) continue;
                const toAx = v => ax.type === 'log' ? Math.log10(v) : v;
                const [lo, hi] = ax.range.map(Number).sort((p, q) => p - q);
                const pad = (hi - lo) * 0.02 + 1e-9;
                const mn = toAx(Math.min(...nums)), mx = toAx(Math.max(...nums));
                if (mn < lo - pad || mx > hi + pad)
                    out.push(`${name}: trace ${t.name} ${dim} ${mn}..${mx} outside ${lo}..${hi}`);
            }
        }
        if (hasData) for (const a of gd._fullLayout.annotations || [])
            if (placeholders.some(p => String(a.text).includes(p)))
                out.push(`${name}: placeholder "${a.text}" left in a drawn chart`);
    }
    return out;
}"""


def figure_problems(page) -> list[str]:
    """What is wrong with the shown figures (see FIGURE_PROBLEMS_JS); [] when nothing is."""
    return page.evaluate(FIGURE_PROBLEMS_JS, list(PLACEHOLDERS))


def open_tab(page, title: str) -> None:
    page.locator(".lm-TabBar-tab", has_text=title).first.click()
    wait_quiet(page, settle_ms=300)


# Before a press: watch what the shown tab draws (its charts and HTML outputs) and the message bar;
# window.__ieTabChanged turns true at the first change, window.__ieTabLast is the time of the last.
WATCH_TAB_JS = """() => {
    window.__ieTabChanged = false;
    window.__ieTabLast = performance.now();
    const shown = [...document.querySelectorAll(
        '.ie-tabs .js-plotly-plot, .ie-tabs .widget-html, .ie-message')]
        .filter(e => e.offsetParent !== null);
    if (window.__ieTabObs) window.__ieTabObs.disconnect();
    window.__ieTabObs = new MutationObserver(() => {
        window.__ieTabChanged = true;
        window.__ieTabLast = performance.now();
    });
    for (const el of shown) window.__ieTabObs.observe(el, {subtree: true, childList: true,
        characterData: true, attributes: true});
}"""


def press_and_wait(page, part: str, timeout_s: float = 240.0) -> None:
    """Press button.ie-<part>, then wait until the run it started has shown something (a chart or
    an output of the shown tab, or the message bar, changed: a run that keeps its buttons enabled
    may not have begun when they are next read), has finished (Step and the button enabled: the
    dashboard turns them off while a run holds the busy flag), and the tab has been quiet 500 ms."""
    page.evaluate(WATCH_TAB_JS)
    page.click(f"button.ie-{part}:not([disabled])", timeout=60000)
    page.wait_for_function("() => window.__ieTabChanged", timeout=timeout_s * 1000)
    page.wait_for_selector(STEP_READY, timeout=timeout_s * 1000)
    page.wait_for_selector(f"button.ie-{part}:not([disabled])", timeout=timeout_s * 1000)
    page.wait_for_function(
        "() => performance.now() - window.__ieTabLast > 500", timeout=timeout_s * 1000
    )
    page.evaluate("() => window.__ieTabObs.disconnect()")
    wait_quiet(page, settle_ms=500)


def shown_about(page) -> str:
    """The explanation line of the selected tab ('' when it has none)."""
    return page.evaluate(
        """() => { const el = [...document.querySelectorAll('.ie-tab-about')]
                       .find(e => e.offsetParent !== null);
                   return el ? el.innerText.trim() : ''; }"""
    )


def collect_console_errors(page) -> list[str]:
    """A list that fills with the page's console errors and uncaught exceptions from now on."""
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return errors


# --- the server ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def temp_home_env(root: Path) -> dict:
    """os.environ with HOME and the Jupyter/IPython dirs under `root` (nothing touches the real home)."""
    env = dict(os.environ)
    env["HOME"] = str(root)
    for var in HOME_VARS:
        env[var] = str(root / var.lower())
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )
    env.pop("EXPLORER_SHARED", None)
    env.pop("EXPLORER_MODELS_CONFIG", None)
    return env


class AppServer:
    """`explorer app --no-browser` on a free 127.0.0.1 port, in a subprocess, its log in a temp folder."""

    def __init__(
        self,
        *,
        port: int | None = None,
        pool_size: int = 1,
        cull_idle_timeout: int = 120,
        shared: bool = False,
        models_config: str | None = None,
        notebook: str | None = None,
        home: Path | None = None,
    ):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.pool_size = pool_size
        self.home = Path(home or tempfile.mkdtemp(prefix="explorer-app-home-"))
        self.log_path = self.home / "server.log"
        self.args = [
            sys.executable,
            "-m",
            "explorer.cli",
            "app",
            "--no-browser",
            "--port",
            str(self.port),
            "--pool-size",
            str(pool_size),
            "--cull-idle-timeout",
            str(cull_idle_timeout),
        ]
        if shared:
            self.args.append("--shared")
        if models_config:
            self.args += ["--models-config", str(models_config)]
        if notebook:
            self.args += ["--notebook", str(notebook)]
        self.proc: subprocess.Popen | None = None

    def launch(self) -> AppServer:
        """Start `explorer app` and return at once (wait_ready() waits for it)."""
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            self.args,
            env=temp_home_env(self.home),
            cwd=str(REPO),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def wait_ready(self, timeout_s: float = 180.0, wait_pool: bool = True) -> AppServer:
        """Wait until the server listens and (wait_pool) its preheated kernels are quiet; stop it on failure."""
        try:
            wait_until_listening("127.0.0.1", self.port, self.proc, timeout=timeout_s)
            if wait_pool and self.pool_size > 0:
                self.wait_pool(timeout_s)
        except Exception as err:
            self.stop()
            raise RuntimeError(
                f"explorer app did not start ({err}); its log:\n{self.log()[-3000:]}"
            ) from None
        return self

    def start(self, timeout_s: float = 180.0, wait_pool: bool = True) -> AppServer:
        """launch() then wait_ready()."""
        return self.launch().wait_ready(timeout_s, wait_pool)

    def wait_pool(self, timeout_s: float = 120.0) -> float:
        """Wait until at least pool_size kernels exist and are quiet (each has rendered the notebook)."""
        return wait_for_pool(self.proc.pid, self.pool_size, timeout=timeout_s)

    def kernels(self) -> list:
        return kernel_processes(self.proc.pid) if self.proc else []

    def memory(self) -> dict:
        return tree_memory(self.proc.pid) if self.proc else {}

    def wait_kernels(self, n: int, timeout_s: float) -> int:
        """Wait until exactly n kernels are alive; return the count at the end (n unless it timed out)."""
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout_s:
            if len(self.kernels()) == n:
                return n
            time.sleep(0.5)
        return len(self.kernels())

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> int | None:
        """SIGTERM `explorer app` (it stops Voila, which stops its kernels); SIGKILL what is left."""
        import psutil

        if self.proc is None:
            return None
        try:
            family = psutil.Process(self.proc.pid).children(recursive=True)  # Voila and its kernels
        except psutil.NoSuchProcess:
            family = []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        rc = self.proc.wait()
        gone, alive = psutil.wait_procs(family, timeout=10)
        self.leftovers = len(alive)  # 0 expected: explorer app stops Voila, Voila stops its kernels
        for p in alive:
            p.kill()
        self._log.close()
        return rc

    def __enter__(self) -> AppServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
