"""Measured per operator: each op of the running model has its measured time or says where it is."""

from __future__ import annotations

import pytest

from explorer import Session
from explorer.costs.opprofile import GROUPS, _aten_op, profile_session_ops, step_table
from explorer.inside.hooks import hook_count


def _check_rows(rows, wall_s):
    names = {r["name"] for r in rows}
    for r in rows:
        if r["measured_s"] is None:
            holder = GROUPS[r["name"]]
            assert holder in names and f"in {holder}'s time" in r["measured_note"], r
            assert f"(part {r['part']})" in r["measured_note"]
        else:
            assert r["measured_s"] >= 0 and r["measured_bound"] in ("memory", "compute", "overhead")
    measured = sum(r["measured_s"] or 0.0 for r in rows)
    assert measured >= wall_s * 0.999  # every second of the profiled step sits in some row
    return {r["name"]: r for r in rows}


def test_bundled_target_decode_step_measured_per_operator(target):
    s = Session(target, "Once upon a time")
    for _ in range(3):
        s.step()
    before = [st.token_id for st in s.trace.steps]
    p = profile_session_ops(s, repeats=2)
    assert p["step"] == 2 and p["phase"] == "decode" and p["repeats"] == 2
    rows = _check_rows(p["rows"], p["wall_s"])
    for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                 "attn_norm", "mlp_norm", "lm_head", "final_norm", "kv_write", "attention"):  # fmt: skip
        assert rows[name]["measured_s"] > 0, name
    assert rows["mlp_residual"]["measured_s"] is None  # the two adds are one measured group
    for r in p["rows"]:  # honest numbers: no matmul measured under its roofline floor
        if r["kind"] == "matmul":
            assert r["measured_s"] >= r["time_s"], (r["name"], r["measured_s"], r["time_s"])
    assert rows["framework/python"]["measured_bound"] == "overhead"
    assert hook_count(target.model) == 0 and [st.token_id for st in s.trace.steps] == before
    # the modelled side is the recorded step's own table
    table = step_table(target.info, s.trace.steps[2])
    assert [op.name for op in table.ops] == [r["name"] for r in p["rows"][: len(table.ops)]]


def test_moe_experts_measured_as_one_group():
    from explorer import load

    s = Session(load("bundled:moe"), "Once upon a time")
    s.step()
    s.step()
    p = profile_session_ops(s, repeats=1)
    rows = _check_rows(p["rows"], p["wall_s"])
    assert rows["experts_gate_up"]["measured_s"] > 0 and rows["router"]["measured_s"] > 0
    assert "experts_down" in rows["experts_gate_up"]["measured_note"]
    assert rows["experts_down"]["measured_s"] is None


@pytest.mark.parametrize(
    "owner, aten, family, op",
    [("ie:attention", "aten::scaled_dot_product_attention", "swiglu", "attention"),
     ("ie:attention", "aten::mul", "swiglu", "rope"), ("ie:attention", "aten::view", "gelu",
     "attention"), ("ie:attention", "aten::_softmax", "swiglu", "softmax"),
     ("ie:mlp", "aten::mul", "swiglu", "act_mul"), ("ie:layer", "aten::add", "swiglu",
     "attn_residual"), ("ie:layer3/kv_update", "aten::cat", "swiglu", "kv_write"),
     ("ie:op/q_proj", "aten::addmm", "swiglu", "q_proj")],
)  # fmt: skip
def test_aten_ops_go_to_their_operator(owner, aten, family, op):
    assert _aten_op(owner, aten, family) == op
