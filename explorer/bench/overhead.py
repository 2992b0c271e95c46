"""What recording costs: a fully recording greedy Session vs transformers' generate(), timed alternately."""

from __future__ import annotations

import torch

from explorer.costs import noise
from explorer.costs.timing import Timer, alternate
from explorer.engine.prompt import eos_ids, pad_id
from explorer.engine.sampling import Sampling
from explorer.engine.session import Session
from explorer.engine.settings import check_int


def overhead_benchmark(
    lm,
    prompt_ids: list[int],
    *,
    new_tokens: int = 128,
    repeats: int = 5,
    warmup: int = 1,
    top_n: int = 20,
    quantile: float | None = None,
    clocks: noise.Clocks = noise.CLOCKS,
) -> dict:
    """Time transformers' generate() and a fully recording greedy Session, alternately, in this process.

    Both make exactly `new_tokens` tokens from the same prompt (generate with min_new_tokens, the
    Session with stop_at_eos=False). Repeats alternate the order (ABBA) so slow drift in a shared
    machine's load hits both alike. Returns each arm's Measurement as a dict (a low quantile, its
    spread, the interference), the ratio session / generate of the estimates, and the recording's
    share of a Session step: the part of its wall time outside the forward passes (sampling chain,
    recording, bookkeeping), the median over the timed runs.
    """
    check_int("new_tokens", new_tokens, 1)
    check_int("repeats", repeats, 1)
    dev = lm.device
    run_generate = _generate_run(lm, prompt_ids, new_tokens)
    run_session = _session_run(lm, prompt_ids, new_tokens, top_n)
    gen_out, session = (run_generate(), run_session()) if warmup else (None, None)
    arms = {"generate": run_generate, "session": run_session}
    kw = dict(warmup=warmup - 1, quantile=quantile, keep=True, clocks=clocks)
    times = alternate(arms, repeats, dev, **kw)
    g, s = times["generate"], times["session"]
    g.warmup = s.warmup = warmup
    out = {
        "model": lm.info.name,
        "device": str(dev),
        "dtype": lm.info.dtype,
        "threads": torch.get_num_threads(),
        "prompt_tokens": len(prompt_ids),
        "new_tokens": new_tokens,
        "repeats": repeats,
        "warmup": warmup,
        "top_n": top_n,
        "generate": g.to_dict(),
        "session": s.to_dict(),
        "ratio": s.estimate / g.estimate,
        "cpu_ratio": _cpu_ratio(s, g),
        "per_token_ms": {k: 1e3 * m.estimate / new_tokens for k, m in times.items()},
        "noisy": g.noisy or s.noisy,
        "recording_share": recording_share(s),
        **recording_cost(lm, prompt_ids, new_tokens, top_n),
        "session_forward_ms": None,
        "same_tokens": None,
    }
    if warmup:  # the warm-up runs' outputs: the Session's own forward time and the token check
        gen_tokens = gen_out[0, len(prompt_ids) :].tolist()
        out["session_forward_ms"] = 1e3 * sum(st.latency_s for st in session.steps) / new_tokens
        out["same_tokens"] = _same_until_eos(session.tokens, gen_tokens, eos_ids(lm))
    s.results.clear()
    return out


def _cpu_ratio(s, g) -> float | None:
    """Session / generate() in process CPU time over all timed runs: on a busy machine other work
    stretches the wall time, much less the CPU time a run needs (None without CPU times)."""
    cs, cg = s.usage.cpu_s, g.usage.cpu_s
    return cs / cg if cs and cg else None


def _session_run(lm, prompt_ids: list[int], new_tokens: int, top_n: int):
    """One arm: a fully recording greedy Session making exactly `new_tokens` tokens."""

    def run_session() -> Session:
        s = Session(
            lm, list(prompt_ids), Sampling(greedy=True),
            top_n=top_n, max_new_tokens=new_tokens, stop_at_eos=False,
        )  # fmt: skip
        s.run()
        return s

    return run_session


def recording_share(m) -> float | None:
    """The median over timed Session runs (m.results, m.samples) of 1 - forward time / wall time:
    the share of a step the Session spends outside its forward passes."""
    shares = [
        1 - sum(st.latency_s for st in run.steps) / wall
        for run, wall in zip(m.results, m.samples, strict=True)
        if wall > 0
    ]
    return noise.median(shares) if shares else None


class _TimedRecording(Session):
    """A Session whose recording part of every step (sampling chain, pick, Step built: its
    _record_pass) is timed in place with the one timing helper's Timer, beside the forward's."""

    recording_s: list[float]

    def _record_pass(self, *args):
        timer = Timer(self.device)
        with timer.region():
            out = super()._record_pass(*args)
        self.recording_s.append(timer.seconds)
        return out


def recording_cost(lm, prompt_ids: list[int], new_tokens: int, top_n: int) -> dict:
    """One more fully recording greedy Session, its recording part of each step timed in place
    (caches as cold as a real step leaves them, not a warm loop of its own): the medians over the
    decode steps of the recording and of the forward pass, and the recording's share of the two.
    Returns {"recording_ms", "forward_ms", "recording_step_share"}."""
    s = _TimedRecording(
        lm, list(prompt_ids), Sampling(greedy=True),
        top_n=top_n, max_new_tokens=new_tokens, stop_at_eos=False,
    )  # fmt: skip
    s.recording_s = []
    s.run()
    decode = slice(1, None) if len(s.steps) > 1 else slice(None)  # the prefill is another pass
    rec = noise.median(s.recording_s[decode])
    fwd = noise.median([st.latency_s for st in s.steps[decode]])
    return {
        "recording_ms": 1e3 * rec,
        "forward_ms": 1e3 * fwd,
        "recording_step_share": rec / (rec + fwd) if rec + fwd > 0 else None,
    }


def _generate_run(lm, prompt_ids: list[int], new_tokens: int):
    """A call of transformers' greedy generate() making exactly `new_tokens` tokens."""
    ids = torch.tensor([prompt_ids], device=lm.device)
    pad = pad_id(lm, eos_ids(lm))

    def run_generate():
        with torch.inference_mode():
            return lm.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=pad,
            )

    return run_generate


def _same_until_eos(ours: list[int], theirs: list[int], eos: set[int]) -> bool:
    """Greedy tokens agree up to the first EOS (generate's min_new_tokens masks EOS after that)."""
    n = next((i for i, t in enumerate(theirs) if t in eos), len(theirs))
    n = min(n, next((i for i, t in enumerate(ours) if t in eos), len(ours)))
    return ours[:n] == theirs[:n]
