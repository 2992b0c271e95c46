"""Does looking inside a step leave anything behind? Two copies of one model, timed alternately."""

from __future__ import annotations

import copy
import statistics

import torch

from explorer.costs.timing import alternate
from explorer.engine.sampling import Sampling
from explorer.engine.session import Session
from explorer.engine.settings import check_int
from explorer.inside import hook_count
from explorer.model.loader import LoadedModel


def inside_benchmark(
    lm, prompt_ids: list[int], *, new_tokens: int = 32, repeats: int = 7, warmup: int = 1
) -> dict:
    """Does looking inside a step leave anything behind? Two identical copies of the model, timed
    alternately (ABBA) in this process: `plain` never sees a hook; `inside` runs the logit lens, the
    attention view and profile_step() before each of its runs. Both then make `new_tokens` greedy
    tokens through a normal Session; per-token time is the median over repeats of the Steps' own
    forward latencies. Returns both medians, their ratio, and the hook counts left on each model."""
    check_int("new_tokens", new_tokens, 1)
    check_int("repeats", repeats, 1)
    twin = LoadedModel(model=copy.deepcopy(lm.model), tokenizer=lm.tokenizer, info=lm.info)
    arms = {"plain": lm, "inside": twin}

    def session(which: str) -> Session:
        return Session(
            arms[which], list(prompt_ids), Sampling(greedy=True),
            max_new_tokens=new_tokens + 1, stop_at_eos=False,
        )  # fmt: skip

    def run(which: str) -> float:
        if which == "inside":
            looked = session(which)
            looked.step()
            looked.step()
            looked.logit_lens()
            looked.attention()
            looked.profile_step(repeats=1)
        s = session(which)
        s.run()
        return statistics.median(st.latency_s for st in s.steps if st.phase == "decode")

    per_token = alternate(
        {"plain": lambda: run("plain"), "inside": lambda: run("inside")},
        repeats, lm.device, warmup=warmup, own_figure=True,
    )  # fmt: skip
    plain, inside = per_token["plain"], per_token["inside"]
    return {
        "model": lm.info.name,
        "device": str(lm.device),
        "dtype": lm.info.dtype,
        "threads": torch.get_num_threads(),
        "new_tokens": new_tokens,
        "repeats": repeats,
        "warmup": warmup,
        "plain": plain.to_dict(),
        "inside": inside.to_dict(),
        "ratio": inside.estimate / plain.estimate,
        "noisy": plain.noisy or inside.noisy,
        "hooks_left": {k: hook_count(v.model) for k, v in arms.items()},
    }
