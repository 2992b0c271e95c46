"""Speculative decoding measured side by side: against the target alone, prompt lookup against plain
decoding, and the pass-cost ratio c that the speedup theory (explorer.costs.speculation) takes.

Each compares two things measured alternately in one process after warm-up; tests check that the
outputs agree (greedy speculative decoding equals target-only decoding), never the speeds.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from transformers import DynamicCache

from explorer.costs import hardware, noise
from explorer.costs.speculation import breakeven_alpha, expected_speedup
from explorer.costs.timing import alternate
from explorer.engine.drafts import PromptLookup, check_k, vocab_size
from explorer.engine.prompt import encode, eos_ids
from explorer.engine.rounds import Round, round_stats, timed_forward
from explorer.engine.sampling import Sampling, choose_token, make_generator
from explorer.engine.session import Session
from explorer.engine.settings import check_int
from explorer.engine.speculative import SpeculativeSession, final_probs
from explorer.model.loader import LoadedModel
from explorer.model.passes import crop_cache, forward


def decode_target_only(
    target: LoadedModel, prompt_ids: list[int], n_tokens: int, sampling: Sampling
) -> tuple[list[int], list[float]]:
    """Plain cached decoding with the target alone, set up like a SpeculativeSession (prompt[:-1] prefilled,
    then one 1-token pass per new id). Returns (ids, per-pass decode latencies in seconds; prefill excluded)."""
    gen = make_generator(sampling.seed)
    cache, ids, lat = DynamicCache(), list(prompt_ids), []
    if len(ids) > 1:
        timed_forward(target, ids[:-1], cache, last_only=True)
    eos = eos_ids(target)
    for _ in range(n_tokens):
        logits, sec = timed_forward(target, ids[-1:], cache, last_only=True)
        _, stages = final_probs(logits[:, -1], ids, sampling)
        ids.append(int(choose_token(stages[-1][1], sampling.is_greedy, gen).tokens[0]))
        lat.append(sec)
        if ids[-1] in eos:
            break
    return ids[len(prompt_ids) :], lat


def _estimate(xs: list[float]) -> float | None:
    """The one estimator (explorer.costs.noise): a low quantile of the samples, None for none."""
    return noise.low_quantile(xs, noise.quantile_for(len(xs))) if xs else None


def benchmark(
    target: LoadedModel,
    draft: LoadedModel,
    prompt: str | list[int],
    sampling: Sampling,
    ks=range(1, 9),
    *,
    n_tokens: int = 48,
    repeats: int = 3,
) -> list[dict[str, Any]]:
    """Per k: alpha, mean accepted length, predicted and measured speedup against target-only decoding of the
    same length, in the same run (each repeat runs baseline and speculative back to back, k by k).

    Measured speedup = (target-only decode time per token) / (speculative time per token), both over the timed
    forward passes only (device-synchronised perf_counter; prefill excluded); `measured_wall` also counts the
    sampling chain and bookkeeping of both. c = draft pass / target decode pass; v = verify pass /
    target decode pass, each a low quantile (explorer.costs.noise), all measured in this run.
    """
    ks = [check_k(k) for k in ks]
    ids = encode(target, prompt)
    names = ("rounds", "base", "base_tok", "spec", "base_wall", "spec_wall", "draft", "verify")
    per_k: dict[int, dict[str, list]] = {k: {name: [] for name in names} for k in ks}
    _warm_up(target, draft, ids)
    for rep in range(repeats):
        s = Sampling(**{**sampling.to_dict(), "seed": (sampling.seed or 0) + rep})
        for k in ks:
            acc = per_k[k]
            t0 = time.perf_counter()
            base_ids, base_lat = decode_target_only(target, ids, n_tokens, s)
            acc["base_wall"].append((time.perf_counter() - t0) / len(base_ids))
            acc["base"].extend(base_lat)
            acc["base_tok"].append(sum(base_lat) / len(base_lat))
            sess = SpeculativeSession(
                target, draft, ids, s, k=k, max_new_tokens=n_tokens, top_n=1, record_steps=False
            )
            t0 = time.perf_counter()
            sess.run(n_tokens)
            wall = time.perf_counter() - t0 - sum(_prefill_s(r) for r in sess.rounds)
            acc["spec_wall"].append(wall / len(sess.tokens))
            acc["spec"].append(sum(r.draft_s + r.verify_s for r in sess.rounds) / len(sess.tokens))
            acc["rounds"].extend(sess.rounds)
            acc["draft"].extend(
                p["latency_s"] for r in sess.rounds for p in r.draft_passes if p["tokens_fed"] == 1
            )
            acc["verify"].extend(
                r.verify_s for r in sess.rounds if r.verify_pass["tokens_fed"] == k + 1
            )
    return [_bench_row(k, per_k[k], sampling, n_tokens, repeats, target) for k in ks]


LOOKUP_PROMPTS = {  # offline; "repetitive" is the case prompt lookup is made for
    "repetitive (code)": (
        "import os\nimport sys\nimport re\nimport json\nimport time\nimport math\n"
        "import os\nimport sys\nimport re\nimport"
    ),
    "repetitive (list)": (
        "red, green, blue, red, green, blue, red, green, blue, red, green, blue, red,"
    ),
    "prose": (
        "The quick brown fox jumps over the lazy dog while the sun sets behind the hills, and"
    ),
}


def lookup_benchmark(
    lm: LoadedModel,
    prompts: dict[str, str | list[int]] | None = None,
    *,
    k: int = 4,
    ngram: int = 3,
    new_tokens: int = 48,
    repeats: int = 3,
) -> list[dict[str, Any]]:
    """Prompt-lookup decoding vs plain greedy decoding, per prompt: the same `new_tokens` greedy
    tokens (EOS ignored) both ways, timed alternately (ABBA, wall clock after a device sync) after
    one warm-up of each. Rows: prompt, alpha, tokens_per_round, rounds, greedy_equal, both estimates (low quantiles),
    speedup = plain / lookup (measured)."""
    check_k(k)
    check_int("repeats", repeats, 1)
    prompts = prompts or (
        LOOKUP_PROMPTS if lm.tokenizer is not None else {"ids 1..8 twice": list(range(1, 9)) * 2}
    )
    draft, greedy = PromptLookup(ngram), Sampling(greedy=True)
    rows = []
    for name, prompt in prompts.items():
        plain, lookup = _lookup_arms(lm, prompt, draft, greedy, k, new_tokens)
        base, spec = plain(), lookup()  # warm-up, and the outputs compared
        times = alternate({"plain": plain, "lookup": lookup}, repeats, lm.device)
        st = round_stats(spec.rounds)
        t_plain, t_lookup = times["plain"].estimate, times["lookup"].estimate
        rows.append(
            {
                "prompt": name,
                "model": lm.info.name,
                "device": str(lm.device),
                "k": k,
                "ngram": ngram,
                "new_tokens": new_tokens,
                "repeats": repeats,
                "rounds": len(spec.rounds),
                "found": sum(1 for r in spec.rounds if r.lookup),
                "alpha": st["alpha"],
                "tokens_per_round": len(spec.tokens) / len(spec.rounds),
                "greedy_equal": spec.tokens == base.tokens,
                "plain_s": t_plain,
                "lookup_s": t_lookup,
                "speedup": t_plain / t_lookup,
                "timer": times["plain"].method,
                "noisy": times["plain"].noisy or times["lookup"].noisy,
                "noisy_reason": "; ".join(f"{n}: {m.reason}" for n, m in times.items() if m.noisy),
            }
        )
    return rows


def _lookup_arms(lm, prompt, draft: PromptLookup, greedy: Sampling, k: int, new_tokens: int):
    """The two arms on one prompt: plain greedy decoding and prompt-lookup decoding, each making
    exactly `new_tokens` tokens (EOS ignored); each call returns its finished session."""

    def plain():
        s = Session(lm, prompt, greedy, max_new_tokens=new_tokens, stop_at_eos=False)
        s.run()
        return s

    def lookup():
        s = SpeculativeSession(
            lm, draft, prompt, greedy, k=k, max_new_tokens=new_tokens, stop_at_eos=False,
            record_steps=False,
        )  # fmt: skip
        while not s.done:
            s.step()
        return s

    return plain, lookup


def _prefill_s(r: Round) -> float:
    return sum(p["latency_s"] for p in (r.prefill or {}).values() if p) if r.prefill else 0.0


def _warm_up(target: LoadedModel, draft: LoadedModel, ids: list[int]) -> None:
    """Untimed: a few passes of each model, and the machine's peaks (measured once per process)."""
    hardware.measure(target.device, dtype=next(target.model.parameters()).dtype)
    for lm in (target, draft):
        for _ in range(2):
            decode_target_only(lm, ids, 4, Sampling(greedy=True))


def _bench_row(
    k: int, acc: dict, sampling: Sampling, n_tokens: int, repeats: int, target: LoadedModel
) -> dict:
    st = round_stats(acc["rounds"])
    t_dec, t_draft, t_ver = (_estimate(acc[k]) for k in ("base", "draft", "verify"))
    c = t_draft / t_dec if t_draft and t_dec else None
    v = t_ver / t_dec if t_ver and t_dec else None
    alpha = st["alpha"]
    ok = alpha is not None and c is not None
    return {
        "k": k,
        "greedy": sampling.is_greedy,
        "temperature": sampling.temperature,
        "alpha": alpha,
        "alpha_overlap": st["alpha_overlap"],
        "mean_accepted": st["mean_accepted"],
        "mean_tokens_per_round": st["mean_tokens_per_round"],
        "accepted_histogram": st["accepted_histogram"],
        "c": c,
        "v": v,
        "target_decode_s": t_dec,
        "draft_pass_s": t_draft,
        "verify_pass_s": t_ver,
        "predicted": expected_speedup(alpha, k, c) if ok else None,
        "predicted_with_verify_cost": expected_speedup(alpha, k, c, v) if ok and v else None,
        "measured": _estimate(acc["base_tok"]) / _estimate(acc["spec"]),
        "measured_wall": _estimate(acc["base_wall"]) / _estimate(acc["spec_wall"]),
        "n_tokens": n_tokens,
        "repeats": repeats,
        "device": str(target.device),
        "dtype": target.info.dtype,
        "timing": "forward passes, perf_counter after device sync; a low quantile over repeats "
        "(explorer.costs.noise); prefill excluded",
    }


def measure_cost_ratio(
    target: LoadedModel,
    draft: LoadedModel,
    ks=range(1, 9),
    *,
    context_len: int = 64,
    repeats: int = 5,
    warmup: int = 1,
) -> dict[str, Any]:
    """Time the passes speculative decoding is made of, for any two models (vocabularies need not match):
    a draft decode pass (1 token), a target decode pass (1 token) and a target verify pass (k+1 tokens),
    each over a cached prefix of context_len random ids. The passes are interleaved (one of each per
    repeat) so load on a shared machine hits all of them alike; a low quantile over repeats. Returns c, v(k) and
    the alpha from which speculative decoding pays off, per k, by expected_speedup()."""
    ks = [check_k(k) for k in ks]
    jobs = {"draft": _pass_job(draft, 1, context_len), "decode": _pass_job(target, 1, context_len)}
    jobs.update({f"verify{k}": _pass_job(target, k + 1, context_len) for k in ks})
    arms = {name: once for name, (once, _) in jobs.items()}
    timed = alternate(arms, repeats, target.device, warmup=warmup)  # one of each per round
    est = {name: m.estimate for name, m in timed.items()}
    t_draft, t_dec = est["draft"], est["decode"]
    c = t_draft / t_dec
    rows = []
    for k in ks:
        t_ver = est[f"verify{k}"]
        v = t_ver / t_dec
        rows.append(
            {
                "k": k,
                "verify_pass_s": t_ver,
                "v": v,
                "c_vs_verify": t_draft / t_ver,
                "predicted_at_alpha": {a: expected_speedup(a, k, c) for a in (0.6, 0.8, 0.9)},
                "breakeven_alpha": breakeven_alpha(k, c),
                "breakeven_alpha_with_verify_cost": breakeven_alpha(k, c, v),
            }
        )
    return {
        "target": target.info.name,
        "draft": draft.info.name,
        "device": str(target.device),
        "dtype": target.info.dtype,
        "threads": torch.get_num_threads(),
        "context_len": context_len,
        "repeats": repeats,
        "warmup": warmup,
        "draft_pass_s": t_draft,
        "target_decode_s": t_dec,
        "c": c,
        "spread_s": {name: [m.low, m.high] for name, m in timed.items()},
        "noisy": any(m.noisy for m in timed.values()),
        "noisy_reason": "; ".join(f"{n}: {m.reason}" for n, m in timed.items() if m.noisy),
        "per_k": rows,
        "timing": f"passes interleaved (ABBA), a low quantile of {repeats} repeats after "
        f"{warmup} warm-up, perf_counter after device sync (explorer.costs.noise)",
    }


def _pass_job(lm: LoadedModel, fed: int, context_len: int):
    """A closure running one pass of `fed` random ids over a cached prefix (cropped back after each call)."""
    gen = torch.Generator().manual_seed(fed)
    vocab = min(vocab_size(lm), 1000)
    prefix = torch.randint(0, vocab, (context_len,), generator=gen).tolist()
    new = torch.tensor(
        [torch.randint(0, vocab, (fed,), generator=gen).tolist()], device=lm.device
    )  # [1, fed]
    cache = DynamicCache()
    timed_forward(lm, prefix, cache, last_only=True)

    def once():  # a decode pass needs the last position's logits only; a verify pass needs all of them
        forward(lm.model, new, cache, last_only=fed == 1)
        crop_cache(cache, context_len)

    return once, lm.device
