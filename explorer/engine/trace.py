"""Step and Trace: what one forward pass did, and a whole run, as plain data.

Plain data means numbers, strings and short lists/dicts, so a Trace round-trips through JSON
losslessly and replays (charts, tables) with no model loaded. A Step never holds full-vocabulary
tensors: `top` keeps the `top_n` most likely tokens only, so one Step stays ~4 KB at top_n=20.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

SCHEMA_VERSION = 1  # the trace format this version writes and reads (Trace.schema)
REQUIRED_TRACE_FIELDS = ("prompt", "settings", "model", "device", "dtype")
REQUIRED_STEP_FIELDS = ("index", "phase", "tokens_fed", "context_len", "token_id", "token_text")


class TraceFormatError(ValueError):
    """Data that is not a trace this version can read; the message says what is wrong with it."""


@dataclass
class Step:
    """One forward pass and the token it produced (row 0 of the batch; other rows in `row_tokens`)."""

    index: int  # 0 = prefill, then one per decode pass
    phase: str  # "prefill" | "decode"
    tokens_fed: int  # tokens in this forward pass per row (prompt length, 1 with cache, whole sequence without)
    context_len: int  # tokens the model attends over in this pass (prefix + fed)
    token_id: int
    token_text: str
    forced: bool = False  # chosen by the user (choose()), not sampled
    prob_raw: float = 0.0  # softmax of the raw logits
    prob_final: float = 0.0  # after the whole processing chain
    rank_raw: int = 0  # 0 = most likely
    rank_final: int = 0
    entropy_raw: float = 0.0  # nats
    entropy_final: float = 0.0
    top: list[dict] = field(
        default_factory=list
    )  # [{"id", "text", "raw", "final"}], top_n by raw prob
    stages: list[dict] = field(
        default_factory=list
    )  # [{"name", "mass", "kept"}]: mass of raw dist kept, tokens kept
    draw: dict | None = (
        None  # {"u", "cdf_lo", "cdf_hi", "greedy"}: where the uniform draw fell in the final CDF
    )
    latency_s: float = 0.0  # forward pass, device-synchronised
    cpu_share: float | None = (
        None  # of latency_s x threads on a CPU (explorer.costs.noise); CPU only
    )
    kv_cache_bytes: int = 0  # bytes the cache tensors hold after this pass (0 without cache)
    device: str = "cpu"
    dtype: str = "float32"
    batch_size: int = 1
    row_tokens: list[int] | None = None  # the token of every row when batch_size > 1
    stop: str | None = (
        None  # set on the last step: "eos" | "max_new_tokens" | "max_positions" | "cache_len"
    )
    sampling: dict | None = (
        None  # Sampling fields, only when they differ from Trace.settings (set_sampling)
    )
    # Cost model (explorer.costs), filled in by the engine:
    flops: float | None = None  # modelled FLOPs of this forward pass (all rows)
    bytes: dict[str, float] | None = (
        None  # modelled bytes moved, by part ("weights/mlp", "kv_read", ...)
    )
    bound_s: float | None = None  # roofline lower bound: max(flops / peak_flops, bytes / peak_bw)
    bound: str | None = None  # "memory" | "compute"
    achieved_gbps: float | None = None  # sum(bytes) / latency_s / 1e9
    pct_of_peak_bw: float | None = None  # achieved_gbps / measured peak bandwidth x 100
    # Speed-of-light split (explorer.costs.split): why the step took latency_s
    floors: dict[str, float] | None = (
        None  # seconds at peak, by part: weights, kv_read, kv_write, activations, compute
    )
    overhead_s: float | None = None  # latency_s - bound_s: what the floors do not explain
    mbu: float | None = None  # bound bytes / latency_s / peak bandwidth
    mfu: float | None = None  # flops / latency_s / peak FLOP/s
    regime: str | None = (
        None  # "memory" | "compute" | "overhead" (explorer.costs.split.REGIME_RULE)
    )
    overhead_floor_s: float | None = None  # measured near-empty forward (explorer.costs.overhead)
    # Mixture of experts (explorer.engine.routing): the routers' choices in this pass, bounded
    routing: dict | None = None  # {"tokens", "experts_touched" [per MoE layer], "layers": [...]}
    # Engine options (explorer.engine.options): how this pass ran
    cache_type: str | None = None  # "dynamic" | "static" (None: no cache)
    compiled: bool | None = None  # this pass ran the torch.compile'd forward (False: eager)
    weights: str | None = None  # "fp32" | "bf16" | "fp16" | "int8:fbgemm" | "int8:torchao" | ...
    recompiles: int | None = None  # new graphs dynamo compiled during this pass (compiled only)
    # Speculative decoding (explorer.engine.speculative): the round that emitted this id, and how:
    round: int | None = None
    origin: str | None = (
        None  # "draft" (accepted proposal) | "residual" (after a rejection) | "bonus"
    )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Step:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @property
    def total_bytes(self) -> float | None:
        return None if self.bytes is None else float(sum(self.bytes.values()))


@dataclass
class Trace:
    """A whole run: prompt, settings, model facts, and the steps in order."""

    prompt: str | list[str]
    settings: dict[str, Any]  # Sampling fields plus use_cache, top_n, batch_size, max_new_tokens
    model: dict[str, Any]  # ModelInfo.to_dict()
    device: str
    dtype: str
    steps: list[Step] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)  # row 0's prompt token ids
    stop_reason: str | None = None
    hardware: dict[str, Any] | None = (
        None  # measured peaks used for the roofline (explorer.costs.hardware)
    )
    overhead_floor: dict[str, Any] | None = None  # explorer.costs.overhead.overhead_floor()
    calibration: dict[str, Any] | None = None  # explorer.costs.calibrate.Calibration.to_dict()
    rounds: list[dict] = field(default_factory=list)  # speculative runs: Round.to_dict() per round
    schema: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["steps"] = [s.to_dict() for s in self.steps]
        return d

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "the data") -> Trace:
        """A Trace from to_dict()'s output; TraceFormatError (naming `source`) for anything else."""
        _check_trace_dict(d, source)
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["steps"] = [Step.from_dict(s) for s in d.get("steps", [])]
        try:
            return cls(**kw)
        except TypeError as err:
            raise TraceFormatError(
                f"{source} is not a trace file this version can read: {err}"
            ) from None

    @classmethod
    def from_json(cls, text: str | bytes, source: str = "the text") -> Trace:
        """Parse to_json()'s output; TraceFormatError for invalid or truncated JSON or another shape."""
        try:
            d = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            where = (
                f" at line {err.lineno} column {err.colno}"
                if isinstance(err, json.JSONDecodeError)
                else ""
            )
            raise TraceFormatError(
                f"{source} is not a trace file: invalid JSON{where} (a truncated or "
                f"non-JSON file?): {err.msg if hasattr(err, 'msg') else err}"
            ) from None
        return cls.from_dict(d, source)

    @classmethod
    def load(cls, path) -> Trace:
        """Read a trace file written by save() (or to_json()); TraceFormatError or OSError otherwise."""
        from pathlib import Path

        p = Path(path)
        try:
            data = p.read_bytes()
        except IsADirectoryError:
            raise TraceFormatError(f"{p} is a folder, not a trace file") from None
        return cls.from_json(data, source=str(p))

    def save(self, path) -> None:
        from pathlib import Path

        Path(path).write_text(self.to_json())

    @property
    def tokens(self) -> list[int]:
        return [s.token_id for s in self.steps]

    @property
    def text(self) -> str:
        return "".join(s.token_text for s in self.steps)

    def to_frame(self):
        """One row per step (pandas DataFrame); list/dict columns are flattened where they are small."""
        import pandas as pd

        rows = []
        for s in self.steps:
            row = s.to_dict()
            row.pop("top")
            row.pop("stages")
            row.pop("row_tokens")
            draw = row.pop("draw") or {}
            row["draw_u"] = draw.get("u")
            parts = row.pop("bytes") or {}
            for k, v in parts.items():
                row[f"bytes/{k}"] = v
            row["bytes_total"] = sum(parts.values()) if parts else None
            for k, v in (row.pop("floors") or {}).items():
                row[f"floor/{k}"] = v
            rows.append(row)
        return pd.DataFrame(rows)


def _check_trace_dict(d, source: str) -> None:
    if not isinstance(d, dict):
        raise TraceFormatError(
            f"{source} is not a trace file: expected a JSON object, got {type(d).__name__}"
        )
    missing = [k for k in REQUIRED_TRACE_FIELDS if k not in d]
    if missing:
        raise TraceFormatError(
            f"{source} is not a trace file: missing {', '.join(missing)} (Inference Explorer "
            f"{_version()} writes trace format {SCHEMA_VERSION})"
        )
    schema = d.get("schema", 1)  # a trace written before the field existed is format 1
    if not isinstance(schema, int) or isinstance(schema, bool):
        raise TraceFormatError(
            f"{source} is not a trace file: its format version 'schema' is {schema!r}, not a "
            "whole number"
        )
    if schema > SCHEMA_VERSION:
        raise TraceFormatError(
            f"{source} was written in trace format {schema} by a newer Inference Explorer; this "
            f"version ({_version()}) reads format {SCHEMA_VERSION}: upgrade to read it"
        )
    if schema < 1:
        raise TraceFormatError(
            f"{source} has trace format {schema}, which no Inference Explorer wrote"
        )
    steps = d.get("steps", [])
    if not isinstance(steps, list):
        raise TraceFormatError(
            f"{source} is not a trace file: 'steps' is a {type(steps).__name__}, not a list"
        )
    for i, step in enumerate(steps):
        gone = [k for k in REQUIRED_STEP_FIELDS if not isinstance(step, dict) or k not in step]
        if gone:
            raise TraceFormatError(
                f"{source} is not a valid trace file: step {i} lacks {', '.join(gone)}"
            )


def _version() -> str:
    from explorer._version import __version__

    return __version__
