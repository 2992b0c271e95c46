"""The knobs of the serving engines the published runs used, declared once each (setting(): range,
default, help), with that engine's own defaults: the simulator's policies for them
(explorer.serving.simulate.engine_policies) are built from these, and the CLI's flags read them.

Defaults, and where they come from:

    vllm      vLLM >= 0.8 (V1), vllm/engine/arg_utils.py (EngineArgs, the batch defaults): `vllm
              serve` on a GPU of >= 70 GiB whose name is not A100 (H100, H200, MI300X): 8,192
              batched tokens and 1,024 sequences; on an A100 or a smaller GPU: 2,048 and 256 (the
              offline LLM class: 16,384 / 1,024 and 8,192 / 256). The declared default is the
              H100 server's; on a chip, `vllm_defaults(chip)` applies the rule. Block size 16;
              prefix caching on (V1's default).
    vllm-v0   vLLM 0.6 (V0), vllm/config.py SchedulerConfig: without chunked prefill the token
              budget is max(max_model_len, 2048) (2,048 declared; S1 ran max_model_len 4096),
              256 sequences, --num-scheduler-steps 1 (S1 ran 10), block size 16.
    sglang    SGLang 0.3 python/sglang/srt/server_args.py: chunked_prefill_size 8192,
              max_prefill_tokens 16384, schedule_conservativeness 1.0, max_running_requests
              None (then the KV token slots / 2), a token-granular KV pool (page size 1);
              global_config.py: init_new_token_ratio 0.7, base_min_new_token_ratio 0.1,
              new_token_ratio_decay 0.001.
    trtllm    TensorRT-LLM 1.0 (PyTorch backend) LLM API defaults: max_num_tokens 8192,
              max_batch_size 2048, enable_chunked_prefill False, capacity scheduler policy
              GUARANTEED_NO_EVICT, tokens_per_block 32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from explorer.engine.settings import setting
from explorer.serving.engines import Knobs


def _blocks(default: int, what: str):
    return setting(default, what, "KV cache size (on a chip: from the memory plan)", low=1)


@dataclass
class VllmKnobs(Knobs):
    engine: ClassVar[str] = "vllm"
    batch_knob, kv_knob = "max_num_seqs", "num_gpu_blocks"

    max_num_batched_tokens: int = setting(
        8192, "batched tokens", "token budget per step (vLLM >= 0.8 serving on an H100)", low=1
    )
    max_num_seqs: int = setting(1024, "max sequences", "requests running at once", low=1)
    num_gpu_blocks: int = _blocks(4096, "KV blocks")
    block_size: int = setting(16, "block size", "tokens per KV block", low=1, high=4096)
    enable_chunked_prefill: bool = setting(
        True, "chunked prefill", "split a prompt to fit the step's remaining token budget"
    )
    enable_prefix_caching: bool = setting(
        True,
        "prefix caching",
        "freed blocks stay cached: a preempted request finds its computed blocks again",
    )


@dataclass
class VllmV0Knobs(Knobs):
    engine: ClassVar[str] = "vllm-v0"
    batch_knob, kv_knob = "max_num_seqs", "num_gpu_blocks"

    max_num_batched_tokens: int = setting(
        2048,
        "batched tokens",
        "prompt tokens per prefill step (V0 without chunking: max(max_model_len, 2048))",
        low=1,
    )
    max_num_seqs: int = setting(256, "max sequences", "requests running at once", low=1)
    num_gpu_blocks: int = _blocks(4096, "KV blocks")
    block_size: int = setting(16, "block size", "tokens per KV block", low=1, high=4096)
    num_scheduler_steps: int = setting(
        1,
        "scheduler steps",
        "decode steps scheduled at once (multi-step; tokens reach the client in bursts)",
        low=1,
        high=64,
    )
    enable_chunked_prefill: bool = setting(
        False,
        "chunked prefill",
        "V0's chunked-prefill scheduler (decodes first, prompts chunked to the token budget; "
        "vLLM 0.6 turns it on for a max_model_len above 32K)",
    )


@dataclass
class SglangKnobs(Knobs):
    engine: ClassVar[str] = "sglang"
    batch_knob, kv_knob = "max_running_requests", "max_total_tokens"

    chunked_prefill_size: int | None = setting(
        8192,
        "chunked prefill",
        "prompt tokens per chunk (None: no chunking)",
        kind=int,
        low=1,
        optional=True,
    )
    max_prefill_tokens: int = setting(
        16384, "max prefill tokens", "prompt tokens per prefill batch", low=1
    )
    max_running_requests: int | None = setting(
        None,
        "max running",
        "requests running at once (None: the KV token slots / 2)",
        kind=int,
        low=1,
        optional=True,
    )
    max_total_tokens: int = setting(
        65536, "KV tokens", "KV cache token slots (on a chip: from the memory plan)", low=1
    )
    schedule_conservativeness: float = setting(
        1.0, "conservativeness", "scales the output tokens reserved per running request", low=0.0
    )

    @property
    def running_limit(self) -> int:
        return self.max_running_requests or max(1, self.max_total_tokens // 2)


@dataclass
class TrtllmKnobs(Knobs):
    engine: ClassVar[str] = "trtllm"
    batch_knob, kv_knob = "max_batch_size", "num_kv_blocks"

    max_num_tokens: int = setting(8192, "max tokens", "tokens per iteration", low=1)
    max_batch_size: int = setting(2048, "max batch size", "requests per iteration", low=1)
    num_kv_blocks: int = _blocks(2048, "KV blocks")
    tokens_per_block: int = setting(32, "block tokens", "tokens per KV block", low=1, high=4096)
    enable_chunked_prefill: bool = setting(
        False, "context chunking", "split a context to fit the iteration's token budget"
    )
    capacity_scheduler_policy: str = setting(
        "guaranteed_no_evict",
        "capacity policy",
        "guaranteed_no_evict (a request starts only with blocks for its whole length) or "
        "max_utilization (admits while blocks last; pauses the newest when they run out)",
        choices=("guaranteed_no_evict", "max_utilization"),
    )


def vllm_defaults(chip) -> dict:
    """vLLM >= 0.8's `vllm serve` batch defaults on `chip` (a hardware.Chip): 8,192 batched
    tokens and 1,024 sequences on a GPU of >= 70 GiB that is not an A100, else 2,048 and 256."""
    big = (chip.memory_gb or 0) >= 70 and "a100" not in chip.name.lower()
    return (
        {"max_num_batched_tokens": 8192, "max_num_seqs": 1024}
        if big
        else {
            "max_num_batched_tokens": 2048,
            "max_num_seqs": 256,
        }
    )
