"""session.routing(): the routers' choices per step and layer, as plain data, on a tiny random
Qwen3-MoE built here; a dense model says it is dense."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from explorer import Session
from explorer.engine.routing import capture, moe_routers, routing_of
from explorer.engine.trace import Trace
from explorer.model.loader import LoadedModel, model_info

E, K = 6, 2
PROMPTS = [[1, 5, 7, 9, 11], [3, 4, 2, 8, 6]]


def _tiny(norm_topk_prob: bool) -> LoadedModel:
    config = Qwen3MoeConfig(
        vocab_size=128, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        num_experts=E, num_experts_per_tok=K, norm_topk_prob=norm_topk_prob,
        max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(config).eval()
    info = model_info(model, name="tiny-moe", source="local", random_weights=True)
    return LoadedModel(model=model, tokenizer=None, info=info)


@pytest.fixture(scope="module")
def tiny_moe() -> LoadedModel:
    return _tiny(norm_topk_prob=True)


@pytest.fixture(scope="module")
def stepped(tiny_moe) -> Session:
    session = Session(tiny_moe, PROMPTS, max_new_tokens=3, roofline=False)
    session.run()
    return session


def test_every_token_has_k_experts_whose_weights_sum_to_one(stepped):
    out = stepped.routing()
    assert not out["dense"] and out["num_experts"] == E and out["experts_per_token"] == K
    assert out["layers"] == [0, 1] and len(out["steps"]) == 3
    # a step keeps what it touched; each token's choice is fetched on demand (a replay of it)
    assert all("experts" not in layer for s in stepped.trace.steps for layer in s.routing["layers"])
    for i, recorded in enumerate(out["steps"]):
        (step,) = stepped.routing(step=i)["steps"]
        assert [r["touched"] for r in step["layers"]] == [r["touched"] for r in recorded["layers"]]
        assert [r["load"] for r in step["layers"]] == [r["load"] for r in recorded["layers"]]
        tokens = step["batch"] * (5 if step["phase"] == "prefill" else 1)
        assert step["tokens"] == tokens == step["tokens_kept"]
        for layer in step["layers"]:
            assert len(layer["experts"]) == tokens
            for ids, weights in zip(layer["experts"], layer["weights"]):
                assert len(set(ids)) == K and all(0 <= i < E for i in ids)
                assert sum(weights) == pytest.approx(1.0, abs=1e-5)  # norm_topk_prob
            chosen = {i for ids in layer["experts"] for i in ids}
            assert layer["touched"] == sorted(chosen)
            assert sum(layer["load"]) == tokens * K
        assert step["experts_touched"] == [len(r["touched"]) for r in step["layers"]]


def test_step_bytes_count_the_experts_the_router_touched(stepped, tiny_moe):
    from explorer import costs

    shape = costs.shape_of(tiny_moe.info)
    one_expert = shape.expert_params * shape.bytes_per_value
    for step in stepped.trace.steps:
        touched = sum(step.routing["experts_touched"])
        assert step.bytes["weights/experts"] == touched * one_expert
    out = stepped.routing(step=1)
    assert len(out["steps"]) == 1
    assert out["steps"][0]["experts_touched_formula"] == pytest.approx(E * (1 - (1 - K / E) ** 2))


def test_load_per_expert_over_the_trace(stepped):
    out = stepped.routing()
    assert len(out["load"]) == 2 and all(len(row) == E for row in out["load"])
    routed = sum(s["tokens"] for s in out["steps"]) * K
    assert [sum(row) for row in out["load"]] == [routed, routed]


def test_unnormalised_router_weights_sum_below_one():
    lm = _tiny(norm_topk_prob=False)
    session = Session(lm, [PROMPTS[0]], max_new_tokens=1, roofline=False)
    session.step()
    for layer in session.routing(step=0)["steps"][0]["layers"]:
        for weights in layer["weights"]:
            assert 0 < sum(weights) < 1  # the k largest of E softmax probabilities


def test_capture_is_bounded_and_removes_its_hooks(tiny_moe):
    routers = [r for _, r in moe_routers(tiny_moe.model)]
    ids = torch.tensor(PROMPTS)
    with capture(tiny_moe.model) as cap, torch.inference_mode():
        assert all(len(r._forward_hooks) == 1 for r in routers)
        tiny_moe.model(input_ids=ids)
    assert all(len(r._forward_hooks) == 0 for r in routers)
    rec = cap.record(max_tokens=3)
    assert rec["tokens"] == 10 and rec["tokens_kept"] == 3
    for layer in rec["layers"]:
        assert len(layer["experts"]) == len(layer["weights"]) == 3
        assert sum(layer["load"]) == 10 * K  # touched and load count every token


def test_routing_survives_a_saved_trace(stepped):
    loaded = Trace.from_json(stepped.trace.to_json())
    assert routing_of(loaded) == json.loads(json.dumps(stepped.routing()))


def test_dense_model_says_dense(target):
    session = Session(target, "The return statement", max_new_tokens=1, roofline=False)
    session.step()
    out = session.routing()
    assert out["dense"] and out["steps"] == [] and out["load"] == []
    assert "dense" in out["message"] and "no router" in out["message"]
    assert session.trace.steps[0].routing is None
    with capture(target.model) as cap:
        assert cap is None


def test_bad_step_is_one_clear_error(stepped):
    with pytest.raises(ValueError, match="step must be one of the recorded steps 0..2"):
        stepped.routing(step=7)
