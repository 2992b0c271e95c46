"""Shared fixtures. Everything runs offline and writes nothing to the user's home."""

from __future__ import annotations

import os
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
_HOME = tempfile.mkdtemp(prefix="explorer-test-home-")
for var in (
    "JUPYTER_CONFIG_DIR",
    "JUPYTER_DATA_DIR",
    "JUPYTER_RUNTIME_DIR",
    "IPYTHONDIR",
    "MPLCONFIGDIR",
):
    os.environ[var] = os.path.join(_HOME, var.lower())
os.environ["HOME"] = _HOME

import pytest  # noqa: E402
import torch  # noqa: E402

# One intra-op thread: on a 2-core machine shared with the suite's own kernels, servers and browser
# (and anything else running), a 2-thread pool waits for a descheduled thread on every op; the
# bundled models' passes are too small to gain from two. EXPLORER_TEST_THREADS overrides it.
torch.set_num_threads(int(os.environ.get("EXPLORER_TEST_THREADS", "1")))


@pytest.fixture(scope="session")
def target():
    """The bundled target model (loaded once per test session)."""
    from explorer import load

    return load("bundled:target")


@pytest.fixture(scope="session")
def draft():
    from explorer import load

    return load("bundled:draft")


@pytest.fixture(scope="session")
def tiny_arch():
    """A small architecture-only shape (GQA llama), for cost tests that need a real forward pass."""
    from explorer import load

    return load("arch:smollm2-135m")


# --- spreading the suite over two workers (`make test`: -n 2 --dist loadfile) ------------------------
# With --dist loadfile each test file is one unit of work (its module fixtures, a server or a page,
# start once), except here: each notebook's run is a unit of its own. In one file the eleven runs
# took ~320 s on one worker, longer than the whole rest of the suite's share. Units go out longest
# first (the files in RUN_FIRST, then the notebooks, slowest first), so no long unit starts last.
# (xdist's own --dist loadgroup cannot do this under pytest 9: its group suffix is lost.)
RUN_FIRST = ("tests/test_browser.py", "tests/test_jupyterlab.py")
NOTEBOOK_RUN = "tests/test_notebooks.py::test_notebook_runs_and_teaches["
# Seconds each notebook's run took in a fresh clone's `make test` (2 workers, 2 cores): the order
# they go out in. A notebook not listed goes after these, higher numbers first.
NOTEBOOK_SECONDS = {
    **{"11": 37, "13": 30, "10": 26, "08": 23, "12": 20, "09": 18.8, "05": 14.3, "07": 13.9},
    **{"03": 13.4, "06": 12, "14": 10.8, "04": 9.8, "15": 9.5, "02": 8.1, "01": 6.7},
}


def _unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its file, or its own for a notebook's run."""
    return nodeid if nodeid.startswith(NOTEBOOK_RUN) else nodeid.split("::", 1)[0]


def _rank(unit: str) -> float:
    """Lower goes out first."""
    if unit in RUN_FIRST:
        return RUN_FIRST.index(unit)
    if unit.startswith(NOTEBOOK_RUN):
        number = unit[len(NOTEBOOK_RUN) :][:2]
        if number in NOTEBOOK_SECONDS:
            return len(RUN_FIRST) + 100 - NOTEBOOK_SECONDS[number]
        return len(RUN_FIRST) + 200 - (int(number) if number.isdigit() else 0)
    return 1000


class _LongestFirst(dict):
    """xdist's queue of units (it pops the first); here it pops the lowest rank, ties in order."""

    def popitem(self, last: bool = True):
        unit = min(self, key=_rank)
        return unit, self.pop(unit)


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None  # xdist's own scheduler
    from xdist.scheduler import LoadFileScheduling

    class FilesAndNotebooks(LoadFileScheduling):
        def __init__(self, config, log=None):
            super().__init__(config, log)
            self.workqueue = _LongestFirst()

        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return FilesAndNotebooks(config, log)


# --- notebook run times, always in the log ---------------------------------------------------------
# tests/test_notebooks.py records each notebook's phases and slowest cells as the property "timing".
# Printed after every run (not only with -s): an intermittent multi-minute wait in one notebook has
# been seen only inside the full suite, and these lines say where the time went when it recurs.
_TIMINGS: list[str] = []


def pytest_runtest_logreport(report):
    if report.when == "call":
        _TIMINGS.extend(value for key, value in report.user_properties if key == "timing")


def pytest_terminal_summary(terminalreporter):
    if _TIMINGS:
        terminalreporter.section("notebook run times")
        for line in _TIMINGS:
            terminalreporter.write_line(line)
