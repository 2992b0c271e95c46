"""The KV cache's dtype, spelled once: what one cached K or V value costs in bytes.

The cost model's kv_read / kv_write (explorer.costs.parts), the what-if (`explorer simulate
--hardware h100 --kv-dtype fp8`) and the ladder's KV-cache rungs (explorer.sweeps.ladder) read
these choices; None means the weights' dtype (transformers' caches store K/V in the activations'
dtype; FP8 weights keep 16-bit activations, explorer.serving.simulate.whatif).

    float32, bfloat16, float16   4, 2, 2 bytes per value
    fp8     float8 e4m3 with one scale per tensor (vLLM's kv_cache_dtype="fp8", transformers'
            QuantizedCache backend "fp8"): 1 byte per value; the scale is too small to count
    int8    8-bit integers with a 16-bit scale and zero point per group of 64 values
            (optimum-quanto and HQQ, transformers' QuantizedCache "quanto" / "hqq"): 1 + 4/64
    int4    4-bit integers, the same groups: 0.5 + 4/64

transformers' group-wise caches keep the newest `residual_length` (128) tokens unquantised; the
bytes here are the steady state of a long context, where that window is a small share.
"""

from __future__ import annotations

from explorer._dtypes import DTYPES, aliases

GROUP = 64  # values per scale and zero point of the group-wise integer caches
GROUP_BYTES = 2 + 2  # a 16-bit scale and a 16-bit zero point per group

# the float dtypes' bytes per value and their other names: rows of explorer._dtypes
FLOAT_BYTES = {d.name: d.bytes for d in DTYPES if d.floating}
KV_DTYPES: dict[str, float] = {  # the integer caches add a scale and zero point per group
    **FLOAT_BYTES,
    **{d.name: d.bytes + GROUP_BYTES / GROUP for d in DTYPES if not d.floating},
}
ALIASES = aliases()
KV_DTYPE_HELP = (
    f"the KV cache's dtype: {', '.join(KV_DTYPES)} (int8 / int4 with a scale and zero point per "
    f"{GROUP} values; default: the weights' dtype)"
)


def kv_dtype_name(name: str | None) -> str | None:
    """The canonical name of a KV dtype (None stays None: the weights' dtype); refuses others."""
    if name is None:
        return None
    key = ALIASES.get(str(name).strip().lower(), str(name).strip().lower())
    if key not in KV_DTYPES:
        raise ValueError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, got {name!r}")
    return key


def kv_value_bytes(name: str | None, default: float) -> float:
    """Bytes one cached K or V value takes at `name` (scales included); `default` for None."""
    key = kv_dtype_name(name)
    return default if key is None else KV_DTYPES[key]
