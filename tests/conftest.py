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
