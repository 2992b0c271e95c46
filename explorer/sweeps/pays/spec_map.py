"""Where speculative decoding pays over batch x context: its modelled speedup on a grid, the batch
where it flips from paying to costing at each context, and the check that a target and a draft can
pair at all (one vocabulary). Every figure here is modelled; the notebook measures cells beside it.

A clock gives one pass's seconds, clock(batch, fed, past): `batch` rows, each feeding `fed` tokens
onto `past` cached ones. A target's and a draft's clocks and an acceptance rate alpha give a cell
by the parts formula the pays sweep uses (explorer.costs.tricks.speculative_speedup):

    t_1 = target(B, 1, L),  t_v = target(B, k + 1, L),  t_d = draft(B, 1, L)
    speedup = E[tokens per round](alpha, k) / ((t_v + k t_d) / t_1)

Clocks: on_machine (Calibrations fitted on this machine: explorer.costs.calibrate) or on_chip (a
known chip on paper: explorer.serving.simulate.whatif.chip_model, CHIP_RULE, with the KV tokens
target and draft can hold together on it). Why a map has the shape it has: WHY.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

from explorer.costs.guards import speculative_bound
from explorer.costs.speculation import expected_tokens_per_round
from explorer.costs.tricks import speculative_speedup
from explorer.sweeps.pays import crossover

Clock = Callable[[int, int, int], float]  # (batch, tokens fed per row, cached tokens) -> seconds
SCAN = tuple(2**i for i in range(11))  # batches 1 .. 1024: where the flip is looked for
WHY = (
    "at large batch the verify pass's k+1 tokens per row turn the step compute-bound, so it costs "
    "about k+1 one-token passes and rejected drafts are paid in full; at long context each row's KV "
    "read dominates every pass, the target's and the draft's alike: the verify reads the same KV "
    "as a one-token pass (it stays memory-bound to larger batches, so the flip moves out); the "
    "draft's own KV read grows too, so its cost beside the target (c) moves little"
)


@dataclass(frozen=True)
class Setting:
    """A target's and a draft's clocks where they run, with the KV tokens both can hold together
    (None: not limited here)."""

    target: Clock
    draft: Clock
    label: str  # e.g. "1x H100 SXM (modelled)"
    kv_tokens: float | None = None

    def fits(self, batch: int, context: int, k: int) -> bool:
        return self.kv_tokens is None or batch * (context + k + 1) <= self.kv_tokens


def on_machine(target_info, draft_info, target_cal, draft_cal, label: str) -> Setting:
    """Clocks from calibrations fitted on this machine (bytes and FLOPs of the cost model)."""
    return Setting(_calibrated(target_info, target_cal), _calibrated(draft_info, draft_cal), label)


def _calibrated(info, cal) -> Clock:
    from explorer.costs.parts import forward_cost

    def clock(batch: int, fed: int, past: int) -> float:
        cost = forward_cost(
            info, batch=batch, tokens_fed=fed, context_len=past + fed, logits_positions=1
        )
        return cal.predict(
            bytes=cost.bound_bytes,
            flops=cost.total_flops,
            layers=info.layers,
            rows=batch * fed,
        )

    return clock


def on_chip(target_info, draft_info, chip: str) -> Setting:
    """Clocks of one `chip` on paper (CHIP_RULE, the what-if's fitted efficiencies and overheads);
    kv_tokens: what the target's KV budget holds once the draft's weights are in, at the KV bytes
    of both models per token. target_info, draft_info: ModelInfo, or "arch:" names (bf16)."""
    from explorer.costs.parts import shape_of
    from explorer.serving.simulate.whatif import chip_model

    target_info, draft_info = (
        _on_meta(x).info if isinstance(x, str) else x for x in (target_info, draft_info)
    )

    (tm, tplan), (dm, dplan) = chip_model(target_info, chip), chip_model(draft_info, chip)
    ts, ds = shape_of(target_info), shape_of(draft_info)
    t_mem, d_mem = tplan["memory"], dplan["memory"]
    free = (t_mem["kv_budget_gb_per_gpu"] - d_mem["weights_gb"]) * 1e9
    per_token = t_mem["kv_bytes_per_token_per_gpu"] + d_mem["kv_bytes_per_token_per_gpu"]
    return Setting(
        target=lambda b, fed, past: tm.step(ts, [[fed, past]] * b).seconds,
        draft=lambda b, fed, past: dm.step(ds, [[fed, past]] * b).seconds,
        label=f"1x {tm.chip} (modelled)",
        kv_tokens=max(free, 0.0) / per_token,
    )


def cell(setting: Setting, alpha: float, k: int, batch: int, context: int) -> dict:
    """One cell: the speedup, the draft's cost c = t_d / t_1 and the verify's v = t_v / t_1."""
    t1 = setting.target(batch, 1, context)
    tv = setting.target(batch, k + 1, context)
    td = setting.draft(batch, 1, context)
    return {
        "speedup": speculative_speedup(alpha, k, tv, td, t1),
        "draft_cost": td / t1,
        "verify_cost": tv / t1,
        "tokens_per_round": expected_tokens_per_round(alpha, k),
    }


def flip_batch(
    setting: Setting, alpha: float, k: int, context: int, scan=SCAN
) -> float | None:  # fmt: skip
    """The batch where the modelled speedup crosses 1 at this context (pays.crossover over `scan`,
    memory not applied); None when it does not cross in the scan."""
    return crossover(list(scan), [cell(setting, alpha, k, b, context)["speedup"] for b in scan])


def measured_cell(
    target, draft, alpha: float, k: int, batch: int, context: int, repeats: int, seed: int = 0
) -> dict:  # fmt: skip
    """One cell measured here: t_1, t_v and t_d of the loaded models timed alternately
    (explorer.costs.timing.alternate, one warm-up each) on seeded ids. Each repeat's three passes
    run back to back, so each repeat gives one speedup by the parts formula: the cell is their
    median, low and high their range; draft_cost and verify_cost are medians of the same ratios."""
    from explorer.costs.timing import alternate
    from explorer.sweeps.pays._context import one_pass

    arms = {  # each feeds its tokens onto `context` cached ones per row
        "one": one_pass(target, batch, 1, context + 1, seed=seed),
        "verify": one_pass(target, batch, k + 1, context + k + 1, seed=seed),
        "draft": one_pass(draft, batch, 1, context + 1, seed=seed),
    }
    got = alternate(arms, repeats, target.device, warmup=1)
    rounds = list(zip(*(got[n].samples for n in arms), strict=True))  # (t_1, t_v, t_d) per repeat
    per = [speculative_speedup(alpha, k, tv, td, t1) for t1, tv, td in rounds]
    c = statistics.median(td / t1 for t1, _, td in rounds)
    v = statistics.median(tv / t1 for t1, tv, _ in rounds)
    speedup = statistics.median(per)
    return {
        "batch": batch,
        "context": context,
        "speedup": speedup,
        "low": min(per),
        "high": max(per),
        "draft_cost": c,
        "verify_cost": v,
        "flag": None
        if v >= 1
        else _flag(batch, context, k, speedup, speculative_bound(alpha, k, c), v),
        "repeats": repeats,
        "device": str(target.device),
        "dtype": target.info.dtype,
    }


def _flag(batch, context, k, speedup, bound, v) -> str:
    return (
        f"batch {batch}, context {context}: the {k + 1}-token verify pass timed at {v:.2f} of a "
        f"1-token pass, more work in less time, so the machine changed under the run ({speedup:.2f}x "
        f"against Leviathan's bound {bound:.2f}x with a free verify): a timing, not a lesson; rerun it"
    )


@dataclass
class SpecMap:
    """The modelled speedup over contexts (rows) x batches (columns); None where the cell's KV does
    not fit. flips[i]: the batch where contexts[i]'s row crosses 1 on the scan (None: it does not);
    at_first[i]: its speedup at the scan's first batch; max_rows[i]: the rows whose KV fits at that
    context (None: not limited)."""

    label: str
    alpha: float
    k: int
    batches: list[int]
    contexts: list[int]
    speedup: list[list[float | None]]
    draft_cost: list[list[float]]
    verify_cost: list[list[float]]
    flips: list[float | None]
    at_first: list[float]
    max_rows: list[int | None]
    scan: list[int] = field(default_factory=lambda: list(SCAN))

    def lines(self) -> list[str]:
        """One line per context: where the speedup flips (or that it does not), and what fits."""
        out = []
        for ctx, flip, first, rows in zip(
            self.contexts, self.flips, self.at_first, self.max_rows, strict=True
        ):
            pays, costs = ("pays", "costs") if first >= 1 else ("costs", "pays")
            if flip is not None:
                where = f"{pays} below batch {flip:.0f}, {costs} above it"
            else:
                where = f"{pays} at every batch from {self.scan[0]} to {self.scan[-1]}"
            fit = "" if rows is None else f" (the KV of {rows:,} rows fits)"
            out.append(f"context {ctx}: {where}{fit}")
        return out


def speedup_map(
    setting: Setting, alpha: float, k: int, batches, contexts, scan=SCAN
) -> SpecMap:  # fmt: skip
    """The modelled map over batches x contexts, with each context's flip batch on the scan."""
    cells = [[cell(setting, alpha, k, b, c) for b in batches] for c in contexts]
    along = [[cell(setting, alpha, k, b, c)["speedup"] for b in scan] for c in contexts]
    return SpecMap(
        label=setting.label,
        alpha=alpha,
        k=k,
        batches=list(batches),
        contexts=list(contexts),
        speedup=[
            [x["speedup"] if setting.fits(b, c, k) else None for x, b in zip(row, batches)]
            for row, c in zip(cells, contexts)
        ],
        draft_cost=[[x["draft_cost"] for x in row] for row in cells],
        verify_cost=[[x["verify_cost"] for x in row] for row in cells],
        flips=[crossover(list(scan), speeds) for speeds in along],
        at_first=[speeds[0] for speeds in along],
        max_rows=[
            None if setting.kv_tokens is None else int(setting.kv_tokens // (c + k + 1))
            for c in contexts
        ],
        scan=list(scan),
    )


# --- the pair ------------------------------------------------------------------------------------


def pair_verdict(target, draft) -> tuple[bool, str]:
    """(True, what they share) or (False, why not: one line), for two loaded models or two
    architecture names ("arch:..." built on the meta device: no weights, no tokenizer, so only the
    vocabulary sizes are compared). explorer.engine.drafts.check_pair gives the reason."""
    from explorer.engine.drafts import check_pair, vocab_size

    t, d = _as_model(target), _as_model(draft)
    try:
        check_pair(t, d)
    except ValueError as e:
        return False, str(e)
    shared = "the same tokenizer" if t.tokenizer is not None else "sizes only: no tokenizer here"
    return True, (
        f"target {t.info.name} and draft {d.info.name} share one vocabulary "
        f"({vocab_size(t):,} ids; {shared})"
    )


def _as_model(model):
    return _on_meta(model) if isinstance(model, str) else model


@lru_cache(maxsize=8)
def _on_meta(name: str):
    """An architecture shape as a LoadedModel on the meta device (bf16: no bytes allocated)."""
    import torch
    from transformers import AutoModelForCausalLM

    from explorer.model.loader import LoadedModel, arch_config, model_info

    config, meta = arch_config(name)
    with torch.device("meta"):
        built = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    full = name if name.startswith("arch:") else f"arch:{name}"
    info = model_info(
        built, name=full, source="arch", random_weights=True, hub_id=meta.get("hub_id")
    )
    info.device = "meta (not allocated)"
    return LoadedModel(model=built, tokenizer=None, info=info)
