"""Bad input gets one clear message and loses nothing: the library, the CLI and the dashboard."""

from __future__ import annotations

import json
import warnings

import pytest

import explorer
from explorer import Sampling, Trace, TraceFormatError
from explorer.cli import main

# --- the library -----------------------------------------------------------------------------------


def test_a_device_this_machine_lacks_is_named_with_the_ones_it_has():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(explorer.DeviceNotAvailableError) as err:
        explorer.load(device="cuda")
    assert "CUDA is not available on this machine" in str(err.value) and "devices here: cpu" in str(
        err.value
    )
    with pytest.raises(ValueError, match="unknown device 'gpu'"):
        explorer.load(device="gpu")


def test_a_seed_out_of_range_states_the_range():
    with pytest.raises(ValueError, match=r"seed must be a whole number >= 0 and <= 2\*\*64 - 1"):
        Sampling(seed=2**70)
    assert Sampling(seed=2**64 - 1).seed == 2**64 - 1  # the top of the range works


@pytest.mark.parametrize(
    "text, words",
    [
        ("not json at all", "invalid JSON at line 1"),
        ('{"prompt": "x", "settings": {}, "model": {}, "dev', "invalid JSON"),  # truncated
        ("[1, 2, 3]", "expected a JSON object, got list"),
        ('{"a": 1}', "missing prompt, settings, model, device, dtype"),
        (
            '{"prompt": "x", "settings": {}, "model": {}, "device": "cpu", "dtype": "float32", "schema": 99}',
            "trace format 99 by a newer Inference Explorer",
        ),
        (
            '{"prompt": "x", "settings": {}, "model": {}, "device": "cpu", "dtype": "float32", "steps": [{"index": 0}]}',
            "step 0 lacks phase",
        ),
    ],
)
def test_a_file_that_is_not_a_trace_says_so(text, words):
    with pytest.raises(TraceFormatError, match=words):
        Trace.from_json(text)


def test_a_trace_round_trips_through_a_file(target, tmp_path):
    s = explorer.Session(
        target, "The return statement", Sampling(greedy=True), max_new_tokens=3, roofline=False
    )
    s.run()
    s.trace.save(tmp_path / "t.json")
    assert Trace.load(tmp_path / "t.json").tokens == s.tokens
    with pytest.raises(TraceFormatError, match="is a folder"):
        Trace.load(tmp_path)


def test_too_many_draft_tokens_warn_and_say_which_k_ran(target, draft):
    from explorer.engine.speculative import SpeculativeSession

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = SpeculativeSession(target, draft, "The return statement", Sampling(greedy=True), k=1000)
    room = target.info.max_positions - len(s.prompt_ids) - 1
    assert s.k == room and s.k_requested == 1000 and s.trace.settings["k"] == room
    assert any(f"so k={room} is used" in str(w.message) for w in caught)
    assert s.step().k <= room


def test_a_prompt_too_long_gives_only_our_message(target, capfd):
    with pytest.raises(
        ValueError,
        match=r"the prompt of [\d,]+ tokens needs [\d,]+ positions, more than .*context of 512 positions",
    ):
        explorer.Session(target, "word " * 2000)
    assert "Token indices sequence length" not in capfd.readouterr().err


def test_choose_takes_a_token_text_or_says_what_it_expects(target):
    s = explorer.Session(target, "The return statement", Sampling(greedy=True), roofline=False)
    s.step()
    assert s.choose(" the").token_text == " the"
    with pytest.raises(
        ValueError, match="a token id or the text of exactly one token; 'abc def' is 2 tokens"
    ):
        s.choose("abc def")
    assert len(s.steps) == 2  # nothing was lost


# --- the CLI: every command, four kinds of bad input, one line each ---------------------------------

COMMANDS = {  # a working call of each command, the flag to spoil, and whether it loads a model
    "info": (["info"], None),
    "generate": (
        ["generate", "--prompt", "x", "--max-new-tokens", "2", "--no-roofline"],
        "--max-new-tokens",
    ),
    "speculate": (["speculate", "--prompt", "x", "--max-new-tokens", "2"], "--k"),
    "bench overhead": (
        ["bench", "overhead", "--new-tokens", "2", "--repeats", "1"],
        "--new-tokens",
    ),
    "bench prefix": (["bench", "prefix", "--prefix-tokens", "8", "--repeats", "1"], "--repeats"),
    "bench lookup": (["bench", "lookup", "--new-tokens", "2", "--repeats", "1"], "--repeats"),
    "bench hooks": (["bench", "hooks", "--new-tokens", "2", "--repeats", "1"], "--repeats"),
    "bench speculative": (
        ["bench", "speculative", "--max-new-tokens", "2", "--repeats", "1", "--k", "1"],
        "--repeats",
    ),
    "cost": (["cost"], "--batch"),
    "sweep batch": (["sweep", "batch", "--batches", "1", "--repeats", "1"], "--batches"),
}


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("explorer: ") and len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_bad_flag_value_is_one_line(name, capsys):
    argv, flag = COMMANDS[name]
    if flag is None:
        argv, flag = argv + ["--dtype"], "--dtype"
        bad = argv + ["float8"]
    else:
        bad = argv + [flag, "abc"]
    assert main(bad) == 2
    assert (
        flag.lstrip("-").split("-")[0] in _one_line(capsys) or "float8" in capsys.readouterr().err
    )


@pytest.mark.parametrize("name", [n for n in COMMANDS if n != "cost"] + ["cost"])
def test_a_missing_model_is_one_line(name, capsys):
    argv, _ = COMMANDS[name]
    flag = {"speculate": "--target", "bench speculative": "--target"}.get(name, "--model")
    if name == "info":
        bad = ["info", "no/such-model-here"]
    else:
        bad = argv + [flag, "no/such-model-here"]
    assert main(bad) == 2
    assert "no/such-model-here" in _one_line(capsys)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_ctrl_c_is_one_line_and_exit_130(name, capsys, monkeypatch):
    import explorer.model.loader as load_module

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(load_module, "load", interrupted)
    monkeypatch.setattr(load_module, "arch_info", interrupted)
    monkeypatch.setattr("explorer.costs.hardware.measure", interrupted)
    assert main(COMMANDS[name][0]) == 130
    assert _one_line(capsys) == "explorer: interrupted (Ctrl-C)"


def test_an_unreadable_trace_file_is_one_line(tmp_path, capsys):
    assert main(["replay", str(tmp_path / "absent.json")]) == 2
    assert "No such file" in _one_line(capsys)
    garbage = tmp_path / "garbage.json"
    garbage.write_text('{"prompt": "x", "sett')
    assert main(["replay", str(garbage)]) == 2
    assert "is not a trace file: invalid JSON" in _one_line(capsys)


def test_replay_shows_a_saved_trace_without_a_model(target, tmp_path, capsys):
    s = explorer.Session(
        target, "The return statement", Sampling(greedy=True), max_new_tokens=3, roofline=False
    )
    s.run()
    s.trace.save(tmp_path / "t.json")
    assert (
        main(["replay", str(tmp_path / "t.json"), "--json", "--html", str(tmp_path / "t.html")])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert (
        out["steps"] == 3 and out["text"] == s.text and (tmp_path / "t.html").stat().st_size > 1000
    )


def test_a_sweep_interrupted_keeps_its_rows(monkeypatch, capsys):
    from explorer.sweeps import batch_size

    real, calls = batch_size._row, []

    def second_is_interrupted(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(batch_size, "_row", second_is_interrupted)
    assert (
        main(
            [
                "sweep",
                "batch",
                "--model",
                "arch:smollm2-135m",
                "--batches",
                "1,2,4",
                "--context",
                "8",
                "--repeats",
                "1",
            ]
        )
        == 130
    )
    out = capsys.readouterr().out
    assert "note: interrupted (Ctrl-C) at B=2: 1 rows kept" in out


# --- the dashboard -----------------------------------------------------------------------------------


def test_dashboard_prompt_too_long_keeps_the_session(target):
    from explorer.app import Dashboard

    dash = Dashboard(lm=target, measure_peaks=False)
    dash.parts["step"].click()
    session, n = dash.session, len(dash.session.steps)
    dash.parts["prompt"].value = "word " * 2000
    assert "512 positions" in dash.parts["message"].value
    assert dash.session is session and len(session.steps) == n
    dash.parts["step"].click()
    assert len(dash.session.steps) == n + 1


def test_dashboard_stop_during_a_sweep_keeps_rows_and_session(target, monkeypatch):
    import threading

    from explorer.app import Dashboard
    from explorer.sweeps import prefill_decode

    real, measured, stopped = prefill_decode._rows, threading.Event(), threading.Event()

    def first_then_wait(*a, **k):  # the first length is measured; Stop comes before the next
        rows = real(*a, **k)
        measured.set()
        stopped.wait(60)
        return rows

    monkeypatch.setattr(prefill_decode, "_rows", first_then_wait)
    dash = Dashboard(lm=target, measure_peaks=False)
    tab = dash.tab("sweeps")
    dash.parts["sweep-repeats"].value = 1
    dash.parts["sweep-prefill-sizes"].value = "8, 16, 32, 64, 128, 256, 512"
    assert tab.start("prefill")
    assert measured.wait(120)
    dash.parts["sweep-stop"].click()
    stopped.set()
    dash.wait(120)
    df = tab.frames["prefill"]
    assert 0 < len(df) < 14 and any("stopped on request" in n for n in df.attrs["notes"])
    assert "stopped on request" in dash.parts["message"].value and dash.guard.busy is None
    dash.parts["step"].click()
    assert len(dash.session.steps) == 1


def test_dashboard_sweep_out_of_memory_keeps_rows_and_session(target, monkeypatch):
    import torch

    from explorer.app import Dashboard
    from explorer.sweeps import batch_size

    real = batch_size._row

    def oom_from_b2(lm, peaks, base, B, *a, **k):
        if B >= 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(lm, peaks, base, B, *a, **k)

    monkeypatch.setattr(batch_size, "_row", oom_from_b2)
    dash = Dashboard(lm=target, measure_peaks=False)
    dash.parts["sweep-repeats"].value = 1
    dash.parts["sweep-batch-sizes"].value = "1, 2, 4"
    assert dash.tab("sweeps").start("batch")
    dash.wait(120)
    df = dash.tab("sweeps").frames["batch"]
    assert list(df.batch) == [1] and "stopped at B=2: out of memory" in dash.parts["message"].value
    assert dash.guard.busy is None
    dash.parts["step"].click()
    assert len(dash.session.steps) == 1
