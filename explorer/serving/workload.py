"""Workloads: who asks for what, and when -- plain data, seeded, JSON / JSONL round trip.

    w = Workload(num_prompts=32, arrival="poisson", request_rate=4.0, input_len=64, output_len=32)
    reqs = w.requests(lm)               # [Request(id, prompt_ids, max_tokens, arrival_s), ...]
    w.save("w.json"); Workload.load("w.json")
    save_requests("trace.jsonl", reqs); Workload.from_jsonl("trace.jsonl")   # replay a real trace

Arrivals follow `vllm bench serve`: "burst" (all at t=0, vLLM's --request-rate inf), "fixed"
(every 1/rate s), "poisson" (exponential gaps, mean 1/rate), "gamma" (gamma gaps with shape =
burstiness and mean 1/rate: burstiness 1 is Poisson, < 1 burstier, > 1 more regular). A closed
loop is max_concurrency=C on top of any arrival process (C requests in flight at most; the next is
sent when one finishes), as vLLM's --max-concurrency. Lengths are "fixed" (the value),
"uniform" (value x [1 - spread, 1 + spread]) or "lognormal" (median value, sigma = spread).
Prompts are cut from a text that ships with Python (pydoc's topic help), so nothing downloads;
with a tokenizer, a prompt's ids are exactly what the tokenizer makes of its text (special tokens
such as BOS included), so a server that takes the text sees the same ids as the local engines.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

ARRIVALS = ("burst", "fixed", "poisson", "gamma")
LENGTHS = ("fixed", "uniform", "lognormal")


@dataclass
class Request:
    """One request of a workload: prompt token ids, how many tokens it asks for, when it arrives."""

    id: str
    prompt_ids: list[int]
    max_tokens: int
    arrival_s: float = 0.0  # seconds after the run starts
    prompt: str | None = None  # the text, when it came from one

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class WorkloadError(ValueError):
    """A workload setting or file that cannot be used (the message names which and why)."""


@dataclass
class Workload:
    """How many requests, how they arrive, how long their prompts and outputs are (seeded)."""

    num_prompts: int = 16
    arrival: str = "burst"
    request_rate: float | None = None  # requests/s for fixed / poisson / gamma
    burstiness: float = 1.0  # gamma shape (1 = Poisson)
    max_concurrency: int | None = None  # closed loop: at most this many in flight
    input_len: int = 32
    input_dist: str = "fixed"
    input_spread: float = 0.0
    output_len: int = 32
    output_dist: str = "fixed"
    output_spread: float = 0.0
    shared_prefix_fraction: float = 0.0  # this fraction of requests starts with the same prefix
    shared_prefix_len: int = 0  # tokens of that prefix (part of input_len)
    ignore_eos: bool = True  # outputs are as long as asked
    seed: int = 0
    requests_override: list[dict] | None = field(default=None, repr=False)  # a replayed trace

    def __post_init__(self):
        self.check()

    def check(self) -> None:
        if self.requests_override is not None:
            if not isinstance(self.requests_override, list) or not self.requests_override:
                raise WorkloadError("requests_override must be a non-empty list of requests")
            self.requests_override = [
                _check_row(row, f"request {i}") for i, row in enumerate(self.requests_override)
            ]
            return
        _at_least("num_prompts", self.num_prompts, 1)
        if self.arrival not in ARRIVALS:
            raise WorkloadError(
                f"arrival must be one of {', '.join(ARRIVALS)}, got {self.arrival!r}"
            )
        if self.arrival != "burst":
            if self.request_rate is None or not self.request_rate > 0:  # NaN too
                raise WorkloadError(
                    f"request rate must be > 0 requests/s for {self.arrival} arrivals, got {self.request_rate}"
                )
        if self.arrival == "gamma" and not (_finite(self.burstiness) and self.burstiness > 0):
            raise WorkloadError(f"burstiness must be > 0, got {self.burstiness}")
        if self.max_concurrency is not None:
            _at_least("max concurrency", self.max_concurrency, 1)
        for what in ("input", "output"):
            _at_least(f"{what} length", getattr(self, f"{what}_len"), 1)
            dist = getattr(self, f"{what}_dist")
            if dist not in LENGTHS:
                raise WorkloadError(
                    f"{what}_dist must be one of {', '.join(LENGTHS)}, got {dist!r}"
                )
            spread = getattr(self, f"{what}_spread")
            if not _finite(spread) or spread < 0:
                raise WorkloadError(f"{what}_spread must be a finite number >= 0, got {spread!r}")
        if not 0 <= self.shared_prefix_fraction <= 1:
            raise WorkloadError("shared_prefix_fraction must be between 0 and 1")
        if self.shared_prefix_fraction > 0 and not 0 < self.shared_prefix_len < self.input_len:
            raise WorkloadError(
                f"shared_prefix_len must be between 1 and input_len - 1 ({self.input_len - 1}), "
                f"got {self.shared_prefix_len}"
            )

    # --- what it asks for ------------------------------------------------------------------------

    def requests(self, lm=None, vocab_size: int | None = None) -> list[Request]:
        """The requests, the same every time for the same settings and seed.

        lm: a LoadedModel (its tokenizer cuts prompts from the offline corpus); without a tokenizer
        the prompts are seeded random token ids below vocab_size."""
        if self.requests_override is not None:
            return [_replayed(i, r, lm) for i, r in enumerate(self.requests_override)]
        _check_memory(self.num_prompts, self.num_prompts * self.input_len, "num_prompts")
        rng = random.Random(self.seed)
        arrivals = self.arrival_times(rng)
        ins = [self._length(rng, "input") for _ in range(self.num_prompts)]
        outs = [self._length(rng, "output") for _ in range(self.num_prompts)]
        self._check_lengths(ins, outs, lm)  # before any prompt is built
        source = _PromptSource(lm, vocab_size, rng)
        prefix = source.take(self.shared_prefix_len) if self.shared_prefix_fraction else []
        n_shared = round(self.shared_prefix_fraction * self.num_prompts)
        out = []
        for i in range(self.num_prompts):
            head = prefix if i < n_shared else []
            ids, text = source.prompt(head + source.take(max(1, ins[i] - len(head))), ins[i])
            out.append(Request(f"req-{i}", ids, outs[i], arrivals[i], text))
        return out

    def _check_lengths(self, ins: list[int], outs: list[int], lm) -> None:
        """Sampled lengths within the model's context, and their prompts within memory."""
        limit = lm.info.max_positions if lm is not None else 0
        for i, (n_in, n_out) in enumerate(zip(ins, outs)):
            if limit and n_in + n_out > limit:
                raise WorkloadError(
                    f"request {i} samples {n_in:,} prompt + {n_out:,} new tokens, more than "
                    f"{lm.info.name}'s context of {limit:,} positions (input {self.input_dist} "
                    f"spread {self.input_spread}, output {self.output_dist} spread "
                    f"{self.output_spread}): lower the lengths or their spread"
                )
        _check_memory(len(ins), sum(ins), "the sampled prompt lengths")

    def arrival_times(self, rng: random.Random | None = None) -> list[float]:
        """Seconds after the start at which each request is sent (before any concurrency limit)."""
        rng = rng or random.Random(self.seed)
        n, t, times = self.num_prompts, 0.0, []
        for _ in range(n):
            times.append(t)
            t += self._gap(rng)
        return times

    def _gap(self, rng: random.Random) -> float:
        if self.arrival == "burst":
            return 0.0
        mean = 1.0 / self.request_rate
        if self.arrival == "fixed":
            return mean
        if self.arrival == "poisson":
            return rng.expovariate(self.request_rate)
        return rng.gammavariate(self.burstiness, mean / self.burstiness)  # gamma: mean 1/rate

    def _length(self, rng: random.Random, what: str) -> int:
        value, dist = getattr(self, f"{what}_len"), getattr(self, f"{what}_dist")
        spread = getattr(self, f"{what}_spread")
        if dist == "uniform":
            value = rng.uniform(value * (1 - spread), value * (1 + spread))
        elif dist == "lognormal":
            value = math.exp(min(rng.gauss(math.log(value), spread), 700.0))  # no overflow
        return max(1, round(value))

    # --- files -----------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Workload:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise WorkloadError(f"unknown workload fields: {', '.join(sorted(unknown))}")
        try:
            return cls(**data)
        except TypeError as err:  # a comparison of a field of the wrong type
            raise WorkloadError(f"a workload field has the wrong type ({err})") from None

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path) -> Workload:
        path = Path(path)
        if path.suffix == ".jsonl":
            return cls.from_jsonl(path)
        try:
            data = json.loads(_text_of(path))
        except json.JSONDecodeError as err:
            raise WorkloadError(f"{path}: not JSON ({err.msg} at line {err.lineno})") from None
        if not isinstance(data, dict):
            raise WorkloadError(
                f"{path}: expected a JSON object of workload fields, got a JSON "
                f"{type(data).__name__} (a trace of requests is a .jsonl file, one per line)"
            )
        try:
            return cls.from_dict(data)
        except WorkloadError as err:
            raise WorkloadError(f"{path}: {err}") from None

    @classmethod
    def from_jsonl(cls, path, ignore_eos: bool = True) -> Workload:
        """A replayed trace: one {"prompt": text or [ids], "max_tokens": N, "arrival_s": t} per line."""
        rows = []
        for n, line in enumerate(_text_of(Path(path)).splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise WorkloadError(f"{path}, line {n}: not JSON ({err.msg})") from None
            rows.append(_check_row(row, f"{path}, line {n}"))
        if not rows:
            raise WorkloadError(f"{path}: no requests in the file")
        return cls(num_prompts=len(rows), ignore_eos=ignore_eos, requests_override=rows)


def save_requests(path, requests: list[Request]) -> None:
    """Write requests as JSONL ({"prompt": ids, "max_tokens", "arrival_s"} per line): a replayable trace."""
    lines = [
        json.dumps({"prompt": r.prompt_ids, "max_tokens": r.max_tokens, "arrival_s": r.arrival_s})
        for r in requests
    ]
    Path(path).write_text("\n".join(lines) + "\n")


# modelled bytes a request holds in Python while it is built and served (Request, RequestRecord,
# its lists and floats), and per prompt token (a list slot and, for random ids, an int object)
REQUEST_BYTES, TOKEN_BYTES = 1024, 40


def _check_memory(n_requests: int, n_tokens: int, what: str) -> None:
    """WorkloadError before building requests that would not fit the machine's memory."""
    from explorer.model.device import available_bytes
    from explorer.model.memory import HEADROOM, gib

    need = n_requests * REQUEST_BYTES + n_tokens * TOKEN_BYTES
    free = available_bytes("cpu")
    if free is not None and need > HEADROOM * free:
        raise WorkloadError(
            f"{what}: {n_requests:,} requests of {n_tokens:,} prompt tokens in all need "
            f"{gib(need)} (modelled) to build, this machine has {gib(free)} available; "
            "ask for fewer prompts or shorter ones"
        )


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _at_least(name: str, value, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise WorkloadError(f"{name} must be a whole number >= {low}, got {value!r}")


MAX_ARRIVAL_S = 7 * 24 * 3600.0  # a replayed trace longer than a week is a unit mistake
MAX_TOKENS = 10_000_000


def _text_of(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise WorkloadError(
            f"{path}: not UTF-8 text (byte {err.start}: {err.reason}); save it as UTF-8 JSON"
        ) from None


def _check_row(row, where: str) -> dict:
    """One replayed request, each field checked: type, finite, in range (the message says where)."""
    if not isinstance(row, dict) or "prompt" not in row:
        raise WorkloadError(f"{where}: expected an object with a 'prompt', got {str(row)[:60]}")
    prompt = row["prompt"]
    ids_ok = isinstance(prompt, list) and all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt
    )
    if not ((isinstance(prompt, str) or ids_ok) and prompt):
        raise WorkloadError(
            f"{where}: 'prompt' must be non-empty text or a list of token ids (whole numbers "
            f">= 0), got {str(prompt)[:60]}"
        )
    max_tokens = row.get("max_tokens", 32)
    if (
        not isinstance(max_tokens, int)
        or isinstance(max_tokens, bool)
        or not 1 <= max_tokens <= MAX_TOKENS
    ):
        raise WorkloadError(
            f"{where}: 'max_tokens' must be a whole number >= 1 and <= {MAX_TOKENS:,}, got "
            f"{max_tokens!r}"
        )
    arrival = row.get("arrival_s", 0.0)
    if not _finite(arrival) or not 0 <= arrival <= MAX_ARRIVAL_S:
        raise WorkloadError(
            f"{where}: 'arrival_s' must be a number >= 0 and <= {MAX_ARRIVAL_S:,.0f} s (a "
            f"week), got {arrival!r}"
        )
    return {"prompt": prompt, "max_tokens": max_tokens, "arrival_s": float(arrival)}


def _replayed(i: int, row: dict, lm) -> Request:
    prompt = row["prompt"]
    if isinstance(prompt, str):
        if lm is None or lm.tokenizer is None:
            raise WorkloadError("a workload with text prompts needs a model with a tokenizer")
        return Request(
            f"req-{i}",
            lm.tokenizer(prompt)["input_ids"],
            row["max_tokens"],
            row["arrival_s"],
            prompt,
        )
    return Request(f"req-{i}", list(prompt), row["max_tokens"], row["arrival_s"])


class _PromptSource:
    """Token ids cut in order from pydoc's topic help (ships with CPython), or seeded random ids."""

    def __init__(self, lm, vocab_size: int | None, rng: random.Random):
        self.tok = getattr(lm, "tokenizer", None) if lm is not None else None
        self.rng = rng
        self.pos = 0
        if self.tok is not None:
            self.stream = _corpus_ids(self.tok)
            self.pos = rng.randrange(len(self.stream))
        else:
            self.vocab = vocab_size or (lm.info.vocab_size if lm is not None else 1000)

    def take(self, n: int) -> list[int]:
        if self.tok is None:
            return [self.rng.randrange(1, self.vocab) for _ in range(n)]
        out = []
        while len(out) < n:
            chunk = self.stream[self.pos : self.pos + n - len(out)]
            out += chunk
            self.pos = (self.pos + len(chunk)) % len(self.stream)
        return out

    def prompt(self, ids: list[int], n: int) -> tuple[list[int], str | None]:
        """(ids, text) with ids == tokenizer(text): what a server that takes text would see too
        (its special tokens included), about n tokens long (the cut ends on a token boundary)."""
        if self.tok is None:
            return ids, None
        raw = list(ids)
        for _ in range(4):
            text = self.tok.decode(raw)
            got = self.tok(text, verbose=False)["input_ids"]
            if len(got) <= n or len(raw) <= 1:
                return got, text
            raw = raw[: len(raw) - (len(got) - n)]
        return got, text


_CORPUS_IDS: dict[int, list[int]] = {}


def _corpus_ids(tok) -> list[int]:
    """The corpus as this tokenizer's ids (tokenized once per tokenizer)."""
    if id(tok) not in _CORPUS_IDS:
        from pydoc_data.topics import topics

        text = "\n\n".join(topics[k] for k in sorted(topics))[:200_000]
        _CORPUS_IDS[id(tok)] = tok(text, verbose=False)["input_ids"]
    return _CORPUS_IDS[id(tok)]
