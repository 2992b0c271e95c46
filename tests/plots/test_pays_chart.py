"""The pays charts on hand-made frames in the pays sweep's row format (no model, no timing)."""

from __future__ import annotations

import pandas as pd
import pytest

from explorer import plots
from explorer.plots.pays import pays_regions, pays_x_kind


def _frame(values, speedups, regimes, *, trick="kv-cache", axis="length", skipped=None, **attrs):
    rows = [
        dict(trick=trick, axis=axis, value=v, baseline_s=0.01 * s if s else None, trick_s=0.01,
             speedup=s, predicted_speedup=(s or 1) * 1.1, regime=r, how="measured",
             why=f"{axis} {v}: {r}-bound here", skipped=(skipped or {}).get(v), partial=False)
        for v, s, r in zip(values, speedups, regimes)
    ]  # fmt: skip
    df = pd.DataFrame(rows)
    df.attrs.update({"crossover_measured": None, "crossover_predicted": None, **attrs})
    return df


def _trace(fig, name):
    return next(t for t in fig.data if t.name == name)


def test_chart_draws_speedups_crossovers_and_one_band_per_regime_run():
    df = _frame([8, 32, 128, 512], [0.8, 1.5, 3.0, 6.0], ["overhead", "overhead", "memory", "compute"],
                crossover_measured=20.0, crossover_predicted=16.0)  # fmt: skip
    fig = plots.pays_chart(df)
    assert list(_trace(fig, "speedup (measured)").x) == [8, 32, 128, 512]
    assert list(_trace(fig, "speedup (measured)").y) == [0.8, 1.5, 3.0, 6.0]
    assert list(_trace(fig, "speedup (modelled: cost model)").y) == pytest.approx(
        [0.88, 1.65, 3.3, 6.6]
    )
    assert list(_trace(fig, "crossover (measured)").x) == [20.0]
    assert list(_trace(fig, "crossover (predicted)").x) == [16.0]
    bands = [s for s in fig.layout.shapes if s.type == "rect"]
    assert [b.fillcolor for b in bands] == [
        plots.REGIME_COLORS[r] for r in ("overhead", "memory", "compute")
    ]
    # the bands tile the axis: each starts where the last ended (midway on the log axis: sqrt(32*128))
    assert bands[0].x1 == pytest.approx(64) and bands[1].x0 == bands[0].x1
    verticals = [s for s in fig.layout.shapes if s.type == "line" and s.xref == "x"]
    assert sorted(s.x0 for s in verticals) == [16.0, 20.0]
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    assert "length = 20" in fig.layout.title.text and "length = 16" in fig.layout.title.text
    texts = [a.text for a in fig.layout.annotations]
    assert [t.replace("<br>    ", " ") for t in texts] == plots.pays_why_lines(df) and len(
        texts
    ) == 3
    assert texts[0].startswith("length 8–32 (overhead-bound)")


def test_unstable_rows_are_marked_not_drawn_and_names_sit_on_a_category_axis():
    df = _frame(["fixed", "lognormal"], [1.0, None], ["memory", "memory"], trick="continuous",
                axis="spread", skipped={"lognormal": "unstable (past saturation): static: ..."})  # fmt: skip
    fig = plots.pays_chart(df)
    y = list(_trace(fig, "speedup (measured)").y)
    assert y[0] == 1.0 and y[1] != y[1]  # NaN: not averaged into the line
    assert list(_trace(fig, "unstable or not run (not averaged)").x) == ["lognormal"]
    assert fig.layout.xaxis.type == "category" and "none in range" in fig.layout.title.text
    assert len(pays_regions(df)) == 1


def test_x_kind_and_regions_of_a_single_setting():
    assert pays_x_kind([0.0, 0.5, 1.0]) == "linear" and pays_x_kind([1, 64]) == "log"
    assert pays_x_kind([1, 2]) == "linear" and pays_x_kind(["a", "b"]) == "category"
    (only,) = pays_regions(_frame([16], [2.0], ["memory"]))
    assert only["x0"] < 16 < only["x1"] and only["regime"] == "memory"


def test_atlas_puts_every_trick_in_a_row_coloured_by_the_speedup():
    a = _frame([8, 64], [0.5, 2.0], ["overhead", "memory"])
    b = _frame([0.0, 1.0], [1.0, None], ["memory", "memory"], trick="continuous", axis="spread",
               skipped={1.0: "unstable (past saturation)"})  # fmt: skip
    fig = plots.pays_atlas([a, b])
    assert [t.name for t in fig.data] == ["kv-cache over length", "continuous over spread"]
    assert list(fig.data[0].z[0]) == pytest.approx([-1.0, 1.0])  # log2: red at 0.5x, green at 2x
    assert fig.data[1].z[0][1] is None and fig.data[1].text[0][1] == "unstable"
    assert fig.layout.coloraxis.cmin == -fig.layout.coloraxis.cmax


def test_the_registered_chart_takes_the_pays_frame_in_the_sweeps_tab_way():
    df = _frame([8, 64], [0.5, 2.0], ["overhead", "memory"], crossover_measured=20.0)
    fig = plots.sweep_figure("pays")
    plots.replace(fig, plots.sweep_columns("pays", df))
    extras = plots.sweep_shapes("pays", df)
    assert list(_trace(fig, "speedup (measured)").y) == [0.5, 2.0]
    assert len(extras["shapes"]) == 4 and "length = 20" in extras["title.text"]
    # each region's label sits in its band, its why as the hover
    assert list(_trace(fig, "memory-bound baseline").hovertext) == ["length 64: memory-bound here"]
