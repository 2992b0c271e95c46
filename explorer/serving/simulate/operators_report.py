"""`explorer bench simulate --operators`: the chip rule per operator against Vidur's GPU times.

report() gathers the rows (explorer.serving.simulate.operators), the median |error| per operator
class and chip with the term behind the misses, and the share of a layer's time the what-if's
iteration sum leaves out; format_report() prints it. Everything predicted is modelled; everything
measured is Vidur's (fp16, CUDA events, median of its repeats), on the GPU each row names.
"""

from __future__ import annotations

from pathlib import Path

from explorer.serving.simulate.operators import (
    ALLREDUCE,
    COMPUTE,
    DATA,
    MISS,
    implied,
    operator_rows,
    summarize,
    uncounted_share,
)

SHOWN_TOKENS = (1, 128, 4096)  # the text table's token counts (--json: every row)
SOURCE = "microsoft/vidur @ 7d47513363ec447a741ac5e47241580b47724fbf (MIT), data/profiling"


def report(path: Path | str | None = None) -> dict:
    """Rows, per-class summary and the what-if's uncounted share; `path`: one operator file of
    ours or Vidur's (then without the all-reduces), default the bundled data."""
    from explorer.serving.simulate.whatif import DEFAULTS

    rows = operator_rows(path or COMPUTE, None if path else ALLREDUCE)
    return {
        "modelled": "predicted_ms: the what-if's chip rule (whatif.ChipStepModel) per operator",
        "measured": f"measured_ms: Vidur's median GPU times ({SOURCE}; {DATA.name}/SOURCE.md)",
        "file": str(path or COMPUTE),
        "settings": {k: DEFAULTS[k] for k in ("bw_efficiency", "flop_efficiency")},
        "miss_pct": MISS * 100,
        "attention": "not compared: Vidur's attention profiles are absent from the snapshot",
        "summary": [s.to_dict() for s in summarize(rows)],
        "uncounted": uncounted_share(rows),
        "implied": implied(rows),
        "under_floor": under_floor(rows),
        "rows": [r.to_dict() for r in rows],
    }


def under_floor(rows) -> list[dict]:
    """Per (class, chip): rows measured faster than their floor at peak DRAM bandwidth / FLOP/s,
    with the range of their bytes (operands an L2 cache can hold beat the DRAM floor)."""
    out: dict[tuple, dict] = {}
    for r in rows:
        if r.measured_ms < max(r.memory_floor_ms, r.compute_floor_ms):
            d = out.setdefault((r.op_class, r.chip), {"rows": 0, "bytes": [], "under": []})
            d["rows"] += 1
            d["bytes"].append(r.bytes)
            d["under"].append(1 - r.measured_ms / max(r.memory_floor_ms, r.compute_floor_ms))
    return [
        {"op_class": c, "chip": chip, "rows": d["rows"], "min_bytes": min(d["bytes"]),
         "max_bytes": max(d["bytes"]), "most_under_pct": max(d["under"]) * 100}
        for (c, chip), d in out.items()
    ]  # fmt: skip


def format_report(rep: dict, tokens=SHOWN_TOKENS) -> str:
    lines = [
        rep["modelled"],
        rep["measured"],
        f"chip rule at bw_efficiency {rep['settings']['bw_efficiency']}, flop_efficiency "
        f"{rep['settings']['flop_efficiency']}; error = predicted / measured - 1",
        "",
        *_row_table(rep["rows"], tokens),
        "",
        *_summary_table(rep["summary"], rep["miss_pct"]),
        "",
        *_implied_lines(rep["implied"], rep["settings"]),
        *_uncounted_lines(rep["uncounted"]),
        *_under_floor_lines(rep["under_floor"]),
        rep["attention"],
    ]
    return "\n".join(lines)


def _row_table(rows: list[dict], tokens) -> list[str]:
    shown = [r for r in rows if r["tokens"] in tokens and r["tp"] == 1]
    shown.sort(key=lambda r: (r["chip"], r["model"], r["tokens"]))  # stable: the layer's order
    ar = [r for r in rows if r["op_class"] == "all_reduce" and r["bytes"] in _ar_sizes(rows)]
    out = [
        f"rows at tp 1 and {', '.join(map(str, tokens))} tokens, all-reduces at 4 sizes "
        f"({len(shown) + len(ar)} of {len(rows)}; --json for every row):",
        f"  {'operator':<25}{'chip':<11}{'model':<27}{'tokens':>7}{'tp':>4}"
        f"{'predicted_ms':>14}{'measured_ms':>13}{'error':>8}  blame",
    ]
    for r in shown + ar:
        where = r["model"].split("/")[-1]
        where = where if r["op_class"] != "all_reduce" else f"{r['bytes']:,.0f} bytes"
        out.append(
            f"  {r['operator']:<25}{r['chip']:<11}{where[-26:]:<27}{r['tokens']:>7}{r['tp']:>4}"
            f"{r['predicted_ms']:>14.4f}{r['measured_ms']:>13.4f}{r['error_pct']:>+7.0f}%  "
            f"{r['blame']}"
        )
    return out


def _ar_sizes(rows: list[dict]) -> set[float]:
    sizes = sorted({r["bytes"] for r in rows if r["op_class"] == "all_reduce"})
    return {sizes[int(i * (len(sizes) - 1) / 3)] for i in range(4)} if sizes else set()


def _frac(x) -> str:
    return "-" if x is None else f"{x:.0%}"


def _summary_table(summary: list[dict], miss_pct: float) -> list[str]:
    out = [
        f"median |error| per operator class and chip; misses over {miss_pct:.0f}% and the term "
        "behind most of them, over all rows, at small sizes (<= 16 tokens; all-reduce <= 256 KiB) "
        "and large ones (>= 1024 tokens; >= 4 MiB); launch: the class's fastest time on that chip; "
        "bw / flop: median fraction of peak the measurements imply (memory- / compute-bound rows)",
        f"  {'class':<12}{'chip':<11}{'rows':>5}{'|error|':>9}{'signed':>8}{'misses':>8}  "
        f"{'term to blame: all':<24}{'small':<24}{'large':<24}{'launch':>8}{'bw':>6}{'flop':>6}",
    ]
    for s in summary:
        out.append(
            f"  {s['op_class']:<12}{s['chip']:<11}{s['rows']:>5}"
            f"{s['median_abs_error_pct']:>8.0f}%{s['median_error_pct']:>+7.0f}%{s['misses']:>8}  "
            f"{s['blame'] or '-':<24}{s['blame_small'] or '-':<24}{s['blame_large'] or '-':<24}"
            f"{s['launch_floor_ms'] * 1e3:>6.1f}us"
            f"{_frac(s['achieved_bw_frac']):>6}{_frac(s['achieved_flop_frac']):>6}"
        )
    return out


def _uncounted_lines(uncounted: dict) -> list[str]:
    out = []
    for chip, u in uncounted.items():
        out.append(
            f"{chip}: operators the what-if's iteration sum gives no bytes (embedding, norms, RoPE, "
            f"activation, add) take {_frac(u['small_tokens_share'])} of a layer's measured time at "
            f"<= {u['small']} tokens, {_frac(u['large_tokens_share'])} at >= {u['large']} "
            "(median over models and TP; attention not included)"
        )
    return out


def _implied_lines(imp: dict, settings: dict) -> list[str]:
    from explorer.serving.simulate.whatif_settings import defaults_for

    out = ["what the measurements imply for each term of the rule (medians; the rule's own value):"]
    for chip, m in imp.items():
        mine = defaults_for(chip)  # the chip family's values (settings: the pooled ones)
        bw, fl, ar = mine["bw_efficiency"], mine["flop_efficiency"], mine["allreduce_latency_s"]
        out.append(
            f"  {chip}: matmuls at >= 1024 tokens {_frac(m['matmul_flop_frac_large'])} of peak "
            f"FLOP/s ({fl:.0%}); at <= 16 tokens {_frac(m['matmul_bw_frac_small'])} of peak "
            f"bandwidth ({bw:.0%}); elementwise at >= 1024 tokens "
            f"{_frac(m['elementwise_bw_frac_large'])} ({bw:.0%}), at <= 16 tokens "
            f"{_us(m['elementwise_small_ms'])} each (no floor); all-reduce <= 256 KiB "
            f"{_us(m['allreduce_small_ms'])} ({ar * 1e6:.0f} us), "
            f"bus {_gbps(m['allreduce_bus_gbps_largest'])} at 64 MiB ({_gbps(m['interconnect_gbps'])})"
        )
    return out


def _us(ms) -> str:
    return "-" if ms is None else f"{ms * 1e3:.0f} us"


def _gbps(x) -> str:
    return "-" if x is None else f"{x:.0f} GB/s"


def _under_floor_lines(under: list[dict]) -> list[str]:
    return [
        f"{u['rows']} {u['op_class']} rows on {u['chip']} measured under the DRAM floor "
        f"by up to {u['most_under_pct']:.0f}% ({u['min_bytes'] / 1e6:.1f}-{u['max_bytes'] / 1e6:.1f} "
        "MB moved: the L2 cache holds operands and defers writes; the chip table has no cache "
        "figure, so the rule never goes below that floor)"
        for u in under
    ]
