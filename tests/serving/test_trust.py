"""Nothing silently wrong, nothing lost: interrupted runs, untrustworthy servers and files.

A fake OpenAI-compatible server (stdlib http.server on 127.0.0.1) plays the bad server; Ctrl-C is
raised inside the run by a patched function, so every case is quick and exact.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from explorer.cli import main
from explorer.serving import Workload, serve
from explorer.serving.run import RunInterrupted
from explorer.serving.workload import WorkloadError

# --- a bad server ------------------------------------------------------------------------------------


class _Fake(BaseHTTPRequestHandler):
    mode: dict = {}

    def log_message(self, *a):  # quiet
        pass

    def _send(self, code: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._send(200, json.dumps({"data": [{"id": "fake"}]}).encode())

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        m = self.mode
        if not body.get("stream"):  # the probe before the run passes
            return self._send(200, json.dumps({"choices": [{"text": "ok"}]}).encode())
        if m.get("status"):
            return self._send(m["status"], b'{"error": "broken"}')
        if m.get("stall"):  # the first token, then nothing for `stall` seconds
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(b'data: {"choices": [{"text": " t0"}]}\n\n')
            self.wfile.flush()
            return m["stall"].wait(30)
        lines = [{"choices": [{"text": f" t{i}"}]} for i in range(m.get("chunks", 2))]
        lines.append({"choices": [], "usage": {"completion_tokens": m.get("usage", 2)}})
        out = "".join(f"data: {json.dumps(x)}\n\n" for x in lines)
        if m.get("done", True):
            out += "data: [DONE]\n\n"
        self._send(200, out.encode(), "text/event-stream")


@pytest.fixture
def fake_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def with_mode(**mode) -> str:
        _Fake.mode = mode
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield with_mode
    server.shutdown()


def _http_run(url: str):
    wl = Workload(num_prompts=3, input_len=4, output_len=2)
    return serve(None, wl, "http", base_url=url)


@pytest.mark.parametrize("value", ["many", -7, 10**12, 2.5, True])
def test_a_bad_usage_count_marks_the_request_and_keeps_the_result(fake_server, value, tmp_path):
    res = _http_run(fake_server(usage=value))
    assert res.meta["status"] == "failed"
    assert all("usage.completion_tokens=" in r.error for r in res.records)
    res.save(tmp_path / "r.json")  # the summary and the file survive
    assert json.loads((tmp_path / "r.json").read_text())["completed"] == 0


def test_a_stream_without_done_is_truncated(fake_server):
    res = _http_run(fake_server(done=False))
    assert all(
        r.error.startswith("truncated: the stream ended without [DONE]") for r in res.records
    )


def test_a_good_stream_is_complete(fake_server):
    res = _http_run(fake_server())
    assert res.meta["status"] == "complete" and all(r.output_len == 2 for r in res.records)


def test_every_request_failing_exits_non_zero_with_one_line(fake_server, tmp_path, capsys):
    url = fake_server(status=500)
    out = tmp_path / "r.json"
    args = ["bench", "serving", "--engine", "http", "--base-url", url, "--num-prompts", "2"]
    assert main([*args, "--json", str(out), "--request-timeout", "5"]) == 1
    ours = [x for x in capsys.readouterr().err.splitlines() if x.startswith("explorer:")]
    assert len(ours) == 1 and "every one of the 2 requests failed" in ours[0]
    assert json.loads(out.read_text())["status"] == "failed"


def test_a_stalled_stream_ends_at_the_request_timeout(fake_server, capsys):
    release = threading.Event()
    url = fake_server(stall=release)
    args = ["bench", "serving", "--engine", "http", "--base-url", url, "--num-prompts", "1"]
    try:
        assert main([*args, "--request-timeout", "0.5"]) == 1
    finally:
        release.set()
    assert "ReadTimeout" in capsys.readouterr().err


def test_a_request_timeout_must_be_positive(capsys):
    assert main(["bench", "serving", "--engine", "http", "--request-timeout", "0"]) == 2
    err = capsys.readouterr().err
    assert "timeout_s" in err and "must be a number > 0, got 0.0" in err


# --- interrupted runs --------------------------------------------------------------------------------


def _interrupt_after_first(monkeypatch, module, name):
    real = getattr(module, name)

    def once(*a, **k):
        real(*a, **k)
        raise KeyboardInterrupt

    monkeypatch.setattr(module, name, once)


def test_ctrl_c_in_a_continuous_run_is_raised_with_the_partial_result(target, monkeypatch, capfd):
    from explorer.serving.engines import continuous

    _interrupt_after_first(monkeypatch, continuous, "_fill")
    causal = getattr(target.model.config, "is_causal", None)
    with pytest.raises(RunInterrupted) as stopped:
        serve(target, Workload(num_prompts=6, input_len=8, output_len=8), "continuous")
    res = stopped.value.result
    assert res.meta["status"] == "interrupted (Ctrl-C)" and res.meta["partial"] is True
    assert sum(r.ok for r in res.records) == 1 and all(r.error for r in res.records if not r.ok)
    assert "WARNING" not in capfd.readouterr().err
    assert getattr(target.model.config, "is_causal", None) == causal


def test_an_interrupted_compare_reports_no_ratio(target, monkeypatch, capsys):
    import explorer.serving.engines.static as static

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(static, "run_batch", interrupted)
    args = ["bench", "serving", "--engine", "sequential", "--num-prompts", "2", "--output-len", "2"]
    assert main([*args, "--compare", "static"]) == 130
    out, err = capsys.readouterr()
    assert "throughput =" not in out
    assert (
        err.strip().splitlines()[-1].startswith("explorer: interrupted (Ctrl-C) during the static")
    )


def test_an_interrupted_calibration_fits_and_saves_nothing(monkeypatch, tmp_path, capsys):
    import pandas as pd

    import explorer.sweeps as sweeps

    def interrupted_grid(name, lm, **kw):
        df = pd.DataFrame([{"batch": 1}])
        df.attrs["notes"] = ["interrupted (Ctrl-C) at B=4: 1 rows kept"]
        return df

    monkeypatch.setattr(sweeps, "run", interrupted_grid)
    out = tmp_path / "cal.json"
    assert main(["bench", "calibrate", "--model", "bundled:target", "--out", str(out)]) == 130
    assert not out.exists()
    assert "no calibration fitted or saved" in capsys.readouterr().err


def test_ctrl_c_during_start_up_is_one_line(monkeypatch, capsys):
    import explorer.cli as cli

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert main(["info"]) == 130
    assert capsys.readouterr().err == "explorer: interrupted (Ctrl-C)\n"
    code = "import sys, explorer.cli; print('torch' in sys.modules)"
    light = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert light.stdout.strip() == "False"  # the console script imports torch inside main()


# --- files -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line, words",
    [
        (
            '{"prompt": [1, 2], "arrival_s": NaN}',
            "line 2: 'arrival_s' must be a number >= 0 and <= 604,800 s",
        ),
        (
            '{"prompt": [1, 2], "arrival_s": 1e12}',
            "line 2: 'arrival_s' must be a number >= 0 and <= 604,800 s",
        ),
        (
            '{"prompt": [1, 2], "max_tokens": "5"}',
            "line 2: 'max_tokens' must be a whole number >= 1",
        ),
        ('{"prompt": [1.5, 2]}', "line 2: 'prompt' must be non-empty text or a list of token ids"),
    ],
)
def test_trace_fields_are_checked_with_their_line(tmp_path, line, words):
    path = tmp_path / "t.jsonl"
    path.write_text('{"prompt": [1, 2]}\n' + line + "\n")
    with pytest.raises(WorkloadError, match=words):
        Workload.from_jsonl(path)


def test_workload_files_that_are_not_workloads_name_the_file(tmp_path):
    array, latin = tmp_path / "a.json", tmp_path / "b.json"
    array.write_text("[1, 2]")
    latin.write_bytes(b'{"num_prompts": 2, "arrival": "\xff"}')
    with pytest.raises(WorkloadError, match=r"a\.json: expected a JSON object .* got a JSON list"):
        Workload.load(array)
    with pytest.raises(WorkloadError, match=r"b\.json: not UTF-8 text"):
        Workload.load(latin)
    with pytest.raises(WorkloadError, match="request 0: 'max_tokens'"):
        Workload(requests_override=[{"prompt": [1], "max_tokens": None}])


def test_ids_outside_the_vocabulary_and_a_huge_kv_cache_are_refused_before_the_run(
    target, monkeypatch
):
    from explorer.model import device as device_mod
    from explorer.model.memory import NotEnoughMemory

    vocab = target.info.vocab_size
    wl = Workload(requests_override=[{"prompt": [1, vocab + 5], "max_tokens": 2}])
    with pytest.raises(ValueError, match=rf"token ids \[{vocab + 5}\] outside .* vocabulary"):
        serve(target, wl, "sequential")
    monkeypatch.setattr(device_mod, "available_bytes", lambda dev: 2**30)
    with pytest.raises(NotEnoughMemory, match="paged KV cache \\(200,000 blocks x 32 tokens\\)"):
        serve(target, Workload(num_prompts=2), "continuous", num_blocks=200_000)


def test_output_paths_are_checked_before_measuring(tmp_path, monkeypatch, capsys):
    import explorer.model.loader as loader

    def no_load(*a, **k):
        raise AssertionError("loaded a model before checking the output path")

    monkeypatch.setattr(loader, "load", no_load)
    missing = tmp_path / "nope" / "x.csv"
    assert main(["sweep", "prefill", "--csv", str(missing)]) == 2
    assert f"--csv {missing}: the folder" in capsys.readouterr().err
    assert main(["bench", "serving", "--json", str(missing)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["bench", "calibrate", "--out", str(missing)]) == 2


def test_zero_repeats_is_refused_at_the_flag(capsys):
    assert main(["bench", "overhead", "--repeats", "0"]) == 2
    assert (
        "--repeats: must be a whole number >= 1 and <= 10,000,000, got '0'"
        in capsys.readouterr().err
    )


def test_app_refuses_an_unknown_model_and_a_non_notebook(tmp_path, capsys):
    config = tmp_path / "models.json"
    config.write_text('{"models": ["bundled:target", "nobody/no-such-model"]}')
    assert main(["app", "--shared", "--models-config", str(config), "--no-browser"]) == 2
    assert "model 'nobody/no-such-model' cannot be loaded here" in capsys.readouterr().err
    text = tmp_path / "x.ipynb"
    text.write_text("hello")
    assert main(["app", "--notebook", str(text), "--no-browser"]) == 2
    assert f"--notebook {text}: not a readable notebook" in capsys.readouterr().err
    assert main(["app", "--notebook", str(config), "--no-browser"]) == 2
    assert "not a notebook (a .ipynb file is needed)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text, words",
    [
        ("not json", "not a calibration file \\(not JSON"),
        ("[1]", "not a calibration file \\(no s_per_byte"),
        ('{"s_per_byte": 1}', "not a calibration file \\(no s_per_flop, step_overhead_s"),
        (
            '{"s_per_byte": -1, "s_per_flop": 0, "step_overhead_s": NaN, "layer_overhead_s": null}',
            "s_per_byte=-1, step_overhead_s=nan: each must be a finite number >= 0",
        ),
    ],
)
def test_calibration_load_names_a_bad_file(tmp_path, text, words):
    from explorer.costs.calibrate import Calibration

    path = tmp_path / "cal.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"{path}: {words}"):
        Calibration.load(path)


def test_an_interrupted_serving_sweep_keeps_the_cut_point_marked_partial(target, monkeypatch):
    import explorer.serving.engines.static as static
    from explorer.sweeps import serving as serving_sweep
    from explorer.sweeps._common import interrupted

    def interrupted_batch(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(static, "run_batch", interrupted_batch)
    df = serving_sweep.run(
        target,
        over="batch",
        values=[2],
        engines=["sequential", "static"],
        num_prompts=2,
        input_len=8,
        output_len=2,
        bar=False,
    )
    assert interrupted(df), df.attrs["notes"]
    assert list(df["engine"]) == ["sequential", "static"]
    assert list(df["partial"]) == [False, True]  # the cut point is kept, and says so
