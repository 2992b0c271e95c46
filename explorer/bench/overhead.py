"""What recording costs: a fully recording greedy Session vs transformers' generate(), timed alternately."""

from __future__ import annotations

import torch

from explorer.costs.timing import Measurement, Timer, alternate, synchronize, time_call
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
) -> dict:
    """Time transformers' generate() and a fully recording greedy Session, alternately, in this process.

    Both make exactly `new_tokens` tokens from the same prompt (generate with min_new_tokens, the
    Session with stop_at_eos=False). Repeats alternate the order (ABBA) so slow drift in a shared
    machine's load hits both alike. Returns medians and the ratio session / generate.
    """
    check_int("new_tokens", new_tokens, 1)
    check_int("repeats", repeats, 1)
    dev = lm.device
    run_generate = _generate_run(lm, prompt_ids, new_tokens)

    def run_session() -> Session:
        s = Session(
            lm, list(prompt_ids), Sampling(greedy=True),
            top_n=top_n, max_new_tokens=new_tokens, stop_at_eos=False,
        )  # fmt: skip
        s.run()
        return s

    for _ in range(warmup):
        gen_out, session = run_generate(), run_session()
    synchronize(dev)
    times = alternate(
        {
            "generate": lambda: time_call(run_generate, dev)[1],
            "session": lambda: time_call(run_session, dev)[1],
        },
        repeats,
    )
    method = Timer(dev).method
    g = Measurement(times["generate"], warmup=warmup, method=method)
    s = Measurement(times["session"], warmup=warmup, method=method)
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
        "ratio": s.median / g.median,
        "per_token_ms": {
            "generate": 1e3 * g.median / new_tokens,
            "session": 1e3 * s.median / new_tokens,
        },
        "session_forward_ms": None,
        "same_tokens": None,
    }
    if warmup:  # the warm-up runs' outputs: the Session's own forward time and the token check
        gen_tokens = gen_out[0, len(prompt_ids) :].tolist()
        out["session_forward_ms"] = 1e3 * sum(st.latency_s for st in session.steps) / new_tokens
        out["same_tokens"] = _same_until_eos(session.tokens, gen_tokens, eos_ids(lm))
    return out


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
