"""The optimisation ladder: each rung run on the same prompt, its speed beside what it costs in quality.

    df = sweeps.run("ladder", lm, batches=[1, 8], new_tokens=64)

Rungs (RUNGS): the eager baseline (the loaded model, DynamicCache), a static cache, static +
torch.compile, bf16 and fp16 casts, int8 weights through torch's fbgemm kernels and through
torchao, int4 (torchao, CUDA), int8 + static + compile together, a quantized KV cache (transformers'
QuantizedCache: fp8 on torch alone, int4 through optimum-quanto or HQQ), prompt-lookup decoding,
and prefix caching (a time-to-first-token rung). Every rung is a real Session (or SpeculativeSession)
with the engine options of explorer.engine.options, so what the table says is what a student can
step through in the dashboard.

Speed is measured: a low quantile (explorer.costs.noise, with its spread and noisy mark) of the
decode Step latencies over `new_tokens` greedy tokens (after a
warm-up Session of the same shape and, for compiled rungs, after the compile, whose time is
`compile_s`, never inside ms_per_token). Bytes are modelled from each part's real bytes per weight
(explorer.costs), so pct_of_copy_bw is modelled bytes / measured time / the measured copy
bandwidth. Quality: greedy tokens against the baseline's (the first divergence), the largest
logit difference teacher-forced over the baseline's tokens, and perplexity on the bundled models'
held-out text (explorer.model.corpus); a random-weight shape (arch:) has no meaningful perplexity
and says so. A KV-cache rung's perplexity is scored through its cache (the text fed in pieces of
KV_PIECE tokens, each attending to the cached, quantized K/V of the ones before), since a forward
without a cache never reads one. A rung this machine cannot run is a row with `skipped` = the reason.
"""

from __future__ import annotations

import statistics
import threading
import warnings
from collections.abc import Iterable

import pandas as pd
import torch

from explorer.costs import hardware
from explorer.engine.options import CacheNotSupportedError, cache_kv_dtype
from explorer.model.loader import LoadedModel, with_weights
from explorer.model.quant import WeightsNotSupportedError
from explorer.sweeps import Param, Sweep, register
from explorer.sweeps._common import (
    NOISE_COLUMNS,
    Bar,
    Progress,
    check_count,
    frame,
    from_steps,
    measure_points,
    noise_columns,
    sizes,
)
from explorer.sweeps._common import attrs as sweep_attrs

PROMPT = "The built-in function len() returns the number of items in a container, and"

# rung -> Session options (explorer.engine.options); "lookup" and "prefix" run their own machinery
RUNGS: dict[str, dict] = {
    "eager": {},
    "static": {"cache": "static"},
    "static+compile": {"cache": "static", "compile": True},
    "bf16": {"weights": "bf16"},
    "fp16": {"weights": "fp16"},
    "int8:fbgemm": {"weights": "int8:fbgemm"},
    "int8:torchao": {"weights": "int8:torchao"},
    "int4": {"weights": "int4"},
    "int8+static+compile": {"weights": "int8", "cache": "static", "compile": True},
    "kv fp8": {"cache": "fp8"},
    "kv int4:quanto": {"cache": "int4:quanto"},
    "kv int4:hqq": {"cache": "int4:hqq"},
    "prompt lookup": {"lookup": True},
    "prefix cache": {"prefix": True},
}

COLUMNS = [
    "rung",
    "batch",
    "weights",
    "ms_per_token",
    "tokens_per_s_total",
    "ttft_ms",
    "bytes_per_step",
    "bytes_per_token",
    "achieved_gbps",
    "pct_of_copy_bw",
    "speedup",
    "speedup_of",
    "greedy_equal",
    "first_divergence",
    "max_abs_logit_diff",
    "perplexity",
    "memory_bytes",
    "compile_s",
    "recompiles",
    "skipped",
    *NOISE_COLUMNS,
]

WARMUP_TOKENS = 4  # decode steps of the untimed warm-up Session of each rung
PERPLEXITY_TOKENS = 2048  # held-out tokens scored per weights setting
KV_PIECE = 64  # tokens per forward when a KV-cache rung's perplexity is scored through its cache


def _rung_names(rungs: Iterable[str] | None) -> list[str]:
    """The rungs asked for (all by default), checked, with the eager baseline first when missing."""
    names = list(RUNGS) if rungs is None else [r.strip() for r in rungs]
    for name in names:
        if name not in RUNGS:
            raise ValueError(f"unknown rung {name!r}; the rungs are {', '.join(RUNGS)}")
    if "eager" not in names:
        names.insert(0, "eager")  # the baseline every speedup and quality figure compares against
    return names


def run(
    lm: LoadedModel,
    *,
    rungs: Iterable[str] | None = None,
    batches: Iterable[int] = (1,),
    new_tokens: int = 64,
    repeats: int = 1,
    prompt: str | list[int] | None = None,
    progress: Progress | None = None,
    bar: bool = True,
    stop: threading.Event | None = None,
) -> pd.DataFrame:
    """One row per (batch, rung): see the module docstring. repeats: timed Sessions per rung (the
    estimate is over all their decode Steps)."""
    names = _rung_names(rungs)
    batch_sizes = sizes("batches", batches)
    check_count("new_tokens", new_tokens, 2)
    check_count("repeats", repeats)
    ids = _prompt_ids(lm, prompt)
    limit = lm.info.max_positions
    if limit and len(ids) + new_tokens > limit:
        raise ValueError(
            f"the prompt ({len(ids)} tokens) + new_tokens ({new_tokens}) exceed "
            f"{lm.info.name}'s {limit} positions"
        )
    peaks = hardware.measure(lm.device, lm.info.dtype)
    copy_gbps = peaks.copy_gbps or peaks.bandwidth_gbps
    notes: list[str] = []
    ladder = _Ladder(lm, ids, new_tokens, repeats, copy_gbps, notes)
    points = [(b, r) for b in batch_sizes for r in names]
    progress_bar = Bar(len(points), "ladder", progress, bar)

    def point(p):
        row = ladder.row(*p)
        progress_bar.update()
        return row

    try:
        rows = measure_points(
            points, point, notes, label=lambda p: f"{p[1]} at batch {p[0]}", stop=stop
        )
    finally:
        progress_bar.close()
    if not _meaningful_perplexity(lm):
        notes.append(
            f"perplexity: null, {lm.info.name} has random weights (an architecture shape): "
            "its perplexity would measure nothing"
        )
    extra = {
        "prompt_tokens": len(ids),
        "new_tokens": new_tokens,
        "copy_gbps": copy_gbps,
        "perplexity_text": _perplexity_text(lm),
        "rungs": {r: RUNGS[r] for r in names},
    }
    return frame(
        rows,
        COLUMNS,
        sweep_attrs("ladder", lm, peaks, notes, COLUMNS, repeats=repeats, warmup=1, **extra),
    )


class _Ladder:
    """The baseline's tokens and logits, and the perplexity of each weights setting, shared by rungs."""

    def __init__(self, lm, ids, new_tokens, repeats, copy_gbps, notes):
        self.lm, self.ids, self.new_tokens, self.repeats = lm, ids, new_tokens, repeats
        self.copy_gbps, self.notes = copy_gbps, notes
        self.base: dict[int, dict] = {}  # batch -> the eager row (with _tokens and _logits)
        self.ppl: dict[tuple, float | None] = {}

    def row(self, batch: int, rung: str) -> dict:
        options = RUNGS[rung]
        row = {"rung": rung, "batch": batch, "skipped": None, "speedup_of": "ms_per_token"}
        try:
            if "lookup" in options:
                got = self._lookup(batch)
            elif "prefix" in options:
                got = self._prefix(batch)
            else:
                got = self._session_rung(batch, options)
        except (WeightsNotSupportedError, CacheNotSupportedError, _Skip) as why:
            return {**row, "skipped": str(why)}
        row.update(got)
        if rung == "eager":
            self.base[batch] = row
        of, base = row["speedup_of"], self.base[batch]
        if "speedup" not in row and row.get(of) and base.get(of):
            row["speedup"] = base[of] / row[of]  # the prefix rung brings its own (same prompt)
        if row.get("tokens_per_s_total") and row.get("bytes_per_token"):
            row["achieved_gbps"] = row["bytes_per_token"] * row["tokens_per_s_total"] / 1e9
            row["pct_of_copy_bw"] = 100.0 * row["achieved_gbps"] / self.copy_gbps
        return row

    # --- the Session rungs: eager, static, compile, dtypes, int8, int4 ---

    def _session_rung(self, batch: int, options: dict) -> dict:
        from explorer.engine.sampling import Sampling
        from explorer.engine.session import Session

        weights = options.get("weights")
        lm = with_weights(self.lm, weights) if weights else self.lm  # skips: WeightsNotSupported

        def session(**extra):
            return Session(
                lm,
                self.ids,
                Sampling(greedy=True),
                batch_size=batch,
                max_new_tokens=self.new_tokens,
                stop_at_eos=False,
                top_n=1,
                cache=options.get("cache", "dynamic"),
                compile=options.get("compile", False),
                **extra,
            )

        compiled = self._warm_up(session, lm, options)
        cuda = lm.device.type == "cuda"
        decode, ttft, tokens, logits, first = self._timed_runs(session, lm, cuda)
        last = first.steps[-1]
        timed = from_steps([st.latency_s for st in decode], [st.cpu_share for st in decode])
        ms = 1e3 * timed.estimate
        out = {
            "weights": lm.info.weights,
            "ms_per_token": ms,
            **noise_columns(timed),
            "tokens_per_s_total": batch * 1e3 / ms,
            "ttft_ms": 1e3 * statistics.median(ttft),
            "bytes_per_step": _step_bytes(last),
            "bytes_per_token": _step_bytes(last) / batch if last.bytes else None,
            "memory_bytes": (
                torch.cuda.max_memory_allocated(lm.device)
                if cuda
                else lm.info.weight_bytes + last.kv_cache_bytes
            ),
            "compile_s": compiled.get("compile_s") if compiled.get("active") else None,
            "recompiles": (sum(st.recompiles or 0 for st in first.steps[1:]) if compiled else None),
            "perplexity": self._perplexity(lm, _quantized(options.get("cache"))),
            "_tokens": tokens,  # for the rungs after the baseline (not a column)
            "_logits": logits,
        }
        if compiled and not compiled.get("active"):
            self.notes.append(f"{options}: compile fell back to eager: {compiled.get('reason')}")
        base = self.base.get(batch)
        if base is None:  # this is the baseline
            out.update(greedy_equal=True, first_divergence=None, max_abs_logit_diff=0.0)
        else:
            out.update(self._quality(tokens, logits, base, lambda: self._forced(session, base)))
        return out

    def _warm_up(self, session, lm, options: dict) -> dict:
        """One untimed run (the prefill and a few decode steps: compile happens here); its
        RuntimeWarnings become notes. Returns the trace's compile settings ({} without)."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RuntimeWarning)
            warm = session()
            warm.run(WARMUP_TOKENS + 1)
        for w in caught:
            if issubclass(w.category, RuntimeWarning):
                self.notes.append(f"{lm.info.weights} {options}: {w.message}")
        return warm.trace.settings.get("compile") or {}

    def _timed_runs(self, session, lm, cuda: bool) -> tuple:
        """`repeats` timed runs of new_tokens steps each: (decode steps, first-token latencies,
        the first run's tokens, its row-0 logits per step, the first run's Session)."""
        decode, ttft, tokens, logits, first = [], [], None, None, None
        for i in range(self.repeats):
            if cuda:
                torch.cuda.reset_peak_memory_stats(lm.device)
            s = session()
            step_logits = []
            for _ in range(self.new_tokens):
                s.step()
                if i == 0:
                    step_logits.append(s.distribution()["logits"])
            steps = s.steps
            ttft.append(steps[0].latency_s)
            decode.extend(steps[1:])
            if i == 0:
                tokens, logits, first = list(s.tokens), step_logits, s
        return decode, ttft, tokens, logits, first

    def _forced(self, session, base) -> list[torch.Tensor]:
        """Row 0's logits at every step with the baseline's tokens forced (teacher forcing)."""
        s = session()
        out = []
        for token in base["_tokens"]:
            s.choose(token)
            out.append(s.distribution()["logits"])
        return out

    @staticmethod
    def _quality(tokens, logits, base, forced) -> dict:
        diverge = next((i for i, (a, b) in enumerate(zip(tokens, base["_tokens"])) if a != b), None)
        if diverge is not None:
            logits = forced()  # its own free run left the baseline's path: teacher-force it
        diff = max(float((a - b).abs().max()) for a, b in zip(logits, base["_logits"]))
        return {
            "greedy_equal": diverge is None,
            "first_divergence": diverge,
            "max_abs_logit_diff": diff,
        }

    # --- prompt lookup (speculative, no draft model) and prefix caching ---

    def _lookup(self, batch: int) -> dict:
        from explorer.engine.drafts import PromptLookup
        from explorer.engine.sampling import Sampling
        from explorer.engine.speculative import SpeculativeSession

        if batch > 1:
            raise _Skip("prompt lookup runs one row (SpeculativeSession is batch 1)")

        def session():
            return SpeculativeSession(
                self.lm,
                PromptLookup(),
                self.ids,
                Sampling(greedy=True),
                k=4,
                max_new_tokens=self.new_tokens,
                record_steps=False,
                stop_at_eos=False,
            )

        session().run(WARMUP_TOKENS + 1)
        per_token, s = [], None
        for _ in range(self.repeats):
            s = session()
            s.run(self.new_tokens)
            later = s.rounds[1:]  # round 0 holds the prefill
            emitted = sum(len(r.tokens) for r in later)
            per_token.append(sum(r.wall_s for r in later) / max(emitted, 1))
        base = self.base[batch]
        tokens = list(s.tokens)[: self.new_tokens]
        diverge = next((i for i, (a, b) in enumerate(zip(tokens, base["_tokens"])) if a != b), None)
        stats = s.stats()
        self.notes.append(
            f"prompt lookup: {stats['accepted']} of {stats['tested']} tested proposals accepted, "
            f"{stats['mean_tokens_per_round']:.2f} tokens per round (one target pass each)"
        )
        verify = [
            r.verify_pass for r in s.rounds[1:] if r.verify_pass and r.verify_pass.get("bytes")
        ]
        emitted = sum(len(r.tokens) for r in s.rounds[1:])
        bytes_total = sum(sum(v["bytes"].values()) for v in verify)
        timed = from_steps(per_token)  # rounds' wall time per token: the spread decides
        ms = 1e3 * timed.estimate
        return {
            "weights": self.lm.info.weights,
            "ms_per_token": ms,
            **noise_columns(timed),
            "tokens_per_s_total": 1e3 / ms,
            "ttft_ms": None,  # its prefill feeds prompt[:-1] (the verify pass feeds the last)
            "bytes_per_step": bytes_total / len(verify) if verify else None,
            "bytes_per_token": bytes_total / emitted if verify and emitted else None,
            "greedy_equal": diverge is None,
            "first_divergence": diverge,
            "max_abs_logit_diff": None,
            "perplexity": self._perplexity(self.lm),
            "memory_bytes": None,
        }

    def _prefix(self, batch: int) -> dict:
        from explorer.engine.prefix import prefix_benchmark

        if batch > 1:
            raise _Skip(
                "prefix caching is measured as one request's TTFT (batch 1); many requests sharing "
                "a prefix are the serving lab's shared-prefix workload"
            )
        b = prefix_benchmark(self.lm, repeats=max(3, self.repeats))
        self.notes.append(
            f"prefix cache: {b['prefix_tokens']} of {b['prompt_tokens']} prompt tokens cached; "
            f"TTFT {1e3 * b['ttft_plain']['estimate_s']:.1f} ms without, "
            f"{1e3 * b['ttft_cached']['estimate_s']:.1f} ms with"
        )
        noisy = [b[k]["reason"] for k in ("ttft_plain", "ttft_cached") if b[k]["noisy"]]
        return {
            "weights": self.lm.info.weights,
            "ttft_ms": 1e3 * b["ttft_cached"]["estimate_s"],
            "noisy": bool(noisy),
            "noisy_reason": "; ".join(noisy),
            "speedup": b["speedup"],
            "speedup_of": "ttft_ms",
            "greedy_equal": None,
            "max_abs_logit_diff": b["max_abs_logit_diff"],
            "perplexity": self._perplexity(self.lm),
        }

    def _perplexity(self, lm, kv_cache: str | None = None) -> float | None:
        """Held-out perplexity of these weights (through `kv_cache`, a quantized cache type)."""
        if not _meaningful_perplexity(self.lm):
            return None
        key = (lm.info.weights, kv_cache)
        if key not in self.ppl:
            self.ppl[key] = perplexity(lm, heldout_ids(self.lm), kv_cache=kv_cache)
        return self.ppl[key]


def _quantized(cache: str | None) -> str | None:
    """The cache type when it stores K/V quantized (its perplexity is scored through it)."""
    return cache if cache_kv_dtype(cache) is not None else None


class _Skip(Exception):
    """A rung that does not apply here (its message is the row's `skipped`)."""


def _step_bytes(step) -> float | None:
    return float(sum(step.bytes.values())) if step.bytes else None


def _prompt_ids(lm, prompt) -> list[int]:
    from explorer.engine.prompt import encode

    if prompt is None:
        prompt = (
            PROMPT
            if lm.tokenizer is not None
            else [(7 * i) % lm.info.vocab_size for i in range(1, 17)]
        )
    return encode(lm, prompt)


def _meaningful_perplexity(lm) -> bool:
    return not lm.info.random_weights and lm.tokenizer is not None


def _perplexity_text(lm) -> str | None:
    if not _meaningful_perplexity(lm):
        return None
    where = (
        "held out of the bundled models' training"
        if lm.info.source == "bundled"
        else ("the bundled models' held-out text; a hub model may have trained on it")
    )
    return f"pydoc_data topics, {PERPLEXITY_TOKENS} tokens ({where}; explorer.model.corpus)"


def heldout_ids(lm, n_tokens: int = PERPLEXITY_TOKENS) -> list[int]:
    """The first n_tokens of the held-out documents, each followed by the tokenizer's EOS."""
    from explorer.model.corpus import heldout_documents

    tok, ids = lm.tokenizer, []
    for doc in heldout_documents():  # one at a time: no warning about the model's positions
        ids += tok(doc, add_special_tokens=False, verbose=False)["input_ids"]
        if tok.eos_token_id is not None:
            ids.append(tok.eos_token_id)
        if len(ids) >= n_tokens:
            break
    return ids[:n_tokens]


@torch.inference_mode()
def perplexity(lm, ids: list[int], chunk: int | None = None, kv_cache: str | None = None) -> float:
    """exp(mean next-token cross-entropy) of ids, scored in chunks of the model's positions (<= 256).
    kv_cache: a cache type (explorer.engine.options) each chunk is fed through in KV_PIECE pieces."""
    chunk = chunk or min(256, lm.info.max_positions or 256)
    total, count = 0.0, 0
    for start in range(0, len(ids) - 1, chunk):
        piece = torch.tensor([ids[start : start + chunk]], device=lm.device)
        if piece.shape[1] < 2:
            break
        logits = _chunk_logits(lm, piece, kv_cache).float()  # [1, T, V]
        loss = torch.nn.functional.cross_entropy(logits[0, :-1], piece[0, 1:], reduction="sum")
        total, count = total + float(loss), count + piece.shape[1] - 1
    return float(torch.exp(torch.tensor(total / count)))


def _chunk_logits(lm, piece: torch.Tensor, kv_cache: str | None) -> torch.Tensor:
    """Logits of every position of `piece` [1, T]: one forward, or KV_PIECE tokens at a time
    through a fresh `kv_cache` (so later tokens read the earlier ones' cached K/V)."""
    if kv_cache is None:
        return lm.model(input_ids=piece).logits
    from explorer.engine.options import new_cache

    cache, out = new_cache(kv_cache, lm.model, None), []
    for i in range(0, piece.shape[1], KV_PIECE):
        part = piece[:, i : i + KV_PIECE]
        out.append(lm.model(input_ids=part, cache=cache, use_cache=True).logits)
    return torch.cat(out, dim=1)


SWEEP = register(
    Sweep(
        name="ladder",
        title="optimisation ladder",
        run=run,
        columns=COLUMNS,
        order=45,
        help="each rung (static cache, compile, bf16, int8, int4, fp8 KV cache, prompt lookup, "
        "prefix cache) on one prompt",
        params=(
            Param("batches", "ints", "batches", "1", "batch sizes, e.g. 1,8"),
            Param("new_tokens", "int", "new tokens", "64", "greedy tokens per rung", low=2),
            Param("rungs", "names", "rungs", None, "a subset of " + ", ".join(RUNGS)),
            Param("repeats", "int", "repeats", "1", "timed Sessions per rung"),
        ),
    )
)
