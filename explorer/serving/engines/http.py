"""http: any OpenAI-compatible streaming server, measured as `vllm bench serve` measures it.

Each request is one streaming POST to /v1/completions (or /v1/chat/completions) with
stream_options.include_usage; its token times are the arrival times of the streamed chunks that
carry text, its output length the server's usage.completion_tokens. ignore_eos: vLLM and SGLang
take `"ignore_eos": true`; `transformers serve` answers 422 to it, so a probe request finds out
which the server takes, and for those servers we pass
`"generation_config": "{\"min_new_tokens\": N, \"eos_token_id\": -1}"` instead (its plain path
honours min_new_tokens, its continuous batching only eos_token_id). Before the run: the server is asked for
/v1/models (a clear error naming the URL if nothing answers, or naming the models it serves if
--served-model is not one of them). A server that dies mid-run fails the rest of the requests;
the ones already done are kept.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from explorer.engine.settings import setting
from explorer.serving.engines import Engine, Knobs, register


class ServerError(ValueError):
    """The server cannot be used (not running, wrong URL, unknown model)."""


@dataclass
class HttpKnobs(Knobs):
    base_url: str = setting("http://127.0.0.1:8000", "base URL", "the server (http:// or https://)")
    served_model: str | None = setting(
        None, "served model", "the model name it serves (None: its first)", kind=str, optional=True
    )
    endpoint: str = setting(
        "completions",
        "endpoint",
        "/v1/completions or /v1/chat/completions",
        choices=("completions", "chat"),
    )
    timeout_s: float = setting(
        600.0,
        "timeout (s)",
        "seconds a request may wait for the server's next bytes",
        low=0,
        low_open=True,
        cli="--request-timeout",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"http engine: the base URL must start with http:// or https://, got "
                f"{self.base_url!r}"
            )


@register("http", HttpKnobs, order=40)
class Http(Engine):
    local = False  # a server elsewhere; a local model only cuts the text prompts
    knobs: HttpKnobs

    def __init__(self, lm, knobs: HttpKnobs, *, ignore_eos: bool = True):
        super().__init__(lm, knobs, ignore_eos=ignore_eos)
        self.base_url = knobs.base_url.rstrip("/").removesuffix("/v1")
        self.served_model = knobs.served_model  # the server's first model if None, after check()
        self.endpoint, self.timeout_s = knobs.endpoint, knobs.timeout_s
        self.eos_style = None  # "ignore_eos" | "min_new_tokens", found by the probe

    def describe(self) -> dict:
        return {
            **super().describe(),
            "base_url": self.base_url,
            "served_model": self.served_model,
            "ignore_eos_style": self.eos_style,
        }

    # --- before the run --------------------------------------------------------------------------

    def check(self, requests) -> None:
        import httpx

        url = f"{self.base_url}/v1/models"
        try:
            r = httpx.get(url, timeout=10)
            r.raise_for_status()
            models = [m["id"] for m in r.json().get("data", [])]
        except (httpx.HTTPError, ValueError, KeyError) as err:
            raise ServerError(f"no OpenAI-compatible server answers at {url}: {err}") from None
        if self.served_model is None:
            if not models:
                raise ServerError(
                    f"the server at {self.base_url} lists no models; give --served-model"
                )
            self.served_model = models[0]
        elif models and self.served_model not in models:
            raise ServerError(
                f"the server at {self.base_url} does not serve {self.served_model!r}; it serves "
                f"{', '.join(models)}"
            )
        self.eos_style = self._probe(requests[0]) if self.ignore_eos else None

    def _probe(self, req) -> str:
        """Which way this server takes 'ignore EOS': vLLM's flag, or a min_new_tokens config."""
        import httpx

        for style in ("ignore_eos", "min_new_tokens"):
            body = self._body(req, 2, style, stream=False)
            try:
                r = httpx.post(self._url(), json=body, timeout=self.timeout_s)
            except httpx.HTTPError as err:
                raise ServerError(
                    f"the server at {self.base_url} failed a probe request: {err}"
                ) from None
            if r.status_code < 400:
                return style
        raise ServerError(
            f"the server at {self.base_url} refused a probe request to {self._url()} "
            f"({r.status_code}: {r.text[:160]}); if it is about ignore_eos, run with ignore_eos=False"
        )

    def _url(self) -> str:
        return f"{self.base_url}/v1/{'completions' if self.endpoint == 'completions' else 'chat/completions'}"

    def _body(self, req, max_tokens: int, style: str | None, stream: bool = True) -> dict:
        prompt = req.prompt if req.prompt is not None else req.prompt_ids
        body = {
            "model": self.served_model,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "stream": stream,
        }
        if self.endpoint == "completions":
            body["prompt"] = prompt
        else:
            body["messages"] = [
                {"role": "user", "content": prompt if isinstance(prompt, str) else str(prompt)}
            ]
        if stream:
            body["stream_options"] = {"include_usage": True}
        if style == "ignore_eos":
            body["ignore_eos"] = True
        elif style == "min_new_tokens":
            # min_new_tokens for generate(); eos_token_id -1 for its continuous batching, which
            # takes only max_new_tokens and eos_token_id from a request (transformers 5.25)
            body["generation_config"] = json.dumps(
                {"min_new_tokens": max_tokens, "eos_token_id": -1}
            )
        return body

    # --- the run ---------------------------------------------------------------------------------

    def serve(self, requests, records, feeder, stop) -> list:
        feeder.t0 = time.perf_counter()
        asyncio.run(self._run_all(requests, records, feeder, stop))
        return []  # the server's iterations are its own (vLLM exports them as Prometheus metrics)

    async def _run_all(self, requests, records, feeder, stop) -> None:
        import httpx

        limit = feeder.slots
        sem = asyncio.Semaphore(limit._value) if limit is not None else None
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            tasks = [
                asyncio.create_task(self._one(client, r, records[r.id], feeder, stop, sem))
                for r in sorted(requests, key=lambda r: r.arrival_s)
            ]
            await asyncio.gather(*tasks)
        feeder.finished.set()

    async def _one(self, client, req, rec, feeder, stop, sem) -> None:
        await asyncio.sleep(max(0.0, req.arrival_s - feeder.now()))
        if stop.is_set():
            rec.error = "stopped before it was sent"
            return
        if sem is not None:
            await sem.acquire()
        try:
            if stop.is_set():
                rec.error = "stopped before it was sent"
                return
            rec.sent_s = feeder.now()
            feeder.sent += 1
            await self._stream(client, req, rec, feeder, stop)
        except Exception as err:  # the server died, refused, timed out: keep the record, mark it
            rec.error = f"{type(err).__name__}: {err}"[:300] or type(err).__name__
            rec.end_s = rec.end_s or feeder.now()
        finally:
            if sem is not None:
                sem.release()

    async def _stream(self, client, req, rec, feeder, stop) -> None:
        body = self._body(req, req.max_tokens, self.eos_style)
        pieces, finished = [], False
        async with client.stream("POST", self._url(), json=body) as resp:
            if resp.status_code >= 400:
                text = (await resp.aread()).decode(errors="replace")[:200]
                raise ServerError(f"HTTP {resp.status_code}: {text}")
            async for line in resp.aiter_lines():
                if stop.is_set():
                    raise RuntimeError("stopped")
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    finished = True
                    break
                chunk = _json_chunk(data)
                finished = (
                    finished or _finish_reason(chunk) is not None
                )  # some servers send no [DONE]
                text = _chunk_text(chunk)
                if text:
                    rec.token_s.append(feeder.now())
                    pieces.append(text)
                _read_usage(chunk.get("usage"), req, rec)
        rec.end_s = feeder.now()
        rec.text = "".join(pieces)
        if not rec.output_len:
            rec.output_len = len(rec.token_s)
        if not rec.token_s:
            rec.error = "the server streamed no tokens"
        elif not finished:
            rec.error = (
                f"truncated: the stream ended without [DONE] or a finish_reason after "
                f"{len(rec.token_s)} chunks of text"
            )


USAGE_LIMIT = 10_000_000  # more prompt tokens than any served context holds


def _finish_reason(chunk: dict):
    """The first choice's finish_reason ("stop", "length", ...), None while the text goes on."""
    choices = chunk.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0].get("finish_reason")
    return None


def _json_chunk(data: str) -> dict:
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError as err:
        raise ServerError(f"the server sent a malformed chunk ({err.msg}): {data[:80]!r}") from None
    if not isinstance(chunk, dict):
        raise ServerError(f"the server sent a chunk that is not a JSON object: {data[:80]!r}")
    return chunk


def _read_usage(usage, req, rec) -> None:
    """The server's usage counts, checked: a whole number in range, else the request is an error
    (ServerError) and no figure of it is used."""
    if not usage:
        return
    if not isinstance(usage, dict):
        raise ServerError(f"the server's usage is not an object: {usage!r:.80}")
    for key, high, attr in (
        ("completion_tokens", req.max_tokens, "output_len"),
        ("prompt_tokens", USAGE_LIMIT, "input_len"),
    ):
        value = usage.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= high:
            raise ServerError(
                f"the server reported usage.{key}={value!r:.40}: not a whole number from 0 to "
                f"{high:,}" + (" (the max_tokens asked for)" if attr == "output_len" else "")
            )
        if value:
            setattr(rec, attr, value)


def _chunk_text(chunk: dict) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    c = choices[0]
    if "text" in c:
        return c.get("text") or ""
    return (c.get("delta") or {}).get("content") or ""
