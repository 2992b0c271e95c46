"""Memory is checked before it is spent: a refusal names what is needed and what is free.

Every test here fakes a small machine (available_bytes patched), so nothing large is allocated;
the loader's weight fill is made to fail, so a check that let a model through would show.
"""

from __future__ import annotations

import math

import pytest

from explorer.model import device as device_mod
from explorer.model import loader
from explorer.model.memory import NotEnoughMemory

GiB = 2**30


@pytest.fixture
def machine(monkeypatch):
    """A machine with `free` bytes available; the loader never fills weights."""

    def with_free(free: int):
        monkeypatch.setattr(device_mod, "available_bytes", lambda dev: free)

        def no_fill(*a, **k):
            raise AssertionError("weights were allocated before the memory check refused them")

        monkeypatch.setattr(loader, "_fill_random", no_fill)

    return with_free


def test_an_8b_shape_in_fp32_is_refused_and_bf16_offered(machine):
    machine(20 * GiB)
    with pytest.raises(NotEnoughMemory) as err:
        loader.load("arch:llama-3.1-8b", device="cpu", dtype="float32")
    text = str(err.value)
    assert "arch:llama-3.1-8b (float32)" in text and "20.0 GiB available" in text
    assert "29.9 GiB needed" in text and "--dtype bfloat16" in text
    assert "\n" not in text


def test_a_shape_too_big_in_any_dtype_offers_smaller_shapes(machine):
    machine(1 * GiB)
    with pytest.raises(NotEnoughMemory, match=r"shapes that fit in bfloat16: .*arch:smollm2-135m"):
        loader.load("arch:mistral-7b", device="cpu", dtype="bfloat16")


def test_a_static_cache_beyond_the_positions_or_the_memory_is_refused(target, monkeypatch):
    from explorer import Session

    limit = target.info.max_positions
    with pytest.raises(
        ValueError,
        match=f"cache_len 2,000,000 needs 2,000,000 positions, more than .*context of {limit:,} positions",
    ):
        Session(target, "Hi", cache="static", cache_len=2_000_000)
    monkeypatch.setattr(device_mod, "available_bytes", lambda dev: 1024)
    with pytest.raises(NotEnoughMemory, match="a static cache of .* positions x 1 row"):
        Session(target, "Hi", cache="static", cache_len=limit)


def test_lognormal_lengths_are_checked_before_prompts_are_built(target):
    from explorer.serving import Workload
    from explorer.serving.workload import WorkloadError

    wl = Workload(num_prompts=8, input_dist="lognormal", input_spread=50.0, seed=3)
    with pytest.raises(WorkloadError, match=r"request \d+ samples .* context of .* spread 50"):
        wl.requests(target)


def test_two_hundred_million_prompts_are_refused_before_building(monkeypatch):
    from explorer.serving import Workload
    from explorer.serving.workload import WorkloadError

    monkeypatch.setattr(device_mod, "available_bytes", lambda dev: 16 * GiB)
    wl = Workload(num_prompts=200_000_000)
    with pytest.raises(WorkloadError, match=r"num_prompts: 200,000,000 requests .* 16\.0 GiB"):
        wl.requests(vocab_size=1000)


@pytest.mark.parametrize("field", ["input_spread", "output_spread"])
def test_a_nan_spread_is_refused(field):
    from explorer.serving import Workload
    from explorer.serving.workload import WorkloadError

    with pytest.raises(WorkloadError, match=f"{field} must be a finite number >= 0, got nan"):
        Workload(**{field: math.nan})


def test_regime_map_checks_memory_before_the_prefill(target, monkeypatch):
    from explorer.sweeps import regime_map

    def no_prefill(*a, **k):
        raise AssertionError("prefilled before the memory check")

    monkeypatch.setattr(regime_map, "prefill_cache", no_prefill)
    with pytest.raises(
        ValueError, match="regime map: no cell fits in memory: batch 1 at context 64"
    ):
        regime_map.run(
            target, batches=[1, 4], contexts=[64, 128], memory_limit_bytes=1024, bar=False
        )
