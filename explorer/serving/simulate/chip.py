"""The chip machine: a known chip on paper turns an iteration's work into time and says what
limits it (the fitted machine is steptime.StepModel; both answer step() with a Step).

One iteration on `tp` GPUs of a chip (CHIP_RULE), from iteration_work at the what-if's bytes:

    GEMM      = max(weight bytes / sustained bandwidth, GEMM FLOPs / achieved FLOP/s)
                (one fused GEMM over every query token of the iteration, prefill and decode)
    attention = max(decode KV bytes / bandwidth, decode attention FLOPs / FLOP/s)
              + max(prefill KV bytes / bandwidth, prefill attention FLOPs / FLOP/s)
    seconds   = (GEMM + attention) / tp + per-step overhead + layers x per-layer overhead
              + requests x per-request overhead + 2 all-reduces per layer
    GEMM      >= 4 x layers x kernel launch floor (q/k/v, o, up, down: no kernel is faster)
    seconds   >= requests x the API server's seconds per streamed token (a process beside the
                 GPU: it paces the iteration only when it is the slower; 0 for offline runs)

The per-layer overhead is the GPU time of the layer's small kernels the work sum gives no bytes
(norms, RoPE, activation, residual add) at their launch floor; it is paid on every step, decode
included: we assume CUDA graphs (vLLM V1 captures decode and small mixed batches) remove the
CPU's launch cost, not the kernels' own time on the GPU, and that eager prefill steps' CPU
launches overlap the GPU (async scheduling), so prefill and decode steps pay the same per layer.
Those kernels' activation bytes at large token counts (14-21% of a layer's time in Vidur's
table) are not counted. The fitted values and the data behind each: explorer.serving.simulate.fit.

sustained bandwidth = peak x bw_efficiency and achieved FLOP/s = peak x flop_efficiency (both
stated what-if settings, explorer.serving.simulate.whatif_settings). Costing the mixed step as
one GEMM plus separate attentions follows BLIS (llm-d) and Vidur: costing prefill and decode as
separate passes over the weights over-estimates mixed steps. Each all-reduce moves
2 (N - 1) / N x tokens x hidden x bytes over the interconnect (the chip table's per-direction
figure) plus a fixed latency.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from explorer.costs.parts import Shape
from explorer.serving.simulate.steptime import IterationTime, StepModel, largest
from explorer.serving.simulate.work import Footprint, Work, iteration_work

GEMMS_PER_LAYER = 4  # q/k/v, o, MLP up (+gate), MLP down: the kernels the launch floor applies to
CHIP_RULE = (
    "seconds = [max(weight bytes / BW, GEMM FLOPs / FLOP/s) (one fused GEMM over all tokens) "
    "+ max(decode KV bytes / BW, decode attention FLOPs / FLOP/s) + max(prefill KV bytes / BW, "
    "prefill attention FLOPs / FLOP/s)] / tp, BW = peak bandwidth x bw_efficiency, FLOP/s = "
    "peak x flop_efficiency; the GEMM at least 4 x layers x a kernel launch floor; + per-step "
    "overhead + layers x per-layer overhead + requests x per-request overhead + 2 "
    "all-reduces per layer (2 (N-1)/N x tokens x hidden x bytes / interconnect + latency); at "
    "least requests x the API server's seconds per streamed token; each request's TTFT and E2E "
    "+ a fixed request latency"
)


@dataclass
class ChipStepModel(StepModel):
    """StepModel on paper for `tp` x `chip` (see CHIP_RULE); method 'modelled'."""

    chip: str = ""
    tp: int = 1
    bandwidth_gbps: float = 0.0
    tflops: float = 0.0
    interconnect_gbps: float | None = None
    weight_bytes: float = 0.0  # every weight once (fp8 matmuls: 1 byte per value)
    expert_bytes: float = 0.0  # one routed expert of one layer (MoE; 0: dense)
    expert_parallel: bool = False  # MoE: experts split whole across the GPUs (bytes as TP's)
    kv_bytes_per_token: float = 0.0  # K and V of one token, all layers, at the KV dtype
    act_bytes: int = 2  # bytes per activation value moved by the all-reduces
    request_latency_s: float = 0.0  # added to each request's TTFT and E2E (see run.simulate)
    settings: dict = field(default_factory=dict)

    @property
    def footprint(self) -> Footprint:
        """The bytes the work is counted at (the what-if's precision, tp GPUs)."""
        return Footprint(self.weight_bytes, self.kv_bytes_per_token, self.expert_bytes, self.tp)

    def work(self, shape: Shape, passes: list[list[int]]) -> Work:
        return iteration_work(shape, passes, self.footprint)

    def step(self, shape: Shape, passes: list[list[int]]) -> IterationTime:
        w = self.work(shape, passes)
        memory = compute = 0.0
        floor = GEMMS_PER_LAYER * shape.layers * self.settings.get("kernel_floor_s", 0.0)
        for nbytes, flops, least in (
            (w.weight_bytes, w.gemm_flops, floor),
            (w.kv_bytes_decode, w.attn_flops_decode, 0.0),
            (w.kv_bytes_prefill, w.attn_flops_prefill, 0.0),
        ):
            on_memory, on_compute = self.roof(nbytes, flops)
            if max(on_memory, on_compute) < least:  # the kernels' launch floor binds
                on_memory = least
            if on_memory >= on_compute:
                memory += on_memory
            else:
                compute += on_compute
        overheads = (
            self.iteration_s
            + self.request_s * len(passes)
            + self.settings.get("layer_overhead_s", 0.0) * shape.layers
            + self.allreduce_s(shape, w)
        )
        seconds = memory + compute + overheads
        streamed = self.settings.get("stream_token_s", 0.0) * len(passes)  # beside the GPU
        if streamed > seconds:  # the API server is the slower: it sets the pace
            return IterationTime(streamed, "overheads", w)
        return IterationTime(seconds, largest(memory, compute, overheads), w)

    def roof(self, nbytes: float, flops: float) -> tuple[float, float]:
        """(memory, compute) seconds of one group of work spread over the tp GPUs, at the
        sustained bandwidth and FLOP/s (peak x efficiency): the group takes the larger."""
        bandwidth = self.bandwidth_gbps * 1e9 * self.settings["bw_efficiency"] * self.tp
        flop_s = self.tflops * 1e12 * self.settings["flop_efficiency"] * self.tp
        return nbytes / bandwidth, flops / flop_s

    def allreduce_s(self, shape: Shape, work) -> float:
        if self.tp == 1:
            return 0.0
        moved = 2 * (self.tp - 1) / self.tp * work["tokens"] * shape.hidden * self.act_bytes
        one = moved / (self.interconnect_gbps * 1e9) + self.settings["allreduce_latency_s"]
        return 2 * shape.layers * one


def chip_work(
    shape: Shape, passes, weight_bytes: float, kv_per_token: float, expert_bytes: float = 0.0
) -> Work:
    """iteration_work at the what-if's weight, expert and KV bytes (the old spelling)."""
    return iteration_work(shape, passes, Footprint(weight_bytes, kv_per_token, expert_bytes))
