"""compile: torch.compile of the decode forward against eager, over model and batch size.

Compiling fuses kernels and (on CUDA, mode reduce-overhead) replays the step as one CUDA graph: it
cuts the per-step overhead (Python, dispatch, kernel launches), not the bytes a step moves. So it
pays where the baseline step is overhead-bound (a small model, a small batch) and stops paying
where the weights' bytes or the FLOPs set the time. The compiled forward is
explorer.engine.options.Compiled (what Session(compile=True) runs), warmed up apart (compile_s in
attrs, per value); both run the same seeded decode step (CONTEXT tokens of context), alternately.

predicted_speedup: explorer.costs.tricks.overhead_cut_speedup over the calibrated model: its
whole fitted step and per-layer overhead removed, bytes and FLOPs kept (a ceiling).
"""

from __future__ import annotations

from explorer._format import ms
from explorer.costs.tricks import overhead_cut_speedup, overhead_removed_s
from explorer.engine.options import Compiled, compile_mode
from explorer.model.loader import LoadedModel, load
from explorer.sweeps.pays import MEASURED, Axis, Trick, TrickContext, figures, register_trick
from explorer.sweeps.pays._context import decode_memory, one_pass
from explorer.sweeps.pays._why import regime_phrase

CONTEXT = 64


def _model(ctx: TrickContext, name: str) -> LoadedModel:
    if name == ctx.lm.info.name:
        return ctx.lm
    return load(name, device=str(ctx.lm.device), dtype=ctx.lm.info.dtype)


def _point(ctx: TrickContext, lm: LoadedModel, batch: int) -> dict:
    compiled = Compiled(lm.model, compile_mode(True, lm.device))
    context = min(CONTEXT, lm.info.max_positions - 1) if lm.info.max_positions else CONTEXT
    eager = one_pass(lm, batch, 1, context, seed=ctx.seed)
    fast = one_pass(
        lm, batch, 1, context, seed=ctx.seed, fn=compiled.fn if compiled.active else None
    )
    if compiled.active:
        compiled.warm_up(lambda fn: fast(), lm.device)
    if not compiled.active:
        why = f"torch.compile does not run here: {compiled.reason}"
        return {"skipped": why, "why": why, "how": MEASURED}
    ctx.attrs.setdefault("compile_s", {})[f"{lm.info.name} batch {batch}"] = compiled.compile_s
    base_s, fast_s = ctx.time_pair(eager, fast, lm)
    split = ctx.split(base_s, batch=batch, tokens_fed=1, context_len=context, lm=lm)
    total = ctx.predict(batch=batch, tokens_fed=1, context_len=context, lm=lm)
    removed = overhead_removed_s(ctx.calibration(lm), lm.info.layers)
    weights = sum(v for k, v in split["bytes"].items() if k.startswith("weights/"))
    why = (
        f"{lm.info.name} batch {batch} decode is {regime_phrase(split)}: compiling cuts overhead "
        f"(the calibrated model puts it at {ms(removed)} of {ms(total)}), not bytes: the weights' "
        f"{weights / 1e6:.3g} MB are still read every step"
    )
    return figures(base_s, fast_s, overhead_cut_speedup(total, removed), split["regime"], why)


def setup(ctx: TrickContext):
    ctx.attrs["compile_mode"] = compile_mode(True, ctx.lm.device)
    ctx.attrs["context_len"] = CONTEXT
    if ctx.axis == "batch":
        return lambda batch: _point(ctx, ctx.lm, batch)
    batch = ctx.options.get("batch", 1)

    def point(name: str) -> dict:
        try:
            lm = _model(ctx, name)
        except ValueError as err:  # not found here, does not fit: that row says so
            why = f"{name} does not load here: {str(err).splitlines()[0]}"
            return {"skipped": why, "why": why, "how": MEASURED}
        return _point(ctx, lm, batch)

    return point


register_trick(
    Trick(
        name="compile",
        title="torch.compile (decode step)",
        baseline="the same decode step, eager",
        axes=(
            Axis(
                "model",
                "names",
                ("bundled:target", "arch:smollm2-135m", "arch:qwen2.5-0.5b"),
                "models, e.g. bundled:target,arch:smollm2-135m (each loaded here, batch 1)",
            ),
            Axis(
                "batch",
                "ints",
                (1, 8, 32),
                f"rows of one decode step (context {CONTEXT})",
                memory=decode_memory(CONTEXT),
            ),  # fmt: skip
        ),
        setup=setup,
        order=40,
    )
)
