"""Launch the dashboard with Voila: the command line, the kernels' environment, start, stop, serve.

    serve(AppConfig(port=8866))          what `explorer app` and `make app` run
    voila_command(config)                the Voila command line, for reading or for starting it yourself
    kernel_env(config)                   the environment the server and its kernels run with
    start(config) / stop(proc)           the server as a child process in its own process group

The server is server.py (Voila, the culling kernel manager of kernel_pool.py and the static route of
assets.py); capacity.py measures its kernels.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import webbrowser
from pathlib import Path

from explorer.app.voila.assets import WIDGET_JS_ENV, WIDGET_JS_ROUTE
from explorer.app.voila.capacity import measure_capacity
from explorer.app.voila.config import AppConfig

REPO = Path(__file__).resolve().parents[3]
SERVER = Path(__file__).resolve().with_name("server.py")
DASHBOARD = REPO / "notebooks" / "dashboard.ipynb"
DASHBOARD_CELLS = (
    "# Inference Explorer\n\nOne forward pass per token: what the model predicts, "
    "how sampling reshapes it, what each step costs.",
    "from explorer.app import Dashboard\nDashboard()",
)


def dashboard_notebook() -> Path:
    """notebooks/dashboard.ipynb in a source checkout; else the same two cells written to a temp folder."""
    if DASHBOARD.is_file():
        return DASHBOARD
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell(DASHBOARD_CELLS[0]),
        nbformat.v4.new_code_cell(DASHBOARD_CELLS[1]),
    ]
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    path = Path(tempfile.mkdtemp(prefix="explorer-app-")) / "dashboard.ipynb"
    nbformat.write(nb, path)
    return path


IOPUB_TIMEOUT_S = 120  # seconds Voila waits for a cell's output once the cell has finished


def voila_command(config: AppConfig, notebook: Path | None = None) -> list[str]:
    """The Voila command line for `config` (run it with kernel_env(config) in the environment)."""
    nb = notebook or config.notebook or dashboard_notebook()
    km = "MappingKernelManager"
    # server.py runs as the server's __main__: the server never imports explorer/torch
    cmd = [
        sys.executable,
        str(SERVER),
        str(nb),
        f"--port={config.port}",
        f"--Voila.ip={config.ip}",
        "--Voila.port_retries=0",
        "--no-browser",
        "--VoilaConfiguration.multi_kernel_manager_class=__main__.ExplorerKernelManager",
        f"--{km}.cull_idle_timeout={config.cull_idle_timeout}",
        f"--{km}.cull_interval={config.cull_interval}",
        f"--{km}.cull_connected=False",
        f"--{km}.cull_busy=False",
        # nbclient's default 4 s wait for a cell's output after its reply: on a loaded server
        # (8 pages at once on 2 cores) the dashboard's display came later, the page was served
        # without it and stayed blank ("Timeout waiting for IOPub output")
        f"--VoilaExecutor.iopub_timeout={IOPUB_TIMEOUT_S}",
        f"--VoilaConfiguration.show_tracebacks={not config.shared}",
    ]
    if config.pool_size > 0:
        cmd += [
            "--preheat_kernel=True",
            f"--pool_size={config.pool_size}",
            f"--VoilaKernelManager.fill_delay={float(config.refill_delay)}",
        ]
    else:
        cmd += ["--preheat_kernel=False"]
    return cmd


def kernel_env(config: AppConfig, base: dict | None = None) -> dict:
    """The server's environment: the kernels inherit it, and the Dashboard reads EXPLORER_SHARED / _MODELS_CONFIG."""
    env = dict(os.environ if base is None else base)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault(
        "HF_HUB_DISABLE_PROGRESS_BARS", "1"
    )  # transformers' "Loading weights" bar, shown on the page
    env.pop("EXPLORER_SHARED", None)
    env.pop("EXPLORER_MODELS_CONFIG", None)
    # One core is left to the browser and the server: with every core in torch's OpenMP team, a browser
    # drawing on the same machine stalls the team (measured on 2 cores: decode 8 ms -> 357 ms during Play).
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(config.threads)
    env["EXPLORER_APP_KERNEL"] = "1"  # the dashboard says how many kernels share the machine
    import plotly

    env[WIDGET_JS_ENV] = f"/{WIDGET_JS_ROUTE}widgetbundle.js?v={plotly.__version__}"
    if config.shared:
        env["EXPLORER_SHARED"] = "1"
        if config.models_config is not None:
            env["EXPLORER_MODELS_CONFIG"] = str(config.models_config)
    return env


def check_port_free(ip: str, port: int) -> None:
    """Raise ValueError if something already listens on ip:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((ip, port))
        except OSError as err:
            raise ValueError(
                f"cannot listen on {ip}:{port} ({err.strerror}); pick another with --port"
            ) from None


def wait_until_listening(
    ip: str, port: int, proc: subprocess.Popen | None = None, timeout: float = 60.0
) -> float:
    """Seconds until ip:port accepts connections. Raises RuntimeError if `proc` exits or time runs out."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(
                f"the Voila server exited with code {proc.returncode} before listening"
            )
        try:
            with socket.create_connection((ip, port), timeout=0.5):
                return time.perf_counter() - t0
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the Voila server did not listen on {ip}:{port} within {timeout:.0f} s")


def start(
    config: AppConfig, *, env: dict | None = None, stdout=None, stderr=None
) -> subprocess.Popen:
    """Start the Voila server (a child process in its own process group) and return it at once."""
    check_port_free(config.ip, config.port)
    return subprocess.Popen(
        voila_command(config),
        env=kernel_env(config, env),
        stdout=stdout,
        stderr=stderr,
        cwd=str(REPO),
        start_new_session=True,
    )


def stop(proc: subprocess.Popen, timeout: float = 20.0) -> int:
    """SIGTERM the server (it shuts its kernels down), then SIGKILL its process group if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # kernels left behind, if any
    except (ProcessLookupError, PermissionError):
        pass
    return proc.wait()


def describe(config: AppConfig) -> str:
    pool = (
        f"a pool of {config.pool_size} preheated kernel(s)"
        if config.pool_size
        else "no preheated kernels"
    )
    models = (
        ", ".join(config.models) if config.models else "bundled:target, bundled:draft (the default)"
    )
    mode = f"shared mode: no free-text model box; models offered: {models}"
    return (
        f"serving the dashboard at {config.url} with {pool}; kernels whose tab closed are reclaimed after "
        f"{config.cull_idle_timeout} s idle (checked every {config.cull_interval} s)"
        + (f"\n{mode}" if config.shared else "")
    )


def serve(config: AppConfig) -> int:
    """Run the server until Ctrl-C (what `explorer app` does). Returns the server's exit code."""
    print(describe(config), flush=True)
    proc = start(config)
    if (
        signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    ):  # a SIGTERM stops the server and its kernels too
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        wait_until_listening(config.ip, config.port, proc)
        if config.shared and config.pool_size > 0:
            cap = measure_capacity(proc.pid)
            print(cap.line(), flush=True)
            print(cap.detail(), flush=True)
        elif config.shared:
            print(
                "(capacity not measured: it needs a preheated kernel; use --pool-size 1 or more)",
                flush=True,
            )
        if config.open_browser:
            webbrowser.open(config.url)
        return proc.wait()
    except KeyboardInterrupt:
        return stop(proc)
    finally:
        if proc.poll() is None:
            stop(proc)
