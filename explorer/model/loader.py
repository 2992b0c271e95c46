"""Load a causal LM: bundled (offline, trained here), architecture-only (random weights), hub id or path.

load()                      -> the bundled target model
load("bundled:draft")       -> the bundled draft model (for speculative decoding)
load("bundled:moe")         -> the bundled mixture-of-experts model (Qwen3-MoE, 16 experts, top-2)
load("arch:qwen2.5-0.5b")   -> the real Qwen2.5-0.5B shape with random weights (costs are real, text is not)
load("Qwen/Qwen2.5-0.5B")   -> a hub id (needs the network or a local HF cache)
load("/path/to/model")      -> a local folder saved with save_pretrained
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from explorer.model.device import DTYPES, dtype_bytes, dtype_name, resolve_device, resolve_dtype
from explorer.model.memory import check_fits, fits, gib
from explorer.model.moe import active_parameters, moe_facts
from explorer.model.quant import (
    FLOAT_WEIGHTS,
    check_dtype_runs,
    default_backend,
    parse_weights,
    quantize,
    weight_inventory,
    weights_of,
)

ASSETS = Path(__file__).resolve().parents[2] / "assets"
MODELS_DIR = ASSETS / "models"
ARCH_DIR = ASSETS / "architectures"
BUNDLED = ("target", "draft", "moe")


class ModelNotFoundError(ValueError):
    """A model name that matched nothing; the message says what was tried and what to do."""


@dataclass
class ModelInfo:
    """Plain facts about a loaded model (JSON-able). Counts are of unique tensors: tied weights once."""

    name: str
    source: str  # "bundled" | "arch" | "hub" | "local"
    family: str  # config.model_type, e.g. "llama", "qwen2", "gpt2"
    parameters: int
    non_embedding_parameters: int  # parameters minus token (and position) embeddings
    layers: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    max_positions: int
    tied_embeddings: bool
    dtype: str
    device: str
    weight_bytes: int
    random_weights: bool
    hub_id: str | None = None  # for arch: models, where the shape comes from
    weights: str = (
        "fp32"  # "fp32" | "bf16" | "fp16" | "int8:fbgemm" | "int8:torchao" | "int4:torchao"
    )
    weights_backend: str | None = None  # the library that quantised them (None: a plain cast)
    # real bytes per matmul weight value by part ("attention", "mlp", "lm_head"), scales included;
    # None: the dtype's size (explorer.model.quant.weight_inventory)
    linear_bytes: dict[str, float] | None = None
    # Mixture of experts (explorer.model.moe); a dense model: num_experts None, moe_layers 0
    num_experts: int | None = None  # routed experts per MoE layer (E)
    experts_per_token: int | None = None  # experts each token is routed to (top-k)
    expert_intermediate_size: int | None = None  # the MLP width of one routed expert
    moe_layers: int = 0  # decoder layers whose MLP is routed (the others are dense)
    shared_experts: int = 0  # experts every token uses (Qwen2-MoE, DeepSeek), per MoE layer
    shared_expert_intermediate_size: int | None = None  # their MLP width, all shared together
    active_parameters: int | None = None  # used per token: all but the unrouted experts

    def __post_init__(self) -> None:
        if self.active_parameters is None:
            self.active_parameters = self.parameters

    @property
    def is_moe(self) -> bool:
        return bool(self.num_experts)

    @property
    def active_parameters_without_embedding(self) -> int:
        """The active count as model cards quote it (gpt-oss-20b's "3.6B active"): without the
        input embedding, which a token reads one row of (its own) rather than all of."""
        embedding = 0 if self.tied_embeddings else self.vocab_size * self.hidden_size
        return self.active_parameters - embedding

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def check_context(self, positions: int, what: str) -> None:
        """The one context-fit check: ValueError when `what` needs more than the model's positions
        ("<what> needs N positions, more than <model>'s context of M positions")."""
        if self.max_positions and positions > self.max_positions:
            raise ValueError(
                f"{what} needs {positions:,} positions, more than {self.name}'s context of "
                f"{self.max_positions:,} positions"
            )

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes the KV cache grows by per token per sequence: 2 (K and V) x layers x kv_heads x head_dim."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes(self.dtype)


@dataclass
class LoadedModel:
    model: Any  # a transformers PreTrainedModel in eval mode
    tokenizer: Any  # a PreTrainedTokenizer(Fast); None for arch: models without one
    info: ModelInfo

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def available_models() -> list[str]:
    """Every name that works offline: bundled models and architecture-only shapes."""
    bundled = [f"bundled:{n}" for n in BUNDLED]
    arch = sorted(f"arch:{p.stem}" for p in ARCH_DIR.glob("*.json"))
    return bundled + arch


def load(
    model: str | None = None,
    *,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    trust_remote_code: bool = False,
    seed: int = 0,
    weights: str | None = None,
) -> LoadedModel:
    """Load a model by name (see the module docstring). Never downloads unless given a hub id.

    weights: None (the dtype's own), "fp32" | "bf16" | "fp16" (the same as dtype=), or "int8" |
    "int4" (optionally ":fbgemm" / ":torchao"): weight quantisation through a real library, with
    activations in `dtype` (explorer.model.quant)."""
    name = model or "bundled:target"
    dev = resolve_device(device)
    kind = parse_weights(weights)[0] if weights is not None else None
    if kind in FLOAT_WEIGHTS:
        if dtype != "auto" and dtype_name(dtype) != FLOAT_WEIGHTS[kind]:
            raise ValueError(f"weights={weights!r} and dtype={dtype!r} disagree: give one of them")
        dtype = FLOAT_WEIGHTS[kind]
    dt = resolve_dtype(dtype, dev)
    if dtype != "auto":  # "auto" picks a dtype the device runs
        check_dtype_runs(dev, dt)
    if name.startswith("bundled:"):
        lm = _load_bundled(name, dev, dt)
    elif name.startswith("arch:"):
        lm = _load_arch(name, dev, dt, seed)
    else:
        lm = _load_pretrained(name, dev, dt, trust_remote_code)
    if kind is None or kind in FLOAT_WEIGHTS:
        return lm
    return with_weights(lm, weights, copy_model=False)


def _load_bundled(name: str, dev: torch.device, dt: torch.dtype) -> LoadedModel:
    which = name.split(":", 1)[1]
    if which not in BUNDLED:
        raise ModelNotFoundError(_not_found_message(name, tried=[f"bundled model {which!r}"]))
    path = MODELS_DIR / which
    if not (path / "config.json").exists():
        raise ModelNotFoundError(
            f"the bundled model files are missing from {path}; "
            "regenerate them with `python scripts/train_bundled.py`"
        )
    lm = _from_pretrained(str(path), dev, dt, trust_remote_code=False)
    return _finish(lm[0], lm[1], name, "bundled", random_weights=False)


def arch_config(name: str) -> tuple[Any, dict]:
    """The transformers config of an architecture-only shape, plus our metadata (hub id)."""
    from transformers import AutoConfig

    short = name.split(":", 1)[1] if name.startswith("arch:") else name
    path = ARCH_DIR / f"{short.lower()}.json"
    if not path.exists():
        raise ModelNotFoundError(_not_found_message(name, tried=[f"architecture file {path.name}"]))
    raw = json.loads(path.read_text())
    meta = raw.pop("_explorer", {})
    return AutoConfig.for_model(**raw), meta


def _load_arch(name: str, dev: torch.device, dt: torch.dtype, seed: int) -> LoadedModel:
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    config, meta = arch_config(name)
    check_arch_fits(name, dev, dt)  # before a byte is allocated
    with no_init_weights(), torch.device(dev):
        model = AutoModelForCausalLM.from_config(config, dtype=dt)
    model.tie_weights()
    _fill_random(model, seed)
    model.eval()
    return _finish(model, None, name, "arch", random_weights=True, hub_id=meta.get("hub_id"))


def check_arch_fits(name: str, device, dtype: torch.dtype) -> None:
    """Before an architecture-only shape is built: its weights in `dtype` must fit (modelled)."""
    need = arch_info(name, dtype_name(dtype)).weight_bytes
    if not fits(need, device):
        what = f"the weights of {name} ({dtype_name(dtype)})"
        check_fits(need, device, what, _what_fits(name, device, dtype))


def check_pretrained_fits(name: str, device, dtype: torch.dtype, trust_remote_code: bool) -> None:
    """Before a hub or local model's weights are read: they must fit in `dtype` (modelled from its
    config on the meta device). A config that is not at hand (a hub id not cached, offline) or
    that transformers cannot build is not checked here: the load itself then says why."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(name, trust_remote_code=trust_remote_code)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(
                config, dtype=dtype, trust_remote_code=trust_remote_code
            )
    except Exception:  # noqa: BLE001 - no model of its size: the load reports the real problem
        return
    unique = {id(p): p for p in model.parameters()}.values()
    need = sum(p.numel() for p in unique) * dtype.itemsize
    check_fits(need, device, f"the weights of {name} ({dtype_name(dtype)})")


def _what_fits(name: str, device, dtype: torch.dtype) -> str:
    """A smaller dtype of the same shape, else the shapes that fit in this dtype."""
    half = arch_info(name, "bfloat16").weight_bytes
    if dtype.itemsize > 2 and fits(half, device):
        return f"--dtype bfloat16 ({gib(half)}) fits"
    names = [m for m in available_models() if m.startswith("arch:") and m != name]
    ok = [m for m in names if fits(arch_info(m, dtype_name(dtype)).weight_bytes, device)]
    if not ok:
        return "no architecture shape fits; try bundled:target"
    return f"shapes that fit in {dtype_name(dtype)}: {', '.join(ok)}"


@torch.no_grad()
def _fill_random(model: torch.nn.Module, seed: int, std: float = 0.02) -> None:
    """Fast random init: tile a 1M-value normal pool into every weight; norms get 1, biases 0.

    Per-module init of a 0.5B shape takes far longer and would only matter for the text, which
    is meaningless with random weights anyway; the costs (shapes, bytes, FLOPs) are exact.
    """
    first = next(model.parameters())
    gen = torch.Generator(device="cpu").manual_seed(seed)
    pool = (torch.randn(1 << 20, generator=gen) * std).to(device=first.device, dtype=first.dtype)
    for name, p in model.named_parameters():
        if p.dim() == 1:
            p.fill_(
                1.0
                if ("norm" in name or ".ln" in name or "ln_" in name) and name.endswith("weight")
                else 0.0
            )
            continue
        flat = p.view(-1)
        for start in range(0, flat.numel(), pool.numel()):
            chunk = flat[start : start + pool.numel()]
            chunk.copy_(pool[: chunk.numel()])


def _from_pretrained(path: str, dev: torch.device, dt: torch.dtype, trust_remote_code: bool):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=dt, trust_remote_code=trust_remote_code
    )
    return model.to(dev).eval(), tok


def _load_pretrained(
    name: str, dev: torch.device, dt: torch.dtype, trust_remote_code: bool
) -> LoadedModel:
    local = Path(os.path.expanduser(name))
    if local.exists():
        if not (local / "config.json").exists():
            raise ModelNotFoundError(
                f"{local} exists but has no config.json: it is not a folder saved with "
                "save_pretrained()"
            )
        check_pretrained_fits(str(local), dev, dt, trust_remote_code)
        model, tok = _from_pretrained(str(local), dev, dt, trust_remote_code)
        return _finish(model, tok, name, "local", random_weights=False)
    check_pretrained_fits(name, dev, dt, trust_remote_code)
    try:
        model, tok = _from_pretrained(name, dev, dt, trust_remote_code)
    except (OSError, ValueError) as err:
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
        tried = [
            f"local path {local} (not found)",
            f"hub id {name!r}" + (" (HF_HUB_OFFLINE=1: cache only)" if offline else ""),
        ]
        raise ModelNotFoundError(
            _not_found_message(name, tried, offline, detail=str(err).splitlines()[0])
        ) from err
    return _finish(model, tok, name, "hub", random_weights=False)


def _not_found_message(name: str, tried: list[str], offline: bool = False, detail: str = "") -> str:
    lines = [f"could not load model {name!r}.", "Tried: " + "; ".join(tried) + "."]
    if detail:
        lines.append(f"transformers said: {detail}")
    lines.append("Offline names: " + ", ".join(available_models()) + ".")
    hint = "Check the spelling, pass a local folder saved with save_pretrained()"
    hint += (
        ", or set HF_HUB_OFFLINE=0 with network access to download a hub id."
        if offline
        else ", or check your network access for a hub id."
    )
    lines.append(hint)
    return "\n".join(lines)


def _finish(
    model, tok, name: str, source: str, *, random_weights: bool, hub_id: str | None = None
) -> LoadedModel:
    if tok is not None and tok.pad_token_id is None and tok.eos_token_id is not None:
        tok.pad_token = tok.eos_token
    info = model_info(model, name=name, source=source, random_weights=random_weights, hub_id=hub_id)
    return LoadedModel(model=model, tokenizer=tok, info=info)


def _config_facts(config) -> dict[str, int]:
    """Shape facts from a config, across naming conventions (GPT-2's n_embd, Llama's hidden_size)."""
    hidden = config.hidden_size
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    inter = (
        getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * hidden
    )
    return dict(
        layers=config.num_hidden_layers,
        attention_heads=heads,
        kv_heads=kv,
        head_dim=head_dim,
        hidden_size=hidden,
        intermediate_size=inter,
        vocab_size=config.vocab_size,
        max_positions=getattr(config, "max_position_embeddings", None)
        or getattr(config, "n_positions", 0),
    )


def _embedding_params(model: torch.nn.Module) -> int:
    """Token embedding plus learned position embedding (GPT-2's wpe), if any."""
    n = model.get_input_embeddings().weight.numel()
    for mod_name, mod in model.named_modules():
        if (
            isinstance(mod, torch.nn.Embedding)
            and mod is not model.get_input_embeddings()
            and "wpe" in mod_name
        ):
            n += mod.weight.numel()
    return n


def model_info(
    model,
    *,
    name: str,
    source: str,
    random_weights: bool,
    hub_id: str | None = None,
    weights: str | None = None,
    weights_backend: str | None = None,
) -> ModelInfo:
    first = next(model.parameters())
    config = model.config
    out_emb = model.get_output_embeddings()
    tied = out_emb is not None and getattr(out_emb, "weight", None) is (
        model.get_input_embeddings().weight
    )
    held = weight_inventory(model)  # counts quantized weights too (they are not nn.Parameters)
    n = held["parameters"]
    dtype = model.get_input_embeddings().weight.dtype  # the activations' dtype
    moe = moe_facts(model)
    return ModelInfo(
        name=name,
        source=source,
        family=config.model_type,
        parameters=n,
        non_embedding_parameters=n - _embedding_params(model),
        **_config_facts(config),
        tied_embeddings=bool(tied),
        dtype=dtype_name(dtype),
        device=str(first.device),
        weight_bytes=held["bytes"],
        random_weights=random_weights,
        hub_id=hub_id,
        weights=weights or weights_of(dtype),
        weights_backend=weights_backend,
        linear_bytes=held["linear_bytes"] if weights_backend else None,
        **moe,
        active_parameters=active_parameters(model, n, moe),
    )


def with_weights(lm, weights: str, *, copy_model: bool = True):
    """A LoadedModel whose weights are `weights` (a converted copy, cached on lm; lm unchanged).

    The same name as lm's own weights returns lm itself. copy_model=False converts lm's own
    model in place (explorer.load does this: the float model is not kept)."""
    kind, backend = parse_weights(weights)
    backend = backend or default_backend(kind, lm.device)
    label = kind if backend is None else f"{kind}:{backend}"
    if label == lm.info.weights:
        return lm
    if lm.info.weights not in FLOAT_WEIGHTS:
        raise ValueError(
            f"{lm.info.name} already has {lm.info.weights} weights; convert from a float model"
        )
    variants = lm.__dict__.setdefault("_weight_variants", {}) if copy_model else {}
    if label in variants:
        return variants[label]
    model = copy.deepcopy(lm.model) if copy_model else lm.model
    if kind in FLOAT_WEIGHTS:
        dt = DTYPES[FLOAT_WEIGHTS[kind]]
        check_dtype_runs(lm.device, dt)
        model = model.to(dt)
    else:
        model = quantize(model, kind, backend, lm.device)
    info = model_info(
        model,
        name=lm.info.name,
        source=lm.info.source,
        random_weights=lm.info.random_weights,
        hub_id=lm.info.hub_id,
        weights=label,
        weights_backend=backend,
    )
    variants[label] = out = LoadedModel(model=model, tokenizer=lm.tokenizer, info=info)
    return out


def arch_info(name: str, dtype: str = "float32") -> ModelInfo:
    """ModelInfo of an architecture-only shape without allocating it (built on the meta device)."""
    from transformers import AutoModelForCausalLM

    config, meta = arch_config(name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype])
    info = model_info(
        model,
        name=name if name.startswith("arch:") else f"arch:{name}",
        source="arch",
        random_weights=True,
        hub_id=meta.get("hub_id"),
    )
    info.device = "meta (not allocated)"
    return info
