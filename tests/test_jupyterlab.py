"""JupyterLab, in a real browser: the dashboard in a notebook cell, and Run All of a classroom notebook.

A `jupyter lab` on a free 127.0.0.1 port (token, temporary HOME and Jupyter dirs, the app exposed
as window.jupyterapp), driven through JupyterLab's own commands from Debian chromium + playwright.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest

from explorer.app.voila import browser as bs  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]
NB_DIR = Path(__file__).resolve().parent.parent / "notebooks"

# Started, not awaited: the command's promise settles when the last cell has run, and never if the
# kernel's websocket drops meanwhile (seen under heavy load: "WebSocket ping timeout", then the
# suite hung in page.evaluate, which has no timeout). The waits after it have their own deadlines.
RUN_ALL_JS = """async () => {
  const w = window.jupyterapp.shell.currentWidget;
  await w.context.ready;
  await w.sessionContext.ready;
  window.jupyterapp.commands.execute('notebook:run-all-cells');
  return true;
}"""
LAB_LOADED_JS = (
    "() => !!(window.jupyterapp && window.jupyterapp.shell && window.jupyterapp.commands)"
)
# JupyterLab's own command, as File > Open does it: the notebook opens in a new tab and is made current.
OPEN_JS = """async (name) => {
  await window.jupyterapp.commands.execute('docmanager:open', { path: name });
  return true;
}"""
NOTEBOOK_OPEN_JS = """(name) => {
  const app = window.jupyterapp;
  const w = app && app.shell && app.shell.currentWidget;
  return !!(w && w.context && w.context.path === name && w.sessionContext);
}"""
ALL_RAN_JS = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  const cells = w.content.widgets.filter(c => c.model.type === 'code');
  const kernel = w.sessionContext.session && w.sessionContext.session.kernel;
  return cells.every(c => c.model.executionCount !== null) && kernel && kernel.status === 'idle';
}"""
ERRORS_JS = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  const out = [];
  w.content.widgets.forEach((c, i) => {
    if (c.model.type !== 'code') return;
    for (const o of c.model.outputs.toJSON()) {
      if (o.output_type === 'error') out.push(i + ': ' + o.ename + ': ' + o.evalue);
    }
  });
  return out;
}"""
STDOUT_JS = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  let text = '';
  w.content.widgets.forEach(c => {
    if (c.model.type !== 'code') return;
    for (const o of c.model.outputs.toJSON()) {
      if (o.output_type === 'stream') text += (Array.isArray(o.text) ? o.text.join('') : o.text);
    }
  });
  return text;
}"""


class LabServer:
    """`jupyter lab` serving `root` on a free port with a token, in a subprocess with a temporary home."""

    def __init__(self, root: Path):
        self.root, self.port, self.token = root, bs.free_port(), "explorer-test-token"
        self.home = Path(tempfile.mkdtemp(prefix="explorer-lab-home-"))
        self.log_path = self.home / "lab.log"
        self.url = f"http://127.0.0.1:{self.port}/"
        args = [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            f"--port={self.port}",
            "--ServerApp.ip=127.0.0.1",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={root}",
            "--LabApp.expose_app_in_browser=True",
            "--ServerApp.open_browser=False",
        ]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            args.append("--allow-root")  # Jupyter refuses to start as root (a container) without it
        env = bs.temp_home_env(self.home)
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PLOTLY_RENDERER="plotly_mimetype")
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            args,
            env=env,
            cwd=str(root),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout_s: float = 120) -> None:
        from explorer.app.voila.serve import wait_until_listening

        try:
            wait_until_listening("127.0.0.1", self.port, self.proc, timeout=timeout_s)
        except Exception as err:
            self.stop()
            raise RuntimeError(
                f"jupyter lab did not start ({err}); its log:\n{self.log()[-3000:]}"
            ) from None

    def open_url(self, path: str) -> str:
        return f"{self.url}lab/tree/{path}?token={self.token}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()
        shutil.rmtree(self.home, ignore_errors=True)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    why = bs.browser_unavailable()
    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        why = why or "jupyterlab is not installed (pip install -e '.[test]')"
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"JupyterLab browser tests cannot run under CI: {why}")
        pytest.skip(why)
    root = tmp_path_factory.mktemp("lab-root")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("from explorer.app import Dashboard\n\nDashboard()")]
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, root / "dashboard_cell.ipynb")
    shutil.copy(NB_DIR / "01_one_forward_pass.ipynb", root / "01_one_forward_pass.ipynb")
    server = LabServer(root)
    server.wait_ready()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def lab_browser(lab):
    """One chromium for the module's tests (each test gets its own context: cookies, storage)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = bs.launch_chromium(pw)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def lab_page(lab_browser):
    """One JupyterLab page for the module's tests: JupyterLab loads once (its start-up in the
    browser is most of a test's time on a busy CPU), and each test opens its notebook in it."""
    context = lab_browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.errors = errors
    try:
        yield page
    finally:
        context.close()


def _open_and_run_all(page, lab, name: str) -> None:
    """Open notebook `name` (in the JupyterLab already loaded in `page`, else by its URL) and start
    Run All in it."""
    if page.evaluate(LAB_LOADED_JS):
        page.evaluate(OPEN_JS, name)
    else:
        page.goto(lab.open_url(name), wait_until="domcontentloaded", timeout=120_000)
    page.wait_for_function(NOTEBOOK_OPEN_JS, arg=name, timeout=120_000)
    page.evaluate(RUN_ALL_JS)


def _wait_or_say_why(page, lab, selector: str, timeout_ms: int) -> None:
    """Wait for `selector`; when it never shows, fail with what the notebook and the page said."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_selector(selector, timeout=timeout_ms)
    except PlaywrightTimeout:
        raise AssertionError(
            f"{selector} did not show in {timeout_ms / 1000:.0f} s; cell errors "
            f"{page.evaluate(ERRORS_JS)}; output {page.evaluate(STDOUT_JS)[-1500:]!r}; page errors "
            f"{page.errors}; JupyterLab's log ends {lab.log()[-1500:]!r}"
        ) from None


def test_dashboard_in_a_notebook_cell_steps(lab, lab_page):
    """What the README tells a JupyterLab user to type: the widgets appear, Step adds a token."""
    page = lab_page
    t0 = time.perf_counter()
    _open_and_run_all(page, lab, "dashboard_cell.ipynb")
    _wait_or_say_why(page, lab, bs.STEP_READY, timeout_ms=240_000)
    shown_s = time.perf_counter() - t0
    before_strip, before_dist = bs.strip_text(page), bs.dist_signature(page)
    page.click(bs.STEP_READY)
    bs.wait_text_change(page, ".ie-strip-text", before_strip, 60)
    page.wait_for_function(
        "(old) => { const root = document.querySelector('.ie-dist');"
        " return root && root.querySelectorAll('.bars path').length > 0; }",
        arg=None,
        timeout=60_000,
    )
    assert bs.token_count(page) >= 1, "Step added no token to the strip"
    assert bs.dist_signature(page) != before_dist, (
        "the distribution chart did not redraw for the new step"
    )
    assert len(bs.bar_boxes(page)) > 0, "the distribution chart shows no bars after the step"
    assert not [e for e in page.errors if "jupyter" not in e.lower()], page.errors
    print(f"dashboard shown in JupyterLab {shown_s:.1f} s after opening the notebook")


def test_run_all_of_a_classroom_notebook_shows_no_error(lab, lab_page):
    page = lab_page
    _open_and_run_all(page, lab, "01_one_forward_pass.ipynb")
    page.wait_for_function(ALL_RAN_JS, timeout=300_000, polling=1000)
    errors = page.evaluate(ERRORS_JS)
    assert errors == [], f"cells with errors: {errors}"
    stdout = page.evaluate(STDOUT_JS)
    sums = re.findall(r"sum of all [\d,]+ probabilities = ([\d.]+)", stdout)
    assert sums, "the softmax cell printed no sum (the notebook's output is missing)"
    assert float(sums[-1]) == pytest.approx(1, abs=1e-4)
