"""The http engine against a real `transformers serve --continuous-batching` process serving the
bundled target on 127.0.0.1 (a free port, started and stopped here; nothing leaves this machine)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from explorer.serving import ServingResult, Workload, format_summary, serve
from explorer.serving.engines.http import ServerError

TARGET = Path(__file__).resolve().parents[2] / "assets" / "models" / "target"
CLI = Path(sys.executable).parent / "transformers"

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(tmp_path) -> tuple[subprocess.Popen, str]:
    if not CLI.exists():
        pytest.fail(
            f"{CLI} is missing: `make test` installs transformers[serving] (the test extra)"
        )
    port = _free_port()
    log = open(tmp_path / f"serve-{port}.log", "w")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen(
        [
            str(CLI),
            "serve",
            str(TARGET),
            "--continuous-batching",
            "--cb-num-blocks",
            "128",
            "--cb-max-batch-tokens",
            "256",
            "--device",
            "cpu",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"transformers serve exited: {(tmp_path / log.name).read_text()[-2000:]}"
            )
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("transformers serve did not answer within 180 s")


def _stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def server_proc(tmp_path_factory):
    """One `transformers serve` for the module (its start is ~10 s of imports and loading); the
    last test of the file kills it mid-run."""
    proc, url = _start_server(tmp_path_factory.mktemp("serve"))
    yield proc, url
    _stop_server(proc)


@pytest.fixture(scope="module")
def server(server_proc):
    return server_proc[1]


WL = Workload(
    num_prompts=8, input_len=20, input_dist="uniform", input_spread=0.5, output_len=12, seed=5
)


def test_http_and_continuous_agree_on_output_tokens(target, server):
    over_http = serve(target, WL, "http", base_url=server)
    local = serve(target, WL, "continuous")
    assert over_http.meta["status"] == "complete", over_http.result["errors"]
    assert over_http.engine["served_model"] == str(TARGET)
    # transformers serve takes no ignore_eos: the probe found its generation_config way
    assert over_http.engine["ignore_eos_style"] == "min_new_tokens"
    assert [r.output_len for r in over_http.records] == [r.output_len for r in local.records]
    assert [r.output_len for r in over_http.records] == [12] * 8
    # the server saw the same prompt ids (Workload prompts are what the tokenizer makes of them)
    assert [r.input_len for r in over_http.records] == [r.input_len for r in local.records]
    # greedy on both sides: the same text
    assert [r.text for r in over_http.records] == [r.text for r in local.records]
    r = over_http.result
    assert r["completed"] == 8 and r["total_output_tokens"] == 96
    for rec in over_http.records:  # timings from chunk arrivals
        assert rec.sent_s < rec.token_s[0] <= rec.token_s[-1] <= rec.end_s
        assert len(rec.token_s) >= 2 and rec.tpot > 0
    assert "Successful requests:" in format_summary(over_http)


def test_closed_loop_over_http(target, server):
    wl = Workload(num_prompts=6, input_len=12, output_len=6, max_concurrency=2, seed=1)
    res = serve(target, wl, "http", base_url=server)
    assert res.result["completed"] == 6 and res.result["max_concurrent_requests"] <= 2


def test_the_cli_runs_http_without_a_local_model(server, tmp_path, capsys):
    from explorer.cli import main

    out = tmp_path / "http.json"
    rc = main(
        [
            "bench",
            "serving",
            "--engine",
            "http",
            "--base-url",
            f"{server}/v1",
            "--num-prompts",
            "3",
            "--input-len",
            "8",
            "--output-len",
            "5",
            "--json",
            str(out),
        ]
    )
    assert rc == 0, capsys.readouterr().err
    assert "Successful requests:" in capsys.readouterr().out
    back = ServingResult.load(out)
    assert back.result["completed"] == 3 and [r.output_len for r in back.records] == [5, 5, 5]


def test_a_server_side_scenario_runs_against_the_server_and_says_which_flags_it_needs(
    target, server, capsys
):
    """kv-exhaustion sent to this server (whatever its flags): the evidence a client sees, the
    flags that would break and fix it, and the same through `explorer scenario --url`."""
    from explorer import plots
    from explorer.serving.scenarios import kv_exhaustion as kv
    from explorer.serving.scenarios import remote

    res = remote.run_remote("kv-exhaustion", server, lm=target)
    n = kv.LOCAL["num_prompts"]
    assert res.broken.meta["status"] == "complete" and res.fixed is None and not res.partial
    ev = res.evidence["broken"]
    assert ev["requests"] == n and ev["failed"] == 0 and ev["median_itl_ms"] > 0
    assert f"0 of {n} requests failed" in res.verdict
    blocks = kv.blocks_for(kv.LOCAL, kv.SHORT_FRACTION)
    assert f"--cb-num-blocks {blocks} " in res.knobs["broken"]["transformers serve"]
    assert f"--num-gpu-blocks-override {blocks} " in res.knobs["broken"]["vLLM"]
    names = {t.name for t in plots.scenario_figure(res).data}
    assert f"broken: {res.broken.label} (measured)" in names
    out = json.loads(json.dumps(res.to_dict(), default=str))  # what --json prints
    assert out["broken"]["completed"] == n and out["fixed"] is None
    assert out["server_knobs"]["fixed"]["vLLM"].endswith(f"--block-size {kv.LOCAL['page_size']}")
    # the CLI refuses a scenario whose knob is not a server's, before loading anything
    from explorer.cli import main

    assert main(["scenario", "overload", "--url", server]) != 0
    assert "--url takes kv-exhaustion" in capsys.readouterr().err


def test_a_wrong_model_name_fails_before_the_run_naming_what_is_served(target, server):
    with pytest.raises(ServerError, match=r"does not serve 'Qwen/Qwen2.5-7B'; it serves .*target"):
        serve(target, WL, "http", base_url=server, served_model="Qwen/Qwen2.5-7B")


def test_chat_without_a_template_is_a_clear_error(target, server):
    with pytest.raises(
        ServerError, match=r"refused a probe request to .*/v1/chat/completions .*400"
    ):
        serve(target, WL, "http", base_url=server, endpoint="chat")


def test_no_server_fails_before_the_run_naming_the_url(target):
    url = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(
        ServerError, match=rf"no OpenAI-compatible server answers at {url}/v1/models"
    ):
        serve(target, WL, "http", base_url=url)


def test_a_server_dying_mid_run_keeps_what_finished(target, server_proc, tmp_path, monkeypatch):
    """Last in the file: it kills the module's server once the first request has finished (an
    event, not a timer: under load a fixed delay killed it before any had)."""
    from explorer.serving.engines import http

    proc, url = server_proc
    stream = http.Http._stream

    async def stream_then_kill(self, client, req, rec, feeder, stop):
        await stream(self, client, req, rec, feeder, stop)
        if proc.poll() is None:  # the first request to finish whole
            os.killpg(proc.pid, signal.SIGKILL)

    monkeypatch.setattr(http.Http, "_stream", stream_then_kill)
    wl = Workload(
        num_prompts=16, arrival="fixed", request_rate=4.0, input_len=12, output_len=8, seed=2
    )
    res = serve(target, wl, "http", base_url=url)
    r = res.result
    assert res.meta["status"] == "partial"
    assert 1 <= r["completed"] < 16 and r["completed"] + r["failed"] == 16
    assert all(x.output_len == 8 for x in res.records if x.ok)
    assert all(e for e in r["errors"])  # every failed request says why
    path = tmp_path / "died.json"
    res.save(path)
    back = ServingResult.load(path)
    assert back.result["failed"] == r["failed"] and back.meta["status"] == "partial"
    assert f"{r['failed']}" in format_summary(back).split("Failed requests:")[1].split("\n")[0]
