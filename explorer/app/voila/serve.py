"""Serve the dashboard with Voila: a preheated kernel pool, idle-kernel culling, a shared (classroom) mode.

    serve(AppConfig(port=8866))          what `explorer app` and `make app` run
    voila_command(config)                the Voila command line, for reading or for starting it yourself
    kernel_processes(server_pid)         the kernels a server has started (psutil.Process list)
    wait_for_pool(server_pid, n)         wait until n kernels exist and have finished rendering the notebook
    measure_capacity(server_pid)         one kernel's memory after the dashboard loaded -> Capacity

Voila 0.5 leaks a kernel whenever a tab closes (the page's shutdown beacon is refused), so the
server runs with ExplorerKernelManager: idle kernels with no open tab are culled after
`cull_idle_timeout` seconds, while pooled kernels, kernels with an open tab, and kernels that were
handed to a page whose browser has not connected yet (for up to 2 minutes) are kept.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import webbrowser
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "notebooks" / "dashboard.ipynb"
DASHBOARD_CELLS = (
    "# Inference Explorer\n\nOne forward pass per token: what the model predicts, "
    "how sampling reshapes it, what each step costs.",
    "from explorer.app import Dashboard\nDashboard()",
)
KERNEL_MARKER = "ipykernel_launcher"


# --- settings ------------------------------------------------------------------------------------


@dataclass
class AppConfig:
    """How `explorer app` serves the dashboard. Validated on construction (bad values raise ValueError)."""

    port: int = 8866
    ip: str = "127.0.0.1"
    shared: bool = False  # classroom mode: allow-listed models only, capacity printed
    models_config: Path | None = (
        None  # JSON allow-list for shared mode ({"models": [...]} or [...])
    )
    pool_size: int = 1  # preheated kernels kept ready (0 = no preheating)
    cull_idle_timeout: int = (
        120  # seconds a kernel with no open tab may idle before it is reclaimed
    )
    cull_interval: int = 0  # seconds between culler passes (0 = derived: timeout / 4, 1..30)
    refill_delay: float = (
        8.0  # seconds after a visitor takes a preheated kernel before its replacement starts
    )
    #   (its start-up would otherwise compete for the CPU with that visitor's first render: 3 s -> 10 s here)
    open_browser: bool = True
    threads: int = (
        0  # torch CPU threads per kernel (0 = derived: cores - 1, at least 1; see kernel_env)
    )
    notebook: Path | None = None  # default: notebooks/dashboard.ipynb (generated if not installed)
    models: list[str] = field(
        default_factory=list
    )  # derived: the allow-list read from models_config

    def __post_init__(self) -> None:
        for name in ("port", "pool_size", "cull_idle_timeout", "cull_interval"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if not 1 <= self.port <= 65535:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        if not 0 <= self.pool_size <= 32:
            raise ValueError(f"pool size must be in 0..32, got {self.pool_size}")
        if self.cull_idle_timeout < 1:
            raise ValueError(
                f"cull idle timeout must be at least 1 s, got {self.cull_idle_timeout}"
            )
        if self.cull_interval < 0:
            raise ValueError(f"cull interval must be >= 0 s, got {self.cull_interval}")
        if not isinstance(self.refill_delay, (int, float)) or not 0 <= self.refill_delay <= 600:
            raise ValueError(f"refill delay must be 0..600 s, got {self.refill_delay!r}")
        if not isinstance(self.threads, int) or isinstance(self.threads, bool) or self.threads < 0:
            raise ValueError(
                f"threads must be a whole number >= 0 (0 = cores - 1), got {self.threads!r}"
            )
        if self.threads == 0:
            self.threads = max(1, (os.cpu_count() or 2) - 1)
        if self.cull_interval == 0:
            self.cull_interval = max(1, min(30, self.cull_idle_timeout // 4))
        if self.models_config is not None:
            if not self.shared:
                raise ValueError("--models-config only applies with --shared")
            self.models_config = Path(self.models_config).expanduser().resolve()
            self.models = read_models_config(self.models_config)
        if self.notebook is not None:
            self.notebook = Path(self.notebook).expanduser().resolve()
            if not self.notebook.is_file():
                raise ValueError(f"notebook not found: {self.notebook}")

    @property
    def url(self) -> str:
        return f"http://{self.ip}:{self.port}/"


def read_models_config(path: Path) -> list[str]:
    """The allow-list of model names in a JSON file: {"models": ["bundled:target", ...]} or a bare list."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"models config not found: {path}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"models config {path} is not valid JSON: {err}") from None
    models = data.get("models") if isinstance(data, dict) else data
    if (
        not isinstance(models, list)
        or not models
        or not all(isinstance(m, str) and m.strip() for m in models)
    ):
        raise ValueError(
            f"models config {path} must hold a non-empty list of model names, "
            'e.g. {"models": ["bundled:target", "bundled:draft"]}'
        )
    return [m.strip() for m in models]


# --- the kernel manager --------------------------------------------------------------------------


def utcnow() -> datetime:
    """Aware UTC now, as jupyter_server stamps kernel.last_activity."""
    return datetime.now(timezone.utc)


_KM = None


def kernel_manager_class():
    """ExplorerKernelManager (built on first use: importing jupyter_server takes seconds, kernels never need it)."""
    global _KM
    if _KM is not None:
        return _KM
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
            if kernel_id not in self._ever_connected:
                # the grace runs from the later of: first seen outside the pool, last kernel activity (a
                # kernel started cold for a page renders the notebook first; on a loaded machine that
                # alone can take longer than the grace, and the browser connects only after it)
                first = self._unclaimed_since.setdefault(kernel_id, utcnow())
                since = max(first, _last_activity(self._kernels[kernel_id]) or first)
                if utcnow() - since < timedelta(
                    seconds=max(self.cull_idle_timeout, self.connect_grace)
                ):
                    return None
            return await super().cull_kernel_if_idle(kernel_id)

        async def shutdown_kernel(self, kernel_id: str, *args, **kwargs):
            self._ever_connected.discard(kernel_id)
            self._unclaimed_since.pop(kernel_id, None)
            return await super().shutdown_kernel(kernel_id, *args, **kwargs)

    _KM = ExplorerKernelManager
    return _KM


def _last_activity(kernel) -> datetime | None:
    """kernel.last_activity, or None before it is set (reading the unset trait raises TraitError)."""
    from traitlets import TraitError

    try:
        return getattr(kernel, "last_activity", None)
    except TraitError:
        return None


# --- plotly's widget code, fetched once per page -------------------------------------------------

WIDGET_JS_ROUTE = (
    "explorer/static/"  # under the server's base URL; serves plotly's widgetbundle.js only
)
WIDGET_JS_ENV = "EXPLORER_WIDGET_JS"  # set for the kernels: the bundle's path under the base URL
LOADER_JS = Path(__file__).with_name("figure_loader.js")  # the FigureWidget `_esm` of an app kernel


def plotly_bundle() -> Path:
    """plotly's FigureWidget front-end code (an ES module of ~5 MB that includes plotly.js)."""
    import plotly.basewidget

    return Path(str(plotly.basewidget.__file__)).parent / "package_data" / "widgetbundle.js"


def figure_widget_class():
    """go.FigureWidget, or (in a kernel of `explorer app`) a subclass that ships a 3 kB loader instead.

    A stock FigureWidget sends plotly's 5 MB widget bundle inline with every figure (an anywidget
    `_esm`): 9 figures = 45 MB over the websocket and 9 module parses before the page is usable.
    The loader (figure_loader.js) imports the bundle by URL from this server, so the browser fetches
    and parses it once, and it is ready at once so anywidget's 2 s limit on a model's start cannot
    freeze a chart when the bundle is slow to arrive (it replays the updates that came meanwhile).
    """
    import plotly.graph_objects as go

    path = os.environ.get(WIDGET_JS_ENV)
    if not path:
        return go.FigureWidget
    global _LINKED
    if _LINKED is None or _LINKED._explorer_path != path:
        esm = LOADER_JS.read_text().replace("BUNDLE_URL", json.dumps(path))
        _LINKED = type(
            "FigureWidget",
            (go.FigureWidget,),
            {"_esm": esm, "_explorer_path": path, "__module__": __name__},
        )
    return _LINKED


_LINKED = None


# --- the Voila command line ----------------------------------------------------------------------


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
    # This file runs as the server's __main__ (see the bottom), so the server never imports explorer/torch.
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
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


# --- kernels and memory --------------------------------------------------------------------------


def kernel_processes(server_pid: int) -> list:
    """The live kernel processes (psutil.Process) started by the server with pid `server_pid`."""
    import psutil

    try:
        children = psutil.Process(server_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for p in children:
        try:
            if p.status() != psutil.STATUS_ZOMBIE and any(
                KERNEL_MARKER in part for part in p.cmdline()
            ):
                out.append(p)
        except psutil.Error:
            continue
    return out


def _cpu_seconds(p) -> float:
    t = p.cpu_times()
    return t.user + t.system


def wait_for_pool(server_pid: int, n: int, timeout: float = 120.0, quiet_s: float = 1.0) -> float:
    """Wait until the server has >= n kernels and all of them have gone quiet (used < 2% CPU for `quiet_s`).

    With preheating, a quiet pool kernel has executed the whole notebook (the Dashboard is built).
    Returns the seconds waited; raises RuntimeError on timeout.
    """
    import psutil

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        kernels = kernel_processes(server_pid)
        if len(kernels) >= n:
            try:
                before = [_cpu_seconds(p) for p in kernels]
                time.sleep(quiet_s)
                used = [_cpu_seconds(p) - b for p, b in zip(kernels, before)]
            except psutil.Error:
                continue
            if all(u < 0.02 * quiet_s for u in used):
                return time.perf_counter() - t0
        else:
            time.sleep(0.2)
    raise RuntimeError(f"{n} quiet kernel(s) did not appear within {timeout:.0f} s")


def process_memory(p) -> dict:
    """rss, uss (private) and pss (proportional share) bytes of one process (psutil; Linux has all three)."""
    full = p.memory_full_info()
    return {
        "rss": full.rss,
        "uss": getattr(full, "uss", full.rss),
        "pss": getattr(full, "pss", full.rss),
    }


def tree_memory(server_pid: int) -> dict:
    """Memory of the server plus all its children, summed: rss (counts shared pages repeatedly), pss, uss."""
    import psutil

    total = {"rss": 0, "uss": 0, "pss": 0, "processes": 0}
    try:
        root = psutil.Process(server_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return total
    for p in procs:
        try:
            m = process_memory(p)
        except psutil.Error:
            continue
        for k in ("rss", "uss", "pss"):
            total[k] += m[k]
        total["processes"] += 1
    return total


@dataclass
class Capacity:
    """How many more visitors fit in memory, measured from one preheated kernel (dashboard built)."""

    kernel_uss: int  # private bytes of one kernel: what each extra visitor costs
    kernel_rss: int  # includes libraries shared with the other kernels
    available: int  # bytes the OS reports available now (psutil.virtual_memory().available)
    visitors: int  # available // kernel_uss

    def line(self) -> str:
        mb = 1024 * 1024
        return (
            f"this machine can hold about {self.visitors} visitors (one kernel ≈ {self.kernel_uss / mb:.0f} MB, "
            f"{self.available / mb:.0f} MB free)"
        )

    def detail(self) -> str:
        mb = 1024 * 1024
        return (
            f"  measured: private memory (USS) of one preheated kernel after the dashboard loaded; its RSS is "
            f"{self.kernel_rss / mb:.0f} MB incl. libraries shared between kernels. A visitor's kernel grows "
            f"as they step and load bigger models; CPU time is shared by all visitors ({os.cpu_count()} cores)."
        )


def capacity_from(kernel: dict, available: int) -> Capacity:
    """Capacity from one kernel's process_memory() and the available bytes: visitors = available // uss."""
    if kernel["uss"] <= 0:
        raise ValueError("kernel memory must be positive")
    return Capacity(
        kernel_uss=kernel["uss"],
        kernel_rss=kernel["rss"],
        available=available,
        visitors=int(available // kernel["uss"]),
    )


def measure_capacity(server_pid: int, timeout: float = 120.0) -> Capacity:
    """Wait for a quiet preheated kernel, then measure it and the memory still available."""
    import psutil

    wait_for_pool(server_pid, 1, timeout=timeout)
    kernels = kernel_processes(server_pid)
    one = max((process_memory(p) for p in kernels), key=lambda m: m["uss"])
    return capacity_from(one, psutil.virtual_memory().available)


# --- serve ---------------------------------------------------------------------------------------


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


if (
    __name__ == "__main__"
):  # the Voila server process: `python serve.py NOTEBOOK --voila-options...`
    sys.path.pop(0)  # not this folder: its modules must not shadow anything
    from jupyter_server.utils import url_path_join
    from tornado.web import StaticFileHandler
    from voila.app import Voila

    ExplorerKernelManager = (
        kernel_manager_class()
    )  # named by voila_command(): __main__.ExplorerKernelManager

    class ExplorerVoila(Voila):
        """Voila plus one static route: plotly's widget bundle (see figure_widget_class)."""

        def init_handlers(self) -> list:
            route = url_path_join(self.server_url, WIDGET_JS_ROUTE, r"(widgetbundle\.js)")
            return [
                (route, StaticFileHandler, {"path": str(plotly_bundle().parent)}),
                *super().init_handlers(),
            ]

    ExplorerVoila.launch_instance(argv=sys.argv[1:])
