"""int8, bf16 and fp16: fewer bytes per weight against the model as loaded (fp32), over the phase
(tokens fed in one pass: 1 is a decode step, 1024 a long prefill) and over batch size.

A pass reads every weight once however many tokens it feeds, so fewer bytes per weight pay where
the weights' bytes set the time (a memory-bound decode step) and stop paying where the FLOPs do (a
long prefill, a big batch) or where fixed overhead does (a tiny model). Both models run the same
seeded pass (PAST cached tokens, then `value` tokens fed; at --over batch a decode step), timed
alternately. The converted model comes from explorer.model.loader.with_weights (a plain cast for
bf16 / fp16, explorer.model.quant for int8), as the dtype and ladder sweeps use it. A setting this
device cannot run gives rows that say why (skipped), not a crash.

predicted_speedup: the calibrated cost model with only its bytes term changed
(explorer.costs.tricks.fewer_bytes_speedup: weight bytes x the new/old ratio, FLOPs unchanged),
so it cannot see a CPU whose half-precision matmuls are slower than fp32: `why` says when the
measurement disagrees.
"""

from __future__ import annotations

from explorer.costs.tricks import fewer_bytes_speedup
from explorer.model.loader import with_weights
from explorer.sweeps.pays import MEASURED, Axis, Trick, TrickContext, figures, register_trick
from explorer.sweeps.pays._context import decode_memory, one_pass
from explorer.sweeps.pays._why import regime_phrase

PAST = 16  # cached tokens before the fed ones
BATCH_CONTEXT = 64  # context of the decode step at --over batch


def _weight_bytes(ctx: TrickContext, lm, batch: int, fed: int, context: int) -> tuple:
    """(weight bytes, other bound bytes, FLOPs) of one pass, modelled."""
    cost = ctx.cost(lm, batch, fed, context)
    weights = sum(v for k, v in cost.bytes.items() if k.startswith("weights/"))
    return weights, cost.bound_bytes - weights, cost.total_flops


def _setup(kind: str):
    def setup(ctx: TrickContext):
        try:
            fast = with_weights(ctx.lm, kind)
        except ValueError as err:  # WeightsNotSupportedError or a model that is not float
            why = f"{kind} does not run here: {str(err).splitlines()[0]}"
            ctx.notes.append(why)
            return lambda value: {"skipped": why, "why": why, "how": MEASURED}
        ctx.attrs["weights"] = {"baseline": ctx.lm.info.weights, "trick": fast.info.weights}

        def point(value: int) -> dict:
            batch, fed = (value, 1) if ctx.axis == "batch" else (1, value)
            context = BATCH_CONTEXT if ctx.axis == "batch" else PAST + fed
            base_s, fast_s = ctx.time_pair(
                one_pass(ctx.lm, batch, fed, context, seed=ctx.seed),
                one_pass(fast, batch, fed, context, seed=ctx.seed),
            )
            split = ctx.split(base_s, batch=batch, tokens_fed=fed, context_len=context)
            w0, other, flops = _weight_bytes(ctx, ctx.lm, batch, fed, context)
            w1 = _weight_bytes(ctx, fast, batch, fed, context)[0]
            predicted = fewer_bytes_speedup(
                ctx.calibration(),
                weight_bytes=w0,
                other_bytes=other,
                flops=flops,
                layers=ctx.lm.info.layers,
                bytes_ratio=w1 / w0,
                rows=batch * fed,
            )
            return figures(
                base_s,
                fast_s,
                predicted,
                split["regime"],
                _why(kind, ctx.axis, value, split, w0, w1, base_s / fast_s, predicted),
            )

        return point

    return setup


def _why(kind, axis, value, split, w0, w1, measured, predicted) -> str:
    what = f"batch {value} decode" if axis == "batch" else (
        "a decode step" if value == 1 else f"a {value}-token prefill"
    )  # fmt: skip
    reason = {
        "memory": "the weights' bytes set the time, so fewer bytes per weight pay",
        "compute": "the FLOPs set the time and fewer bytes leave them as they are",
        "overhead": "fixed overhead sets the time, which no byte saving touches",
    }[split["regime"]]
    kernels = ""
    if measured < 0.8 * predicted:
        kernels = f"; measured {measured:.2f}x, below the predicted {predicted:.2f}x: this "
        kernels += f"device's {kind} kernels are slower per byte saved than its fp32 ones"
    elif measured > 1.25 * predicted:
        kernels = f"; measured {measured:.2f}x, above the predicted {predicted:.2f}x: this "
        kernels += f"device's {kind} matmuls run faster than its fp32 ones (not only bytes changed)"
    return (
        f"{what} is {regime_phrase(split)}: {kind} takes the weights from "
        f"{w0 / 1e6:.3g} MB to {w1 / 1e6:.3g} MB per pass; {reason}{kernels}"
    )


AXES = (
    Axis(
        "prefill",
        "ints",
        (1, 16, 128, 1024),
        f"tokens fed in one pass onto {PAST} cached (1: a decode step)",
        high=lambda info: info.max_positions - PAST if info.max_positions else None,
    ),
    Axis(
        "batch",
        "ints",
        (1, 8, 64),
        f"rows of one decode step (context {BATCH_CONTEXT})",
        memory=decode_memory(BATCH_CONTEXT),
    ),  # fmt: skip
)
for _order, _kind in enumerate(("int8", "bf16", "fp16")):
    register_trick(
        Trick(
            name=_kind,
            title=f"{_kind} weights",
            baseline="the model's own weights (fp32)",
            axes=AXES,
            setup=_setup(_kind),
            unit="one forward pass",
            order=30 + _order,
        )
    )
