"""The what-if's error against published runs, grouped: per source, per engine, per chip and per
(scheduler policy, chip), each group with its median |error| per metric, its coverage (points
run / unsupported, and why a point was unsupported) and, where its source published repeated runs
of a point (a point's `repeats`: the measured metrics of each run), their spread.

Read by `explorer bench simulate --published` (printed, or --json) and by the Capacity tab, which
shows the (policy, chip) row matching the question asked beside its answer, from the stored
comparison (assets/published/validation.json), so the tab replays nothing.
"""

from __future__ import annotations

import statistics

from explorer._format import pct

REPORTED = {  # metric: its column's heading
    "output_throughput": "throughput",
    "median_tpot_ms": "TPOT",
    "median_ttft_ms": "TTFT p50",
    "p99_ttft_ms": "TTFT p99",
    "median_e2el_ms": "E2E",
}
GROUPS = {  # grouping: the key of a row (one per published run and metric)
    "source": lambda r: r["source"],
    "engine": lambda r: r["engine"],
    "chip": lambda r: r["chip"].split("x ", 1)[-1],
    "policy_chip": lambda r: f"{r['policy']} on {r['chip'].split('x ', 1)[-1]}",
}


def _median_abs(rows: list[dict], metric: str) -> tuple[float | None, int]:
    errs = [
        abs(r["error_pct"]) for r in rows if r["metric"] == metric and r["error_pct"] is not None
    ]
    return (statistics.median(errs) if errs else None), len(errs)


def spread_pct(point: dict) -> dict[str, float]:
    """Per metric, the spread of a point's repeated real runs: (max - min) / median, in %."""
    runs = [point["measured"], *point.get("repeats", [])] if point.get("repeats") else []
    out = {}
    for metric in REPORTED:
        values = [r[metric] for r in runs if r.get(metric) is not None]
        if len(values) >= 2:
            out[metric] = (max(values) - min(values)) / statistics.median(values) * 100
    return out


def group_row(key: str, rows: list[dict], spreads: dict[str, dict]) -> dict:
    """One group: its points (run, unsupported and why), median |error| and n per metric, the
    splits it holds and the median spread of its repeated runs per metric."""
    ids = sorted({r["id"] for r in rows})
    unsupported = {r["id"]: r["unsupported"] for r in rows if r.get("unsupported")}
    out = {
        "group": key,
        "split": "/".join(sorted({r["split"] for r in rows})),
        "points": len(ids),
        "run": len(ids) - len(unsupported),
        "unsupported": len(unsupported),
        "why_unsupported": sorted(set(unsupported.values())),
        "median_abs_error_pct": {},
        "n": {},
        "spread_pct": {},
    }
    for metric in REPORTED:
        err, n = _median_abs(rows, metric)
        out["median_abs_error_pct"][metric], out["n"][metric] = err, n
        got = [spreads[i][metric] for i in ids if metric in spreads.get(i, {})]
        out["spread_pct"][metric] = statistics.median(got) if got else None
    return out


def report(rows: list[dict], points: list[dict]) -> dict:
    """{grouping: [group rows]} over the comparison's rows (published.compare_all) and the
    points they came from, plus the held-out line per metric."""
    spreads = {p["id"]: spread_pct(p) for p in points if p.get("repeats")}
    out: dict = {}
    for name, key_of in GROUPS.items():
        groups: dict[str, list[dict]] = {}
        for r in rows:
            groups.setdefault(key_of(r), []).append(r)
        out[name] = [group_row(k, g, spreads) for k, g in sorted(groups.items())]
    held = [r for r in rows if r["split"] == "held out"]
    out["held_out"] = group_row("held out", held, spreads) if held else None
    out["repeated_points"] = sorted(spreads)
    return out


def matching_row(rep: dict, policy: str, chip: str) -> dict | None:
    """The (policy, chip) group of the report, if published runs had that scheduler there."""
    want = f"{policy} on {chip}"
    return next((g for g in rep.get("policy_chip", []) if g["group"] == want), None)


def row_text(g: dict, width: int = 34) -> str:
    cells = "".join(f"{_cell(g['median_abs_error_pct'][m], g['n'][m]):>14}" for m in REPORTED)
    spread = [f"{REPORTED[m]} {v:.0f}%" for m, v in g["spread_pct"].items() if v is not None]
    unsupported = f"/{g['unsupported']}" if g["unsupported"] else "/0"
    line = f"{g['group'][: width - 1]:<{width}}{g['split']:<18}{g['run']:>4}{unsupported:<4}{cells}"
    return line + (f"   spread {', '.join(spread)}" if spread else "")


def _cell(value: float | None, n: int) -> str:
    return "-" if value is None else f"{pct(value)} ({n})"


def report_text(rep: dict) -> str:
    """The report as text: one table per grouping, then the reasons points were unsupported."""
    head = f"{'':<34}{'split':<18}{'run/uns':<8}" + "".join(f"{h:>14}" for h in REPORTED.values())
    lines = ["median |error| per metric (points with it), coverage: points run / unsupported"]
    for name in GROUPS:
        lines += ["", f"per {name.replace('_', ' and ')}:", head]
        lines += [row_text(g) for g in rep[name]]
    if rep.get("held_out"):
        lines += ["", head, row_text(rep["held_out"])]
    why = sorted({w for g in rep["source"] for w in g["why_unsupported"]})
    lines += [f"unsupported: {w}" for w in why]
    if not rep.get("repeated_points"):
        lines.append("spread: no source in the file publishes repeated runs of a point")
    return "\n".join(lines)
