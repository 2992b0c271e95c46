"""Operator times checked against a real GPU: the what-if's chip rule, one operator at a time,
against the median times Vidur measured on A100s and H100s (assets/published/vidur-operators/).

Vidur (microsoft/vidur, MIT) timed each operator of one transformer layer in fp16, alone, by
token count (1 to 32,768) and tensor-parallel size (1-8), GPU kernel times from the PyTorch
profiler (its default record_function method; 20 steps after 2 warm-up, median): embedding, the two
RMS norms, the fused q/k/v projection, RoPE, the o-projection, the MLP's fused up+gate, its SiLU
x mul, its down projection and the residual add; and NCCL all-reduces inside one DGX box. We keep
the rows whose shape (heads, KV heads, hidden, MLP width, gated MLP) is one of our architectures.

Each operator's work per GPU, for n tokens, TP size t, 2 bytes per value (fp16):

    matmul (qkv, o, up, down)   bytes = weights / t + input + output rows; FLOPs = 2 n x weights / t
    elementwise (norm, rope,    bytes = what it reads and writes (norm: x in, x out, its weight;
      act, add, embedding)      rope: q and k in and out; act: 2i in, i out; add: 2 in, 1 out;
                                embedding: n gathered rows written once); FLOPs not counted
                                (explorer.costs.parts counts none for elementwise work either)

and its predicted time is the what-if's chip rule (whatif.ChipStepModel, DEFAULTS):
max(bytes / (bandwidth x bw_efficiency), FLOPs / (FLOP/s x flop_efficiency)). An all-reduce of B
bytes over t GPUs is the what-if's own all-reduce: 2 (t-1)/t x B / interconnect + a latency.
`whatif_ms` is the same rule on the bytes the what-if's iteration sum counts for the operator
(weights and KV only, whatif.chip_work): 0 for every elementwise operator.

A miss over 20% names its term: "launch floor" where the predicted time is below the smallest
time any operator of its class took on that chip (a fixed cost per kernel the rule does not
have), else "sustained bandwidth" where the memory term binds, "achieved FLOP/s" where the
compute term binds (with the fraction of peak the measurement implies); an all-reduce's miss is
"all-reduce latency" where the rule's fixed latency outweighs its link time, else "interconnect
bandwidth". Attention is not compared: Vidur's attention profiles are not in the snapshot read.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from explorer.costs.hardware import chip_named
from explorer.model.loader import ARCH_DIR, ASSETS

DATA = ASSETS / "published" / "vidur-operators"
COMPUTE = DATA / "compute.csv"
ALLREDUCE = DATA / "all_reduce.csv"
VALUE_BYTES = 2  # Vidur profiled in fp16
MISS = 0.20  # a row misses when |predicted / measured - 1| > MISS
SMALL, LARGE = 16, 1024  # token counts the summary calls small (<=) and large (>=)
# Vidur's column -> our operator class, in the layer's order
OPERATORS = {
    "emb": "embedding",
    "input_layernorm": "norm",
    "attn_pre_proj": "qkv_proj",
    "attn_rope": "rope",
    "attn_post_proj": "o_proj",
    "post_attention_layernorm": "norm",
    "mlp_up_proj": "mlp_up",
    "mlp_act": "mlp_act",
    "mlp_down_proj": "mlp_down",
    "add": "add",
}
SHAPE_FIELDS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp")
COMPUTE_FIELDS = ("chip", "model", *SHAPE_FIELDS, "vocab_size", "tokens", "tp", *OPERATORS)
ALLREDUCE_FIELDS = ("chip", "box", "gpus", "bytes", "all_reduce")


@dataclass(frozen=True)
class LayerShape:
    """What an operator's work depends on: Vidur's shape columns."""

    heads: int
    kv_heads: int
    hidden: int
    inter: int
    gated: bool

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def describe(self) -> str:
        mlp = "gated" if self.gated else "plain"
        return (
            f"heads {self.heads}, KV heads {self.kv_heads}, hidden {self.hidden}, "
            f"MLP {self.inter} ({mlp})"
        )


@dataclass
class OperatorRow:
    """One operator at one token count and TP size: predicted vs measured (ms)."""

    operator: str  # Vidur's name (attn_pre_proj, ..., all_reduce)
    op_class: str  # embedding, norm, qkv_proj, rope, o_proj, mlp_up, mlp_act, mlp_down, add
    chip: str
    model: str  # Vidur's profiled model (or the DGX box for an all-reduce)
    arch: str  # our architecture with that layer shape ("" for an all-reduce)
    tokens: int  # tokens fed (an all-reduce: 0; its size is `bytes`)
    tp: int
    bytes: float
    flops: float
    predicted_ms: float
    measured_ms: float
    memory_floor_ms: float  # bytes at peak bandwidth (an all-reduce: at the interconnect's)
    compute_floor_ms: float  # FLOPs at peak FLOP/s
    whatif_ms: float  # the chip rule on the bytes the what-if's iteration sum counts
    bound: str = ""  # the rule's binding term: memory, compute (all-reduce: interconnect, latency)
    blame: str = ""  # filled by blame(): "" within MISS

    @property
    def error_pct(self) -> float:
        return (self.predicted_ms / self.measured_ms - 1.0) * 100.0

    def to_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items()}
        out["error_pct"] = self.error_pct
        return out


# --- the architectures we know, by layer shape ----------------------------------------------


@lru_cache(maxsize=1)
def known_shapes() -> dict[LayerShape, list[tuple[str, int]]]:
    """Layer shape -> [(arch:name, vocab)] of every dense architecture in assets/architectures."""
    out: dict[LayerShape, list[tuple[str, int]]] = {}
    for path in sorted(ARCH_DIR.glob("*.json")):
        c = json.loads(path.read_text())
        if any(k in c for k in ("num_local_experts", "num_experts", "n_routed_experts")):
            continue  # a mixture of experts: its MLP is not one dense MLP
        heads = c.get("num_attention_heads", c.get("n_head"))  # GPT-2 spells them n_*
        hidden = c.get("hidden_size", c.get("n_embd"))
        if c.get("head_dim", hidden // heads) * heads != hidden:
            continue  # Vidur's head_dim is hidden / heads
        shape = LayerShape(
            heads,
            c.get("num_key_value_heads", heads),
            hidden,
            c.get("intermediate_size") or c.get("n_inner") or 4 * hidden,
            c.get("model_type") != "gpt2",
        )
        out.setdefault(shape, []).append((f"arch:{path.stem}", c["vocab_size"]))
    return out


def arch_for(shape: LayerShape, vocab: int, where: str) -> str:
    """Our architecture of this layer shape (the one with the same vocabulary first); refuses,
    naming the file and the shape, a shape none of ours has."""
    found = known_shapes().get(shape)
    if not found:
        raise ValueError(
            f"operator file {where}: its shape ({shape.describe()}) matches no known model; "
            "shapes it can match (dense, head_dim = hidden / heads): "
            + ", ".join(n for v in known_shapes().values() for n, _ in v)
        )
    same = [n for n, v in found if v == vocab]
    return (same or [found[0][0]])[0]


def shape_of_row(row: dict) -> LayerShape:
    gated = str(row["use_gated_mlp"]).strip().lower() in ("true", "1")
    ints = [int(float(row[k])) for k in SHAPE_FIELDS[:4]]
    return LayerShape(*ints, gated)


# --- reading the data ------------------------------------------------------------------------


def _read_csv(path: Path) -> list[dict]:
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ValueError(f"operator file {path}: cannot read it ({err.strerror})") from None
    return list(csv.DictReader(io.StringIO(text)))


def _check_fields(rows: list[dict], fields, where) -> None:
    if not rows:
        raise ValueError(f"operator file {where}: no rows")
    missing = [f for f in fields if f not in rows[0]]
    if missing:
        raise ValueError(f"operator file {where}: missing columns {', '.join(missing)}")


def from_vidur(rows: list[dict], chip: str, model: str) -> list[dict]:
    """Vidur's mlp.csv rows -> ours: the shape, tokens, TP and each operator's median (ms)."""
    out = []
    for r in rows:
        row = {"chip": chip, "model": model, "vocab_size": r["vocab_size"]}
        row.update({k: r[k] for k in SHAPE_FIELDS})
        row["tokens"], row["tp"] = r["num_tokens"], r["num_tensor_parallel_workers"]
        row.update({op: r[f"time_stats.{op}.median"] for op in OPERATORS})
        out.append(row)
    return out


def _chip_from_path(path: Path) -> str:
    """A raw Vidur file's chip: the folder after compute/ (data/profiling/compute/h100/...)."""
    parts = Path(path).parts
    if "compute" in parts and parts.index("compute") + 1 < len(parts):
        return parts[parts.index("compute") + 1]
    raise ValueError(
        f"operator file {path}: a raw Vidur file must sit under .../compute/<chip>/ "
        "(the chip is read from that folder)"
    )


def load_compute(path: Path | str = COMPUTE) -> list[dict]:
    """Our compute.csv, or a raw Vidur mlp.csv; every shape checked against our architectures
    (ValueError naming the file and the shape otherwise); each row gains its `arch`."""
    rows = _read_csv(Path(path))
    if rows and "time_stats.emb.median" in rows[0]:
        chip = _chip_from_path(Path(path))
        rows = from_vidur(rows, chip, Path(path).parent.name)
    _check_fields(rows, COMPUTE_FIELDS, path)
    for r in rows:
        chip_named(r["chip"])  # refuses a chip the table does not have
        r["arch"] = arch_for(shape_of_row(r), int(float(r["vocab_size"])), str(path))
    return rows


def load_allreduce(path: Path | str = ALLREDUCE) -> list[dict]:
    rows = _read_csv(Path(path))
    _check_fields(rows, ALLREDUCE_FIELDS, path)
    return rows


# --- each operator's work ----------------------------------------------------------------------


def operator_work(op: str, s: LayerShape, n: int, tp: int) -> tuple[float, float, float]:
    """(bytes, FLOPs, bytes the what-if counts) of operator `op` on one of `tp` GPUs at `n`
    tokens (the formulas in the module docstring; 2 bytes per value)."""
    b, h = VALUE_BYTES, s.hidden
    q, kv = s.heads * s.head_dim // tp, s.kv_heads * s.head_dim // tp
    i = s.inter // tp
    up = 2 * i if s.gated else i
    matmuls = {  # op: (inputs, outputs) of its weight matrix on one GPU
        "attn_pre_proj": (h, q + 2 * kv),
        "attn_post_proj": (q, h),
        "mlp_up_proj": (h, up),
        "mlp_down_proj": (i, h),
    }
    if op in matmuls:
        k, m = matmuls[op]
        weights = k * m * b
        return float(weights + n * (k + m) * b), 2.0 * n * k * m, float(weights)
    moved = {  # values read + written
        "emb": 2 * n * h,
        "input_layernorm": 2 * n * h + h,
        "post_attention_layernorm": 2 * n * h + h,
        "attn_rope": 2 * n * (q + kv),
        "mlp_act": n * (up + i),
        "add": 3 * n * h,
    }
    if op not in moved:
        raise ValueError(f"unknown operator {op!r}; known: {', '.join(OPERATORS)}")
    return float(moved[op] * b), 0.0, 0.0


# --- the what-if's chip rule -------------------------------------------------------------------


def machine(chip: str, tp: int = 1):
    """The what-if's step model on paper for `tp` x `chip` at its defaults, fp16 FLOP/s (built
    directly: a 70B shape at tp=1 does not fit the memory plan, yet its operators still run)."""
    from explorer.serving.simulate.whatif import CHIP_RULE, ChipStepModel
    from explorer.serving.simulate.whatif_settings import defaults_for

    c = chip_named(chip)
    defaults = defaults_for(c.name)  # its chip family's fitted values
    return ChipStepModel(
        s_per_byte=0.0,
        s_per_flop=0.0,
        iteration_s=defaults["iteration_overhead_s"],
        request_s=defaults["sequence_overhead_s"],
        token_s=0.0,
        method="modelled",
        rule=CHIP_RULE,
        chip=c.name,
        tp=tp,
        bandwidth_gbps=c.bandwidth_gbps,
        tflops=c.tflops("float16"),
        interconnect_gbps=c.interconnect_gbps,
        settings=defaults,
    )


def chip_terms(m, nbytes: float, flops: float) -> tuple[float, float]:
    """(memory, compute) seconds of `nbytes` and `flops` on one GPU of machine `m`: the what-if's
    own ChipStepModel.roof (peak x efficiency) for the tp GPUs' share; the rule's time is their
    max."""
    return m.roof(nbytes * m.tp, flops * m.tp)


def allreduce_seconds(m, nbytes: float) -> float:
    """One all-reduce of `nbytes` over m.tp GPUs, by the what-if's own ChipStepModel.allreduce_s
    (which times the 2 per layer of a model: a half-layer, 1-wide shape gives one of `nbytes`)."""
    from types import SimpleNamespace

    one = SimpleNamespace(layers=0.5, hidden=1)
    return m.allreduce_s(one, {"tokens": nbytes / m.act_bytes})


def predict(op: str, s: LayerShape, chip: str, n: int, tp: int) -> dict:
    """The chip rule's time for one operator (ms), its floors at peak and its binding term."""
    m = machine(chip, tp)
    nbytes, flops, counted = operator_work(op, s, n, tp)
    memory, compute = chip_terms(m, nbytes, flops)
    return {
        "bytes": nbytes,
        "flops": flops,
        "predicted_ms": max(memory, compute) * 1e3,
        "memory_floor_ms": nbytes / (m.bandwidth_gbps * 1e9) * 1e3,
        "compute_floor_ms": flops / (m.tflops * 1e12) * 1e3,
        "whatif_ms": max(chip_terms(m, counted, flops)) * 1e3,
        "bound": "memory" if memory >= compute else "compute",
    }


# --- rows: predicted vs measured ---------------------------------------------------------------


def compute_rows(path: Path | str = COMPUTE) -> list[OperatorRow]:
    """One row per operator of every kept (chip, model, tokens, TP) measurement."""
    out = []
    for r in load_compute(path):
        shape, n, tp = shape_of_row(r), int(float(r["tokens"])), int(float(r["tp"]))
        chip = chip_named(r["chip"]).name
        for op, cls in OPERATORS.items():
            measured = float(r[op])
            if not measured > 0:
                continue  # Vidur leaves an operator a model does not run empty
            p = predict(op, shape, chip, n, tp)
            out.append(
                OperatorRow(op, cls, chip, r["model"], r["arch"], n, tp, **p, measured_ms=measured)
            )
    return out


def allreduce_rows(path: Path | str = ALLREDUCE) -> list[OperatorRow]:
    """One row per all-reduce size and GPU count inside one box (tokens 0: `bytes` is its size)."""
    out = []
    for r in load_allreduce(path):
        chip, tp, nbytes = chip_named(r["chip"]).name, int(r["gpus"]), float(r["bytes"])
        m = machine(chip, tp)
        link = 2 * (tp - 1) / tp * nbytes / (m.interconnect_gbps * 1e9)
        predicted = allreduce_seconds(m, nbytes)
        out.append(
            OperatorRow(
                "all_reduce", "all_reduce", chip, r["box"], "", 0, tp, nbytes, 0.0,
                predicted_ms=predicted * 1e3,
                measured_ms=float(r["all_reduce"]),
                memory_floor_ms=link * 1e3,
                compute_floor_ms=0.0,
                whatif_ms=predicted * 1e3,
                bound="interconnect" if link >= predicted - link else "latency",
            )
        )  # fmt: skip
    return out


def blame(rows: list[OperatorRow]) -> list[OperatorRow]:
    """Name the term behind each miss over MISS (see the module docstring); returns `rows`."""
    launch: dict[tuple[str, str], float] = {}
    for r in rows:
        key = (r.chip, r.op_class)
        launch[key] = min(launch.get(key, r.measured_ms), r.measured_ms)
    for r in rows:
        if abs(r.error_pct) <= MISS * 100:
            r.blame = ""
        elif r.op_class == "all_reduce":
            r.blame = "all-reduce latency" if r.bound == "latency" else "interconnect bandwidth"
        elif r.predicted_ms < launch[(r.chip, r.op_class)]:
            r.blame = "launch floor"
        elif r.bound == "memory":
            r.blame = "sustained bandwidth"
        else:
            r.blame = "achieved FLOP/s"
    return rows


def operator_rows(compute=COMPUTE, allreduce=ALLREDUCE) -> list[OperatorRow]:
    """Every compared row, each miss blamed (allreduce=None: the compute file only)."""
    rows = compute_rows(compute)
    if allreduce is not None:
        rows += allreduce_rows(allreduce)
    return blame(rows)


# --- the summary -------------------------------------------------------------------------------


@dataclass
class ClassSummary:
    """One operator class on one chip: how far the chip rule is off, and which term."""

    op_class: str
    chip: str
    rows: int
    median_abs_error_pct: float
    median_error_pct: float  # > 0: the rule is slower than the GPU
    misses: int  # rows off by more than MISS
    blame: str  # the term behind most misses ("" when none misses)
    blame_small: str  # ... of the misses at small sizes (<= SMALL tokens; all-reduce <= 256 KiB)
    blame_large: str  # ... at large ones (>= LARGE tokens; all-reduce >= 4 MiB)
    blames: dict  # term -> misses it is behind
    launch_floor_ms: float  # the smallest time this class took on this chip
    achieved_bw_frac: float | None  # median bytes / measured / peak bandwidth, memory-bound rows
    achieved_flop_frac: float | None  # median FLOPs / measured / peak FLOP/s, compute-bound rows

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _size(r: OperatorRow) -> str:
    """ "small", "large" or "" (in between): tokens, or an all-reduce's bytes."""
    if r.op_class == "all_reduce":
        return "small" if r.bytes <= 256 * 2**10 else "large" if r.bytes >= 4 * 2**20 else ""
    return "small" if r.tokens <= SMALL else "large" if r.tokens >= LARGE else ""


def _dominant(rows: list[OperatorRow]) -> str:
    """The term behind most of the misses among `rows` ("" when none misses)."""
    blames = Counter(r.blame for r in rows if r.blame)
    return blames.most_common(1)[0][0] if blames else ""


def summarize(rows: list[OperatorRow]) -> list[ClassSummary]:
    """Per (operator class, chip), in the layer's order: median |error| and the blamed term."""
    groups: dict[tuple[str, str], list[OperatorRow]] = {}
    for r in rows:
        groups.setdefault((r.op_class, r.chip), []).append(r)
    order = list(dict.fromkeys([*OPERATORS.values(), "all_reduce"]))
    out = []
    for (cls, chip), g in sorted(groups.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][1])):
        blames = Counter(r.blame for r in g if r.blame)
        mem = [
            r.memory_floor_ms / r.measured_ms for r in g if r.bound in ("memory", "interconnect")
        ]
        comp = [r.compute_floor_ms / r.measured_ms for r in g if r.bound == "compute"]
        out.append(
            ClassSummary(
                cls,
                chip,
                len(g),
                statistics.median(abs(r.error_pct) for r in g),
                statistics.median(r.error_pct for r in g),
                sum(blames.values()),
                _dominant(g),
                _dominant([r for r in g if _size(r) == "small"]),
                _dominant([r for r in g if _size(r) == "large"]),
                dict(blames.most_common()),
                min(r.measured_ms for r in g),
                _median(mem),
                _median(comp),
            )
        )
    return out


def uncounted_share(rows: list[OperatorRow], small: int = SMALL, large: int = LARGE) -> dict:
    """Per chip: the median share of a layer's measured time spent in operators the what-if's
    iteration sum gives no bytes or FLOPs (whatif_ms 0), at <= `small` and >= `large` tokens."""
    layers: dict[tuple, list[float]] = {}
    for r in rows:
        if r.op_class != "all_reduce":
            t = layers.setdefault((r.chip, r.model, r.tokens, r.tp), [0.0, 0.0])
            t[0] += r.measured_ms if r.whatif_ms == 0 else 0.0
            t[1] += r.measured_ms
    out: dict[str, dict] = {}
    for (chip, _, n, _), (free, total) in layers.items():
        side = "small" if n <= small else "large" if n >= large else None
        if side:
            out.setdefault(chip, {"small": [], "large": []})[side].append(free / total)
    return {
        c: {f"{k}_tokens_share": _median(v) for k, v in d.items()}
        | {"small": small, "large": large}
        for c, d in out.items()
    }


MATMULS = ("qkv_proj", "o_proj", "mlp_up", "mlp_down")


def implied(rows: list[OperatorRow]) -> dict:
    """Per chip, what the measurements imply for each term of the rule (medians): matmuls'
    fraction of peak FLOP/s at >= LARGE tokens and of peak bandwidth at <= SMALL; elementwise
    operators' fraction of peak bandwidth at >= LARGE and their time at <= SMALL (a floor); an
    all-reduce's time at <= 256 KiB (its latency) and its bus GB/s at the largest size."""
    out: dict[str, dict] = {}
    for chip in sorted({r.chip for r in rows}):
        mine = [r for r in rows if r.chip == chip]
        mm = [r for r in mine if r.op_class in MATMULS]
        ew = [r for r in mine if r.op_class not in (*MATMULS, "all_reduce")]
        ar = [r for r in mine if r.op_class == "all_reduce"]
        biggest = max((r.bytes for r in ar), default=0)
        out[chip] = {
            "matmul_flop_frac_large": _median(
                [r.compute_floor_ms / r.measured_ms for r in mm if _size(r) == "large"]
            ),
            "matmul_bw_frac_small": _median(
                [r.memory_floor_ms / r.measured_ms for r in mm if _size(r) == "small"]
            ),
            "elementwise_bw_frac_large": _median(
                [r.memory_floor_ms / r.measured_ms for r in ew if _size(r) == "large"]
            ),
            "elementwise_small_ms": _median([r.measured_ms for r in ew if _size(r) == "small"]),
            "interconnect_gbps": chip_named(chip).interconnect_gbps,
            "allreduce_small_ms": _median([r.measured_ms for r in ar if _size(r) == "small"]),
            "allreduce_bus_gbps_largest": _median(
                [
                    r.memory_floor_ms / r.measured_ms * machine(chip, r.tp).interconnect_gbps
                    for r in ar
                    if r.bytes == biggest
                ]
            ),
        }
    return out
