"""explorer.plots on hand-built Steps and Traces: every chart's data is what the records say."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
import pytest

from explorer import plots, sweeps
from explorer.engine.trace import Step, Trace

PEAKS = {
    "bandwidth_gbps": 10.0,
    "flops": 1e11,
    "device": "cpu",
    "dtype": "float32",
    "method": "measured",
}


def make_step(i: int, *, forced: bool = False, greedy: bool = False, n_top: int = 5) -> Step:
    top = [
        {"id": 100 + j, "text": f" w{j}", "raw": 0.4 / (j + 1), "final": 0.5 / (j + 1)}
        for j in range(n_top)
    ]
    chosen = top[i % n_top]
    draw = {
        "u": None if greedy else 0.3 + 0.01 * i,
        "cdf_lo": 0.2,
        "cdf_hi": 0.45,
        "greedy": greedy,
    }
    return Step(
        index=i,
        phase="prefill" if i == 0 else "decode",
        tokens_fed=6 if i == 0 else 1,
        context_len=6 + i,
        token_id=chosen["id"],
        token_text=chosen["text"],
        forced=forced,
        prob_raw=chosen["raw"],
        prob_final=chosen["final"],
        rank_raw=i % n_top,
        rank_final=i % n_top,
        entropy_raw=1.5 + 0.1 * i,
        entropy_final=1.0 + 0.1 * i,
        top=top,
        stages=[
            {"name": "repetition_penalty", "mass": 1.0, "kept": 4096},
            {"name": "top_k", "mass": 0.8, "kept": 40},
            {"name": "top_p", "mass": 0.9, "kept": 12},
        ],
        draw=draw,
        latency_s=(0.02 if i == 0 else 0.005 + 0.0001 * i),
        kv_cache_bytes=4096 * (7 + i),
        flops=2e7 * (6 if i == 0 else 1),
        bytes={
            "weights/attention": 1e6,
            "weights/mlp": 2e6,
            "weights/lm_head": 5e5,
            "kv_read": 1e3 * i,
            "kv_write": 512.0,
            "activations": 256.0,
        },
        achieved_gbps=None if i % 2 else 0.7,
    )


def make_trace(n: int = 8, **kw) -> Trace:
    return Trace(
        prompt="Once",
        settings={"use_cache": True},
        model={"name": "hand"},
        device="cpu",
        dtype="float32",
        steps=[make_step(i) for i in range(n)],
        hardware=PEAKS,
        **kw,
    )


def by_name(fig: go.Figure, name: str):
    return next(t for t in fig.data if t.name == name)


# --- generic helpers ----------------------------------------------------------------------------------


def test_concat_appends_and_windows():
    a = {"t": {"x": np.arange(3.0), "y": np.ones(3)}}
    b = {"t": {"x": np.array([3.0, 4.0]), "y": np.zeros(2)}, "u": {"x": np.array([9.0])}}
    out = plots.concat(a, b, keep_last=4)
    assert out["t"]["x"].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert out["t"]["y"].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert out["u"]["x"].tolist() == [9.0]
    assert a["t"]["x"].tolist() == [0.0, 1.0, 2.0]  # inputs untouched


def test_replace_unknown_trace_raises_and_changes_nothing():
    fig = plots.latency_figure()
    with pytest.raises(KeyError, match="no trace named"):
        plots.replace(
            fig, {"decode": {"x": np.arange(2.0), "y": np.ones(2)}, "nope": {"x": np.arange(1.0)}}
        )
    assert len(by_name(fig, "decode").x) == 0


def test_extend_reads_back_and_appends_on_a_plain_figure():
    fig = plots.latency_figure()
    plots.extend(fig, plots.latency_columns([make_step(0), make_step(1)]))
    plots.extend(fig, plots.latency_columns([make_step(2)]))
    assert list(by_name(fig, "decode").x) == [1.0, 2.0]
    assert list(by_name(fig, "prefill").y) == [20.0]


def test_show_token_makes_whitespace_visible():
    assert plots.show_token(" the\n") == "·the⏎"
    assert plots.show_token("") == "∅"


# --- token strip ----------------------------------------------------------------------------------------


def test_strip_columns_colour_mark_prefill_and_forced():
    steps = [make_step(0), make_step(1, forced=True), make_step(2)]
    cols = plots.strip_columns(steps)["tokens"]
    assert cols["x"].tolist() == [0, 1, 2]
    assert cols["customdata"].tolist() == [0, 1, 2]
    assert list(cols["marker.color"]) == list(plots.strip_colors([s.prob_final for s in steps]))
    assert list(cols["marker.pattern.shape"]) == ["", "x", ""]
    assert cols["marker.line.width"][0] > cols["marker.line.width"][1]  # prefill outlined
    assert list(cols["text"]) == [plots.show_token(s.token_text) for s in steps]
    ent = plots.strip_columns(steps, "entropy")["tokens"]["marker.color"]
    assert list(ent) == list(plots.strip_colors([s.entropy_final for s in steps], "entropy"))
    with pytest.raises(ValueError, match="color_by"):
        plots.strip_columns(steps, "rank")


def test_strip_colors_follow_the_scale():
    # red for unlikely / uncertain, green for likely / certain; out-of-range values clamp to the ends
    red, green = plots.strip_colors([0.0, 1.0])
    assert (
        red == plots.strip_colors([-3.0])[0]
        and green == plots.strip_colors([7.0])[0]
        and red != green
    )
    assert list(plots.strip_colors([0.0, 5.0], "entropy")) == [green, red]
    assert len(plots.strip_colors([])) == 0


def test_token_strip_window_keeps_the_last_tokens():
    fig = plots.token_strip(make_trace(12), window=5)
    assert list(fig.data[0].x) == [7, 8, 9, 10, 11]
    lo, hi = fig.layout.xaxis.range
    assert lo < 7 <= 11 < hi


# --- distribution ------------------------------------------------------------------------------------------


def test_distribution_columns_bars_chosen_and_stages():
    step = make_step(2)
    cols = plots.distribution_columns(step, top_n=4)
    assert cols["raw"]["y"].tolist() == pytest.approx([t["raw"] for t in step.top[:4]])
    assert cols["final"]["y"].tolist() == pytest.approx([t["final"] for t in step.top[:4]])
    assert cols["final"]["customdata"].tolist() == [t["id"] for t in step.top[:4]]
    widths = cols["final"]["marker.line.width"].tolist()
    assert (
        widths.index(max(widths)) == 2 and sorted(widths)[-2] == 0
    )  # only the chosen bar is outlined
    assert list(cols["stages"]["x"]) == ["repetition penalty", "top k", "top p"]
    assert cols["stages"]["y"].tolist() == pytest.approx([1.0, 0.8, 0.9])
    assert list(cols["stages"]["text"]) == ["4,096", "40", "12"]


def test_distribution_cdf_and_the_draw():
    step = make_step(3)
    cols = plots.distribution_columns(step)
    cdf = cols["cdf"]["y"]
    assert np.all(np.diff(cdf) >= 0)
    assert cdf[-1] == pytest.approx(sum(t["final"] for t in step.top))
    assert cols["u"]["y"].tolist() == [step.draw["u"]] * 2
    # the u label at the line's right end (at its left end it sat on the chosen band)
    assert cols["u"]["text"][0] == "" and cols["u"]["text"][1].startswith("u = ")
    assert cols["u"]["textposition"][1].endswith("left")
    assert cols["chosen band"]["y"].tolist() == [step.draw["cdf_lo"], step.draw["cdf_hi"]]
    assert cols["chosen band"]["x"].tolist() == [step.rank_final] * 2
    greedy = plots.distribution_columns(make_step(3, greedy=True))
    assert "greedy" in greedy["u"]["text"][0] and greedy["u"]["textposition"][0] == "top right"
    forced = plots.distribution_columns(make_step(3, forced=True, greedy=True))
    assert "forced" in forced["u"]["text"][0]


def test_distribution_labels_and_figure():
    step = make_step(1)
    labels = plots.distribution_labels(step, top_n=3)
    assert labels["xaxis.ticktext"] == ["·w0", "·w1", "·w2"]
    assert "Step 1" in labels["title.text"] and "sampled" in labels["title.text"]
    fig = plots.distribution(step, top_n=3)
    assert len(by_name(fig, "final").y) == 3
    assert fig.layout.xaxis.ticktext == ("·w0", "·w1", "·w2")


# --- latency, traffic, roofline ------------------------------------------------------------------------------


def test_latency_phases_and_earlier_run():
    trace = make_trace(5)
    earlier = make_trace(3)
    earlier.settings["use_cache"] = False
    fig = plots.latency(trace, earlier)
    assert list(by_name(fig, "prefill").x) == [0]
    assert list(by_name(fig, "decode").x) == [1, 2, 3, 4]
    assert list(by_name(fig, "decode").y) == pytest.approx(
        [s.latency_s * 1e3 for s in trace.steps[1:]]
    )
    assert fig.data[0].name == "earlier run (cache off)"
    assert len(fig.data[0].y) == 3
    assert "measured" in fig.layout.title.text


def test_traffic_parts_add_up_to_the_step_bytes():
    trace = make_trace(4)
    cols = plots.traffic_columns(trace.steps)
    total = sum(cols[part]["y"] for part in plots.TRAFFIC_PARTS)
    assert total.tolist() == pytest.approx([s.total_bytes / plots.MB for s in trace.steps])
    assert cols["weights"]["y"][0] == pytest.approx(3.5)  # attention + mlp + lm_head, MB
    assert cols["other"]["y"].tolist() == [0, 0, 0, 0]
    achieved = cols["achieved GB/s"]["y"]
    assert achieved[0] == pytest.approx(0.7)  # given by the engine
    s1 = trace.steps[1]
    assert achieved[1] == pytest.approx(s1.total_bytes / s1.latency_s / 1e9)  # derived when missing
    assert cols["KV cache"]["y"].tolist() == pytest.approx(
        [s.kv_cache_bytes / plots.MB for s in trace.steps]
    )
    assert (
        plots.traffic_group("weights/mlp") == "weights" and plots.traffic_group("lora") == "other"
    )


def test_traffic_figure_draws_the_measured_peak_once():
    fig = plots.traffic(make_trace(3))
    assert len(fig.layout.shapes) == 1 and fig.layout.shapes[0].y0 == 10.0
    plots.set_peak_bandwidth(fig, 20.0)
    assert len(fig.layout.shapes) == 1 and fig.layout.shapes[0].y0 == 20.0
    assert sum("measured peak" in (a.text or "") for a in fig.layout.annotations) == 1
    plots.set_peak_bandwidth(fig, None)
    assert len(fig.layout.shapes) == 0


def test_roofline_points_and_ceilings():
    trace = make_trace(4)
    fig = plots.roofline(trace, {"Chip A": {"bandwidth_gbps": 100.0, "flops": 1e13}})
    dec = by_name(fig, "decode")
    s = trace.steps[1]
    assert dec.x[0] == pytest.approx(s.flops / s.total_bytes)
    assert dec.y[0] == pytest.approx(s.flops / s.latency_s)
    assert list(dec.customdata) == [1, 2, 3]
    measured = next(t for t in fig.data if t.name.startswith("this machine (measured"))
    x, y = np.asarray(measured.x), np.asarray(measured.y)
    assert np.allclose(y, np.minimum(1e11, x * 10e9))
    chip = next(t for t in fig.data if t.name.startswith("Chip A"))
    assert "modelled" in chip.name and chip.visible == "legendonly"
    plots.set_ceilings(fig, None)  # peaks unknown: only the points (and the overhead marks) stay
    assert [t.name for t in fig.data] == ["prefill", "decode", plots.OVERHEAD_CEILING]


def test_roofline_skips_steps_without_costs():
    steps = [make_step(0), make_step(1)]
    steps[1].flops = None
    assert "decode" not in plots.roofline_columns(steps)


def test_figure_html_is_standalone():
    page = plots.figure_html(plots.latency(make_trace(3)), title="latency")
    assert "<html>" in page[:100] and "plotly.js" in page.lower() and len(page) > 1_000_000
    assert "<script src=" not in page  # plotly.js inlined, no CDN: opens offline


def test_charts_replay_from_a_saved_trace():
    trace = make_trace(6)
    again = Trace.from_json(trace.to_json())
    for chart in (plots.token_strip, plots.latency, plots.traffic, plots.roofline):
        a, b = chart(trace), chart(again)
        assert [list(t.y) for t in a.data if t.y is not None] == [
            list(t.y) for t in b.data if t.y is not None
        ]


# --- speculative ----------------------------------------------------------------------------------------------


def make_round(index: int, k: int, accepted: int, bonus: bool) -> dict:
    drafts = []
    for i in range(k):
        state = True if i < accepted else (False if i == accepted else None)
        drafts.append(
            {
                "id": 10 + i,
                "text": f"d{i}",
                "q": 0.5,
                "p": 0.4,
                "accept_prob": 0.8,
                "overlap": 0.7,
                "u": 0.1,
                "accepted": state,
                "draw": {},
            }
        )
    residual = None if bonus else {"position": accepted, "id": 99, "text": "r", "mass": 0.3}
    return {
        "index": index,
        "k": k,
        "drafts": drafts,
        "accepted": accepted,
        "residual": residual,
        "bonus": {"id": 77, "text": "b", "p": 0.6} if bonus else None,
    }


def test_rounds_columns_mark_every_outcome():
    rounds = [make_round(0, 3, 3, bonus=True), make_round(1, 3, 1, bonus=False)]
    cols = plots.rounds_columns(rounds)
    assert cols["accepted"]["x"].tolist() == [0, 1, 2, 0]
    assert cols["accepted"]["y"].tolist() == [0, 0, 0, 1]
    assert cols["bonus"]["x"].tolist() == [3] and cols["bonus"]["y"].tolist() == [0]
    assert cols["rejected"]["x"].tolist() == [1] and cols["rejected"]["y"].tolist() == [1]
    assert cols["not tested"]["x"].tolist() == [2]
    assert cols["resampled"]["x"].tolist() == [1] and list(cols["resampled"]["text"]) == ["r"]


def test_alpha_columns_append_equals_one_shot():
    rounds = [make_round(0, 4, 4, True), make_round(1, 4, 0, False), make_round(2, 4, 2, False)]
    whole = plots.alpha_columns(rounds)
    counts: dict = {"tested": 0, "accepted": 0, "overlap_sum": 0.0, "overlap_n": 0}
    parts = [plots.alpha_columns([r], counts) for r in rounds]
    run = np.concatenate([p["running alpha (accepted / tested)"]["y"] for p in parts])
    assert run.tolist() == pytest.approx(whole["running alpha (accepted / tested)"]["y"].tolist())
    assert run[-1] == pytest.approx((4 + 0 + 2) / (4 + 1 + 3))
    assert whole["accepted / k this round"]["y"].tolist() == pytest.approx([1.0, 0.0, 0.5])


def test_speedup_columns_keep_missing_values_as_gaps():
    rows = [
        {"k": 1, "predicted": 1.2, "predicted_with_verify_cost": 1.1, "measured": 0.9},
        {"k": 2, "predicted": None, "predicted_with_verify_cost": None, "measured": 1.3},
    ]
    fig = plots.speedup_figure(rows)
    pred = fig.data[0].y
    assert pred[0] == pytest.approx(1.2) and math.isnan(pred[1])
    assert list(by_name(fig, "measured (forward passes)").y) == pytest.approx([0.9, 1.3])


# --- sweeps ---------------------------------------------------------------------------------------------------------


def test_sweep_columns_from_experiment_tables():
    import pandas as pd

    cache = pd.DataFrame(
        {
            "mode": ["cache on"] * 2 + ["cache off"] * 2,
            "step": [0, 1, 0, 1],
            "latency_s_measured": [0.01, 0.002, 0.01, 0.004],
            "cumulative_s_measured": [0.01, 0.012, 0.01, 0.014],
            "cumulative_bound_s_modelled": [0.001, 0.0012, 0.001, 0.0015],
        }
    )
    cols = plots.sweep_columns("cache", cache)
    assert cols["cache off: per step (measured)"]["y"].tolist() == pytest.approx([10.0, 4.0])
    assert cols["cache on: cumulative bound (modelled)"]["y"].tolist() == pytest.approx(
        [0.001, 0.0012]
    )
    batch = pd.DataFrame(
        {
            "batch": [1, 2],
            "tokens_per_s_total_measured": [100.0, 190.0],
            "tokens_per_s_total_bound_modelled": [500.0, 1000.0],
            "tokens_per_s_per_user_measured": [100.0, 95.0],
            "latency_s_measured": [0.01, 0.0105],
            "bound_s_modelled": [0.002, 0.002],
        }
    )
    batch.attrs["knee_batch_modelled"] = 64
    fig = plots.sweep("batch", batch)
    assert list(by_name(fig, "total (measured)").y) == [100.0, 190.0]
    assert fig.layout.shapes[0].x0 == 64 and "knee at B = 64" in fig.layout.title.text
    dt = pd.DataFrame(
        {
            "dtype": ["float32", "float16"],
            "latency_s_measured": [0.01, None],
            "bound_s_modelled": [0.002, None],
            "weight_bytes_counted": [4e6, None],
            "kv_cache_bytes_measured": [1e5, None],
        }
    )
    cols = plots.sweep_columns("dtype", dt)
    assert list(cols["latency (measured)"]["x"]) == ["float32", "float16"]
    assert math.isnan(cols["latency (measured)"]["y"][1])  # unsupported dtype: a gap, not a zero
    with pytest.raises(ValueError, match="unknown sweep"):
        plots.sweep_figure("width")
    for (
        kind
    ) in sweeps.names():  # every measured trace has a modelled partner, told apart by its name
        names = [t.name for t in plots.sweep_figure(kind).data]
        assert any("measured" in n for n in names) and any("modelled" in n for n in names)


# --- why this time? and inside ------------------------------------------------------------------------


def split_step(i: int = 3):
    from explorer.costs.hardware import Peaks
    from explorer.costs.split import split_step as split_of

    s = make_step(i)
    s.overhead_floor_s = 0.002
    for k, v in split_of(s, Peaks(**PEAKS)).items():
        if hasattr(s, k):
            setattr(s, k, v)
    return s


def test_split_bar_adds_up_to_the_measured_latency():
    s = split_step()
    stack = plots.split_stack(s)
    assert sum(stack.values()) == pytest.approx(s.latency_s, rel=1e-12)
    assert list(stack)[-1] == "overhead" and stack["overhead"] == pytest.approx(s.overhead_s)
    fig = plots.split_figure(s)
    assert sum(t.x[0] for t in fig.data) == pytest.approx(s.latency_s * 1e3)
    assert (
        f"MBU {s.mbu:.2f}" in fig.layout.title.text and f"{s.regime}-bound" in fig.layout.title.text
    )
    bare = make_step(2)  # no peaks: no split, said in the title, no bars
    assert (
        plots.split_stack(bare) is None and "no split" in plots.split_figure(bare).layout.title.text
    )


def test_roofline_overhead_ceiling_and_split_hover():
    steps = [split_step(i) for i in range(3)]
    cols = plots.roofline_columns(steps)
    ceiling = cols[plots.OVERHEAD_CEILING]
    assert ceiling["y"][1] == pytest.approx(steps[1].flops / 0.002)
    assert "overhead floor 2 ms" in ceiling["hovertext"][1]
    assert "MBU" in cols["decode"]["hovertext"][0] and "-bound" in cols["decode"]["hovertext"][0]
    assert plots.OVERHEAD_CEILING not in plots.roofline_columns([make_step(1)])  # no floor measured


def test_profile_and_trust_figures():
    profile = {
        "step": 3, "phase": "decode", "device": "cpu", "dtype": "float32", "repeats": 3,
        "wall_s": 0.004, "python_share": 0.4, "coverage": 0.98,
        "parts": [
            {"part": "mlp", "time_s": 0.001, "share": 0.25, "floor_s": 0.0002},
            {"part": "framework/python", "time_s": 0.0016, "share": 0.4, "floor_s": None},
            {"part": "sampling", "time_s": 0.0, "share": 0.0, "floor_s": None},
        ],
    }  # fmt: skip
    fig = plots.profile_figure(profile)
    bars = by_name(fig, "time (measured)")
    assert list(bars.y) == ["mlp", "framework/python"] and bars.x[1] == pytest.approx(1.6)
    assert (
        "40% framework/Python" in fig.layout.title.text
        and "98% attributed" in fig.layout.title.text
    )
    rows = [{"prediction": "step latency = roofline bound", "group": "decode / overhead", "n": 5,
             "predicted": 0.001, "measured": 0.004, "err_pct": -75.0, "abs_err_pct": 75.0,
             "unit": "s", "basis": "modelled"}]  # fmt: skip
    table = plots.trust_figure(rows).data[0]
    assert list(table.cells.values[3]) == ["1 ms"] and list(table.cells.values[5]) == ["-75%"]
    assert "no predictions" in plots.trust_figure([]).layout.title.text


def test_lens_and_attention_figures():
    lens = [
        {"layer": i, "top": [{"id": 1, "text": " a", "prob": 0.2 * (i + 1)}, {"id": 2, "text": "b", "prob": 0.1}],
         "prob_chosen": 0.2 * (i + 1), "rank_chosen": 0, "entropy": 2.0 - i, "kl_to_final": 1.0 - 0.5 * i}
        for i in range(3)
    ]  # fmt: skip
    fig = plots.lens_figure(lens)
    heat = fig.data[0]
    assert (
        list(heat.y) == [0, 1, 2] and heat.z[2][0] == pytest.approx(0.6) and heat.text[0][0] == "·a"
    )
    assert list(by_name(fig, "prob of the chosen token").x) == pytest.approx([0.2, 0.4, 0.6])
    att = {
        "layers": 2, "heads": 2, "positions": [0, 1, 2], "tokens": ["a", "b", "c"],
        "weights": [[[0.5, 0.25, 0.25], [0.9, 0.05, 0.05]], [[0.2, 0.3, 0.5], [0.6, 0.2, 0.2]]],
        "mean": [[0.7, 0.15, 0.15], [0.4, 0.25, 0.35]], "max": [[0.9, 0.25, 0.25], [0.6, 0.3, 0.5]],
        "sink": [0.7, 0.4],
    }  # fmt: skip
    assert plots.attention_rows(att, 1) == [[0.9, 0.05, 0.05], [0.6, 0.2, 0.2]]
    assert plots.attention_rows(att, "max") == att["max"]
    with pytest.raises(ValueError, match="heads 0..1"):
        plots.attention_rows(att, 2)
    fig = plots.attention_figure(att, "mean")
    assert (
        "55% on the first token" in fig.layout.title.text
        and "mean over heads" in fig.layout.title.text
    )


def test_log_axes_label_ticks_in_full_and_only_decades_when_wide():
    import plotly.graph_objects as go

    from explorer.plots.common import log_ticks, si_label
    from explorer.plots.sweeps import sweep_figure

    assert [si_label(v) for v in (0.02, 5, 20, 2000, 5e9, 1e12)] == [
        "0.02", "5", "20", "2k", "5G", "1T",
    ]  # fmt: skip
    batch = sweep_figure("batch")
    log_axes = [ax for ax in batch.select_xaxes() if ax.type == "log"]
    assert log_axes, "the batch sweep draws batch size on a log axis"
    for ax in log_axes:  # 1-2-5 ticks, each written out ("20", not a lone "2" after "10")
        labels = dict(zip(ax.tickvals, ax.ticktext))
        assert labels[20.0] == "20" and labels[500.0] == "500" and labels[2000.0] == "2k"
    wide = go.Figure(go.Scatter(x=[1, 10, 1e6], y=[1, 2, 3]), layout=dict(xaxis_type="log"))
    log_ticks(wide)
    assert 2.0 not in wide.layout.xaxis.tickvals and 1e6 in wide.layout.xaxis.tickvals
    narrow = go.Figure(go.Scatter(x=[1, 30], y=[1, 2]), layout=dict(xaxis_type="log"))
    assert 2.0 in log_ticks(narrow).layout.xaxis.tickvals


def test_a_chart_with_its_own_log_ticks_keeps_them():
    from explorer.plots.sweeps import sweep_figure

    pays = sweep_figure("pays")
    assert any("×" in t for t in pays.layout.yaxis.ticktext)  # speedup ticks, not 1-2-5


def test_the_why_charts_keep_their_titles_clear_of_the_toolbar():
    from explorer.plots.why import profile_figure, split_figure

    for fig in (split_figure(), profile_figure()):
        assert fig.layout.title.xanchor == "left" and fig.layout.title.x < 0.05
        assert fig.layout.modebar.orientation == "v"  # the buttons stand down the right edge
        assert fig.layout.margin.r >= 40  # ... in a margin of their own, off the bars
