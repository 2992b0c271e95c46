"""A classroom server's kernels share the cores: threads per kernel, and the count the page shows."""

from __future__ import annotations

import os

import torch

from explorer.app.voila import sharing


def test_each_kernel_gets_its_share_of_the_cores():
    assert sharing.kernel_threads(2, 1) == 1  # one core left to the server and the browser
    assert sharing.kernel_threads(16, 1) == 15
    assert sharing.kernel_threads(16, 4) == 3
    assert sharing.kernel_threads(16, 8) == 1
    assert sharing.kernel_threads(16, 0) == 15  # no pool: one kernel at a time
    assert sharing.kernel_threads(None, 1) == 1


def _proc(tmp_path, table):
    for pid, (ppid, cmd) in table.items():
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "stat").write_text(f"{pid} (python (x)) S {ppid} 1 1 0 -1")
        (d / "cmdline").write_bytes(cmd.replace(" ", "\0").encode())
    (tmp_path / "self").mkdir()
    return tmp_path


def test_the_kernels_of_one_server_are_counted(tmp_path):
    proc = _proc(
        tmp_path,
        {
            11: (10, "python -m ipykernel_launcher -f k1.json"),
            12: (10, "python -m ipykernel_launcher -f k2.json"),
            13: (10, "node something"),  # the server's other child
            21: (20, "python -m ipykernel_launcher -f other.json"),  # another server's kernel
        },
    )
    assert sharing.kernels_sharing(parent=10, proc=proc) == 2
    assert sharing.kernels_sharing(parent=20, proc=proc) == 1
    assert sharing.kernels_sharing(parent=10, proc=tmp_path / "absent") is None


def test_the_note_shows_only_under_the_app_server():
    assert sharing.sharing_note({}) == ""
    note = sharing.sharing_note({"EXPLORER_APP_KERNEL": "1"})
    assert "share" in note and f"torch on {torch.get_num_threads()} thread" in note


def test_the_app_server_marks_its_kernels():
    from explorer.app.voila import config, serve

    env = serve.kernel_env(config.AppConfig(pool_size=2, threads=0), base={})
    assert env["EXPLORER_APP_KERNEL"] == "1"
    cores = os.cpu_count()
    assert env["OMP_NUM_THREADS"] == str(sharing.kernel_threads(cores, 2))
