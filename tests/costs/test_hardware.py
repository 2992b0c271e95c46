"""Measured peaks of this machine and the known-chip table."""

from __future__ import annotations

import json

import pytest
import torch

from explorer import costs
from explorer.costs import hardware
from explorer.model.loader import arch_info

REQUIRED_CHIPS = [
    "H200",
    "H100 SXM",
    "A100 80GB",
    "L4",
    "T4",
    "RTX 4090",
    "Apple M2",
    "Apple M3 Max",
    "Laptop CPU",
]


@pytest.fixture(scope="module")
def peaks():
    return hardware.measure("cpu", "float32")


def test_measure_reports_what_and_how(peaks):
    assert peaks.method == "measured" and peaks.device == "cpu" and peaks.dtype == "float32"
    assert peaks.copy_gbps > 0 and peaks.read_gbps > 0 and peaks.flops > 0
    assert peaks.bandwidth_gbps == max(peaks.copy_gbps, peaks.read_gbps)
    assert peaks.bound_gbps >= peaks.bandwidth_gbps  # best repeat >= median
    assert peaks.bound_flops >= peaks.flops
    d = peaks.details
    assert d["threads"] == torch.get_num_threads() and d["statistic"] == "median"
    assert d["buffer_bytes"] >= 64 << 20 and d["matmul_n"] >= 512
    assert d["copy"]["repeats"] == d["bandwidth_repeats"] and d["copy"]["warmup"] >= 1
    json.dumps(peaks.to_dict())  # plain data: goes into Trace.hardware


def test_measure_is_cached_per_device_and_dtype(peaks):
    assert hardware.measure("cpu", "float32") is peaks
    assert hardware.measure("cpu", torch.float32) is peaks  # torch dtypes name the same entry


def test_measure_other_dtype_shares_bandwidth(peaks):
    bf16 = hardware.measure("cpu", "bfloat16")
    assert bf16.dtype == "bfloat16" and bf16.flops > 0
    assert bf16.copy_gbps == peaks.copy_gbps  # bandwidth measured once per device


def test_measure_rejects_unknown_dtype():
    with pytest.raises(ValueError, match="unknown dtype"):
        hardware.measure("cpu", "float8")


def test_known_chips_have_sources():
    for name in REQUIRED_CHIPS:
        chip = hardware.KNOWN_CHIPS[name]
        assert chip.bandwidth_gbps > 0 and chip.fp32_tflops > 0 and chip.source
    # ordering sanity from the datasheets
    chips = hardware.KNOWN_CHIPS
    assert (
        chips["H200"].bandwidth_gbps
        > chips["H100 SXM"].bandwidth_gbps
        > chips["A100 80GB"].bandwidth_gbps
    )
    assert chips["H100 SXM"].bf16_tflops > chips["A100 80GB"].bf16_tflops > chips["L4"].bf16_tflops


def test_chip_peaks_are_labelled_modelled():
    p = hardware.chip_peaks("H100 SXM", "bfloat16")
    assert p.method == "modelled" and "datasheet" in p.details["source"]
    assert p.bandwidth_gbps == 3350 and p.flops == pytest.approx(989e12)
    assert hardware.chip_peaks("H100 SXM", "float32").flops == pytest.approx(67e12)
    with pytest.raises(ValueError, match="no published dense bfloat16"):
        hardware.chip_peaks("T4", "bfloat16")
    with pytest.raises(ValueError, match="unknown chip"):
        hardware.chip_peaks("TPU v9")


def test_what_would_this_step_cost_there():
    info = arch_info("llama-3.1-8b", "bfloat16")
    out = {
        name: costs.step_roofline(
            info,
            batch=1,
            tokens_fed=1,
            context_len=1024,
            use_cache=True,
            latency_s=None,
            peaks=hardware.chip_peaks(name, "bfloat16"),
        )
        for name in ("H200", "A100 80GB")
    }
    assert out["H200"]["bound"] == out["A100 80GB"]["bound"] == "memory"  # decode at B=1
    ratio = out["A100 80GB"]["bound_s"] / out["H200"]["bound_s"]
    assert ratio == pytest.approx(4800 / 2039)  # memory-bound: time scales with 1 / bandwidth


def test_bandwidth_for_uses_cache_speed_only_when_it_fits():
    p = hardware.Peaks(
        device="x",
        dtype="float32",
        bandwidth_gbps=10,
        flops=1e11,
        method="modelled",
        cache_gbps=50,
        cache_bytes=1 << 20,
        bound_gbps=12,
    )
    assert p.bandwidth_for(1 << 19) == 50
    assert p.bandwidth_for(1 << 21) == 12
    bare = hardware.Peaks(
        device="x", dtype="float32", bandwidth_gbps=10, flops=1e11, method="modelled"
    )
    assert bare.bandwidth_for(1) == 10 and bare.roofline_flops == 1e11


def test_last_level_cache_is_read_where_sysfs_has_it():
    import os

    base = "/sys/devices/system/cpu/cpu0/cache"
    if not os.path.isdir(base) or not any(e.startswith("index") for e in os.listdir(base)):
        pytest.skip(
            f"{base} does not list the CPU caches on this machine: the size is unknown here"
        )
    llc = hardware.last_level_cache_bytes(torch.device("cpu"))
    assert llc is not None and llc >= 1 << 16


def test_cli_hardware(capsys, peaks):
    from explorer.cli import main

    assert main(["hardware", "--device", "cpu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["measured"]["copy_gbps"] == peaks.copy_gbps  # the cached measurement
    assert {c["name"] for c in out["known_chips_modelled"]} >= set(REQUIRED_CHIPS)
    assert main(["hardware", "--device", "cpu"]) == 0
    text = capsys.readouterr().out
    assert "copy" in text and "GB/s" in text and "H200" in text and "datasheet" in text


def test_chip_peaks_take_short_names_and_fp8():
    assert hardware.chip_peaks("h100", "fp8").flops == pytest.approx(1979e12)
    assert hardware.chip_peaks("a100-40gb", "bf16").details["memory_gb"] == 40
    with pytest.raises(ValueError, match="known dtypes for it: float32, bfloat16, float16"):
        hardware.chip_peaks("a100", "fp8")
    with pytest.raises(ValueError, match="unknown dtype 'int4'"):
        hardware.chip_peaks("h100", "int4")
