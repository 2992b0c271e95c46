"""Bad input on the newer surfaces (issue 45): simulate --capacity, sweep pays, sweep moe, scenario,
published-run files, info on architecture shapes, Session.routing(). One line before any work,
exit 2; Ctrl-C keeps what was measured, exit 130, no traceback."""

from __future__ import annotations

import copy
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import weakref

import pytest

from explorer.cli import main

GiB = 2**30


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    lines = [line for line in err.splitlines() if line.strip() and "Loading weights" not in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def small_memory(monkeypatch):
    """This machine reports 8 GiB free (so a refusal does not depend on the machine's memory)."""
    monkeypatch.setattr("explorer.model.device.available_bytes", lambda device: 8 * GiB)


# --- simulate --capacity: every flag used or refused ---------------------------------------------

CAPACITY = ["simulate", "--capacity", "--goodput", "ttft:500", "--hardware", "h100"]


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--num-prompts", "100000000"], "--num-prompts with --capacity must be a whole number from 1 to 16,000"),
        (["--num-prompts", "0"], "--num-prompts with --capacity"),
        (["--input-len", "200000"], "--input-len 200000 + --output-len 32 is more than arch:llama-3.1-8b's context"),
        (["--input-len", "-3"], "input length must be a whole number >= 1"),
        (["--output-len", "0"], "output length must be a whole number >= 1"),
        (["--workload", "/no/such/file.json"], "--capacity does not use --workload"),
        (["--request-rate", "5"], "--capacity does not use --request-rate"),
        (["--max-concurrency", "4"], "--capacity does not use --max-concurrency"),
        (["--burstiness", "2"], "--capacity does not use --burstiness"),
        (["--measured", "x.json"], "--capacity does not use --measured"),
        (["--max-batch-tokens", "64"], "--capacity does not use --max-batch-tokens"),
        (["--max-num-seqs", "64"], "--capacity does not use --max-num-seqs"),
        (["--engine", "nope"], "the simulator has no policy for engine 'nope'; it models sequential"),
        (["--dtype", "bogus"], "unknown dtype 'bogus'"),
        (["--gpu-hour-usd", "nan"], "--gpu-hour-usd must be a number > 0"),
        (["--gpu-hour-usd", "inf"], "--gpu-hour-usd must be a number > 0"),
        (["--bw-efficiency", "nan"], "bw_efficiency must be a number > 0 and <= 1, got nan"),
        (["--goodput", "ttft:nan"], "--goodput: 'ttft:nan' must be a finite number of ms > 0"),
        (["--goodput", "tpot:inf"], "--goodput: 'tpot:inf' must be a finite number of ms > 0"),
    ],
)  # fmt: skip
def test_capacity_refuses_what_it_would_not_use(extra, words, capsys):
    assert main([*CAPACITY, *extra]) == 2
    assert words in _one_line(capsys)


def test_capacity_passes_dtype_and_kv_dtype_to_the_search(monkeypatch, capsys):
    """--dtype fp8 and --kv-dtype int4 reach capacity() (they were dropped: the bf16 answer)."""
    from explorer.serving.simulate import capacity as cap

    seen = {}

    def search(info, chip, **kw):
        seen.update(kw, chip=chip)
        return {"largest_rate": None, "assumptions": []}

    monkeypatch.setattr(cap, "capacity", search)
    argv = [*CAPACITY, "--input-len", "512", "--output-len", "128", "--dtype", "fp8"]
    assert main([*argv, "--kv-dtype", "int4", "--json"]) == 0
    assert seen["dtype"] == "fp8" and seen["kv_dtype"] == "int4" and seen["chip"] == "h100"
    assert (seen["input_len"], seen["output_len"]) == (512, 128)


def test_nan_and_inf_slos_are_refused_by_every_command(capsys):
    from explorer.serving import parse_goodput

    for text in ("ttft:nan", "ttft:inf", "tpot:-inf", "e2el:0"):
        with pytest.raises(ValueError, match="must be a finite number of ms > 0"):
            parse_goodput([text])
    assert main(["simulate", "--hardware", "h100", "--goodput", "ttft:nan"]) == 2
    assert "ttft:nan" in _one_line(capsys)
    assert main(["bench", "serving", "--goodput", "ttft:inf"]) == 2
    assert "ttft:inf" in _one_line(capsys)
    assert parse_goodput(["ttft:500"]) == {"ttft": 500.0}


# --- sweep pays and sweep moe ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--trick", "int8", "--values", "inf"], "--values for --over prefill must be a whole number >= 1 and <= 10,000,000, got 'inf'"),
        (["--trick", "lookup", "--over", "k", "--values", "1e400"], "must be a whole number >= 1 and <= 32, got '1e400'"),
        (["--trick", "kv-cache", "--values", "nan"], "must be a whole number >= 2 and <= 10,000,000, got 'nan'"),
        (["--trick", "prefix-cache", "--over", "hit", "--values", "inf"], "must be a number >= 0 and <= 1, got 'inf'"),
        (["--trick", "kv-cache", "--values", "2,-1"], "must be a whole number >= 2 and <= 10,000,000, got '-1'"),
        (["--trick", "chunked-prefill", "--over", "chunk", "--values", "1e9"], "--over chunk must be a whole number >= 8"),
        (["--trick", "static-cache", "--values", "100000"], "100000 exceed(s) 512"),
        (["--trick", "continuous", "--over", "spread", "--values", "1e9"], "must be a number >= 0 and <= 3, got '1e9'"),
        (["--trick", "continuous", "--over", "rate", "--values", "1e300"], "must be a number >= 0.01 and <= 10000, got '1e300'"),
    ],
)  # fmt: skip
def test_pays_values_out_of_range_are_one_line(argv, words, capsys):
    assert main(["sweep", "pays", *argv]) == 2
    assert words in _one_line(capsys)


@pytest.mark.parametrize(
    "trick", [["speculative", "--over", "batch"], ["int8", "--over", "batch"], ["compile", "--over", "batch"]]
)  # fmt: skip
def test_pays_batches_past_free_memory_are_refused_before_any_point(trick, small_memory, capsys):
    assert main(["sweep", "pays", "--trick", *trick, "--values", "1,100000"]) == 2
    line = _one_line(capsys)
    assert "--values for --over batch: 100000:" in line and "needed (modelled)" in line
    assert "8.0 GiB available; the values up to 1 fit" in line


def test_moe_batches_past_free_memory_are_refused(small_memory, capsys):
    assert main(["sweep", "moe", "--model", "bundled:moe", "--batches", "1,4,100000"]) == 2
    line = _one_line(capsys)
    assert "--batches 100000:" in line and "batches up to 4 fit" in line


def test_a_csv_that_cannot_be_written_is_refused_before_loading(tmp_path, capsys):
    assert main(["sweep", "pays", "--csv", "/proc/no/x.csv"]) == 2
    assert "--csv /proc/no/x.csv" in _one_line(capsys)
    assert main(["sweep", "pays", "--csv", "/proc/x.csv"]) == 2
    assert "--csv /proc/x.csv: cannot be written" in _one_line(capsys)
    assert not (tmp_path / "x.csv").exists()


BATCH = ["sweep", "batch", "--model", "arch:smollm2-135m", "--batches", "1,2"]
BATCH += ["--context", "8", "--repeats", "1"]


def test_a_csv_that_fails_at_the_end_prints_the_rows(tmp_path, monkeypatch, capsys):
    """The file was writable when checked, is not when written: the rows go to stdout."""
    import dataclasses

    from explorer import sweeps

    path = tmp_path / "rows.csv"
    real = sweeps.get("batch")

    def then_blocked(lm, **kw):
        df = real.run(lm, **kw)
        path.mkdir()  # the path is now a folder: the write fails
        return df

    monkeypatch.setitem(sweeps.SWEEPS.entries, "batch", dataclasses.replace(real, run=then_blocked))
    assert main([*BATCH, "--csv", str(path), "--json"]) == 1
    captured = capsys.readouterr()
    rows = json.loads(captured.out)["rows"]
    assert [r["batch"] for r in rows] == [1, 2]
    assert f"--csv {path}: could not be written" in captured.err
    assert "rows are printed above" in captured.err


def test_ctrl_c_in_a_pays_sweep_keeps_its_rows_in_the_csv(tmp_path, monkeypatch, capsys):
    from explorer.sweeps import pays

    trick = pays.get_trick("kv-cache")
    calls = []

    def setup(ctx):
        point = trick.setup(ctx)

        def interrupted_second(v):
            calls.append(v)
            if len(calls) == 2:
                raise KeyboardInterrupt
            return point(v)

        return interrupted_second

    monkeypatch.setitem(
        pays.TRICKS.entries, "kv-cache", pays.Trick(**{**trick.__dict__, "setup": setup})
    )
    path = tmp_path / "pays.csv"
    argv = ["sweep", "pays", "--trick", "kv-cache", "--values", "2,4,8", "--repeats", "1"]
    assert main([*argv, "--csv", str(path)]) == 130
    text = path.read_text().splitlines()
    assert len(text) == 2 and text[1].startswith("kv-cache,length,2,")  # header + the one row
    attrs = json.loads((tmp_path / "pays.csv.attrs.json").read_text())
    assert attrs["partial"] is True
    assert any(n.startswith("interrupted (Ctrl-C) at length=4") for n in attrs["notes"])


def test_ctrl_c_in_the_garbage_collection_after_a_point_keeps_its_row(monkeypatch):
    from explorer.sweeps import _common

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(_common.gc, "collect", interrupted)
    notes: list[str] = []
    rows = _common.measure_points([1, 2, 3], lambda p: {"p": p}, notes, label=lambda p: f"p={p}")
    assert rows == [{"p": 1}]
    assert notes == ["interrupted (Ctrl-C) after p=1: 1 rows kept"]


def test_ctrl_c_in_a_weakref_callback_is_raised_again_not_lost(monkeypatch):
    from explorer.cli import _redeliver

    dropped = []
    monkeypatch.setattr(sys, "unraisablehook", _redeliver(dropped.append))

    class Thing:
        pass

    def callback(_):
        raise KeyboardInterrupt  # Python reports it as unraisable and would go on

    thing = Thing()
    ref = weakref.ref(thing, callback)
    with pytest.raises(KeyboardInterrupt):
        del thing
        for _ in range(10**7):  # the re-raised interrupt arrives at a later bytecode
            pass
    assert ref() is None and dropped == []


# --- scenarios ----------------------------------------------------------------------------------


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_scenario_server_flags_without_url_are_one_line(capsys):
    assert main(["scenario", "overload", "--fixed-url", "http://127.0.0.1:1"]) == 2
    assert "--fixed-url goes with --url" in _one_line(capsys)
    assert main(["scenario", "overload", "--served-model", "m"]) == 2
    assert "--served-model goes with --url" in _one_line(capsys)
    argv = ["scenario", "kv-exhaustion", "--url", "http://127.0.0.1:1", "--hardware", "h100"]
    assert main(argv) == 2
    assert "--hardware does not apply to a run against a server" in _one_line(capsys)


def test_scenario_against_no_server_names_the_url_quickly(capsys):
    url = f"http://127.0.0.1:{_unused_port()}"
    argv = ["scenario", "kv-exhaustion", "--url", url]
    assert main(argv) == 2
    assert f"no OpenAI-compatible server answers at {url}/v1/models" in _one_line(capsys)
    good = f"http://127.0.0.1:{_unused_port()}"
    assert main([*argv[:2], "--url", "ftp://x", "--fixed-url", good]) == 2
    assert "'ftp://x' is not a server's base URL" in _one_line(capsys)


@pytest.mark.parametrize(
    "budget, words",
    [
        ("0.000001", "below the memory-wall scenario's least, 0.002 GB"),
        ("0.001", "below the memory-wall scenario's least"),
        ("nan", "must be a number of GB > 0"),
        ("-1", "must be a number of GB > 0"),
        ("inf", "more than this machine has available"),
    ],
)
def test_memory_wall_budget_out_of_range_is_refused_up_front(budget, words, capsys):
    assert main(["scenario", "memory-wall", "--memory-budget", budget, "--scale", "small"]) == 2
    assert words in _one_line(capsys)


def test_ctrl_c_during_the_memory_wall_search_keeps_its_probes():
    from types import SimpleNamespace as NS

    from explorer.serving.scenarios.memory_wall import probes_so_far

    def probe(ok: bool):
        return NS(records=[NS(ok=ok)] * 2, meta={})

    probes = {4: probe(True), 8: probe(False), 6: probe(True), 7: probe(False)}
    failed, fitted = probes_so_far(probes)
    assert failed is probes[7] and fitted is probes[6]
    assert failed.meta["partial"] and fitted.meta["partial"]
    only_fitted = {3: probe(True)}
    failed, fitted = probes_so_far(only_fitted)
    assert failed is None and fitted is only_fitted[3]


def test_ctrl_c_outside_a_run_keeps_the_scenario_partial(target, monkeypatch):
    """Ctrl-C during cold-start's load (no serve() running): partial, not a raw interrupt."""
    from explorer.serving import scenarios

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("explorer.model.loader.load", interrupted)
    with pytest.raises(scenarios.ScenarioInterrupted) as cut:
        scenarios.run("cold-start", target, scale="small")
    part = cut.value.scenario
    assert part.partial and part.broken is None and "stopped before the broken run" in part.verdict


def _interrupt_a_scenario() -> tuple[int, str, str]:
    """Run the CLI's small cold-start scenario and send the real SIGINT as soon as its fresh load
    starts: (exit code, stdout, stderr)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    cmd = [sys.executable, "-m", "explorer.cli", "scenario", "cold-start", "--scale", "small"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    err: list[str] = []
    for line in proc.stderr:  # read here, not by a polling thread: the signal goes out at once
        err.append(line)
        if "loading a fresh copy" in line:
            proc.send_signal(signal.SIGINT)
            break
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    reader.start()
    out = proc.stdout.read()
    proc.wait(60)
    reader.join(10)
    return proc.returncode, out, "".join(err)


def test_ctrl_c_during_a_scenario_from_the_shell_is_exit_130_without_traceback():
    """The real signal, sent to a CLI process once its first run has started. The small scenario
    lasts about 2 s: on a loaded machine the signal can land after its last run (the process then
    exits 0 with a complete result, which is not the case under test): tried up to 3 times."""
    for _ in range(3):
        code, out, text = _interrupt_a_scenario()
        if not (code == 0 and "partial" not in out):
            break
    assert code == 130, text
    assert "Traceback" not in text and "interrupted (Ctrl-C)" in text.splitlines()[-1]
    assert "partial: the scenario was stopped" in out


# --- published-run files ----------------------------------------------------------------------------


@pytest.fixture
def runs_file(tmp_path, monkeypatch):
    """Write an edited copy of the published runs and point the module at it."""
    from explorer.serving.simulate import published

    real = json.loads(published.PUBLISHED.read_text())
    monkeypatch.setattr(published, "_MEMO", {})

    def write(edit) -> str:
        data = copy.deepcopy(real)
        edit(data)
        path = tmp_path / "runs.json"
        path.write_text(json.dumps(data))
        monkeypatch.setattr(published, "PUBLISHED", path)
        return str(path)

    return write


def _measured(value):
    return lambda d: d["points"][0]["measured"].__setitem__("median_ttft_ms", value)


def _replay_edit(num_prompts=None, short_outputs=False):
    """An edit of the first replayed run (S13's 1,000 ShareGPT requests): a num_prompts beside
    its lengths, or one output length too few."""

    def edit(d):
        wl = next(p for p in d["points"] if p["workload"]["kind"] == "replay")["workload"]
        if num_prompts is not None:
            wl["num_prompts"] = num_prompts
        if short_outputs:
            wl["output_lens"].pop()

    return edit


@pytest.mark.parametrize(
    "edit, words",
    [
        (_measured("100"), "measured.median_ttft_ms must be a finite number of ms > 0 and <= 1e+07, got '100'"),
        (_measured(0), "measured.median_ttft_ms must be a finite number of ms > 0"),
        (_measured(-5), "got -5"),
        (_measured(1e300), "got 1e+300"),
        (_measured(True), "got True"),
        (lambda d: d["points"][0]["measured"].__setitem__("ttft", 5), "measured.ttft is not a known metric; known: output_throughput (output tokens/s)"),
        (lambda d: d["points"][0].pop("engine"), "missing engine"),
        (lambda d: d["points"][0].__setitem__("engine", "vLLM"), "engine 'vLLM' gives no version"),
        (lambda d: d["points"][0].__setitem__("engine", ""), "engine must name the serving engine and its version"),
        (lambda d: d["points"][0].__setitem__("tp", 0), "tp must be a whole number >= 1"),
        (lambda d: d["points"][0]["workload"].__setitem__("num_prompts", -1), "workload.num_prompts must be a finite number > 0"),
        (lambda d: d["points"].__setitem__(0, 5), "a point must be a JSON object, got int"),
        (_replay_edit(num_prompts=5), "a replay has one input and one output length per request: 1000 input_lens, 1000 output_lens, num_prompts 5"),
        (_replay_edit(short_outputs=True), "1000 input_lens, 999 output_lens"),
        (lambda d: d.__setitem__("points", []), "its 'points' list is empty"),
    ],
)  # fmt: skip
def test_a_published_runs_file_is_validated_when_read(edit, words, runs_file, capsys):
    path = runs_file(edit)
    assert main(["bench", "simulate", "--published"]) == 2
    line = _one_line(capsys)
    assert line.startswith(f"explorer: {path}") and words in line


def test_nan_in_a_published_runs_file_is_refused(runs_file, capsys):
    from explorer.serving.simulate import published

    runs_file(_measured(float("nan")))  # json writes NaN, which Python's json reads back
    with pytest.raises(ValueError, match="got nan"):
        published.load()


def test_fit_with_no_fitted_runs_refuses(runs_file, capsys):
    from explorer.serving.simulate.published import FIT_SOURCES

    runs_file(lambda d: d.__setitem__("points", [p for p in d["points"] if p["source"] not in FIT_SOURCES]))  # fmt: skip
    assert main(["bench", "simulate", "--published", "--fit"]) == 2
    assert "--fit: no published run of the training sources" in _one_line(capsys)


def test_the_bundled_published_runs_pass_the_checks():
    from explorer.serving.simulate import published

    data = published.load()
    assert len(data["points"]) > 10 and all(any(c.isdigit() for c in p["engine"]) for p in data["points"])  # fmt: skip


# --- info, routing --------------------------------------------------------------------------------


def test_info_on_an_architecture_takes_its_dtype(capsys):
    assert main(["info", "arch:gpt-oss-20b", "--dtype", "bogus"]) == 2
    assert "unknown dtype 'bogus'" in _one_line(capsys)
    assert main(["info", "arch:gpt-oss-20b", "--dtype", "bfloat16", "--json"]) == 0
    bf16 = json.loads(capsys.readouterr().out)
    assert main(["info", "arch:gpt-oss-20b", "--json"]) == 0
    fp32 = json.loads(capsys.readouterr().out)
    assert bf16["dtype"] == "bfloat16" and fp32["dtype"] == "float32"
    assert bf16["weight_bytes"] * 2 == fp32["weight_bytes"]


def test_routing_waits_for_the_step_that_holds_the_session(target):
    import explorer

    s = explorer.Session(target, "The return statement", max_new_tokens=2, roofline=False)
    s.step()
    got = []
    s._busy.acquire()  # as a step running in another thread holds it
    reader = threading.Thread(target=lambda: got.append(s.routing()))
    reader.start()
    reader.join(0.3)
    held = list(got)
    s._busy.release()
    reader.join(30)
    assert held == [] and got and got[0]["dense"] is True
