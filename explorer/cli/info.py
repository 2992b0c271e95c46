"""explorer info: facts about a model."""

from __future__ import annotations

from explorer.cli.common import print_json

ORDER = 10


def add(sub) -> None:
    _add_info(sub)


def _add_info(sub) -> None:
    p = sub.add_parser("info", help="facts about a model (parameters, layers, heads, bytes)")
    p.add_argument(
        "model",
        nargs="?",
        default=None,
        help="bundled:target (default), bundled:draft, bundled:moe, arch:NAME, hub id or path",
    )
    p.add_argument("--list", action="store_true", help="list every offline model name")
    p.add_argument("--json", action="store_true")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.set_defaults(func=_cmd_info)


def _cmd_info(args) -> int:
    from explorer.model.loader import arch_info, available_models, load

    if args.list:
        names = available_models()
        print_json(names) if args.json else print("\n".join(names))
        return 0
    name = args.model or "bundled:target"
    big = name.startswith("arch:") and name not in (
        "arch:gpt2",
        "arch:smollm2-135m",
        "arch:qwen2.5-0.5b",
    )
    if big:
        import torch

        from explorer.model.device import dtype_name, resolve_dtype

        # "auto" is float32 here (a shape on no device); a bad name is one line, before the build
        info = arch_info(name, dtype_name(resolve_dtype(args.dtype, torch.device("cpu"))))
    else:
        info = load(name, device=args.device, dtype=args.dtype).info
    if args.json:
        extra = {"active_parameters_without_embedding": info.active_parameters_without_embedding}
        print_json({**info.to_dict(), **(extra if info.is_moe else {})})
        return 0
    facts = info.to_dict()
    w = max(map(len, facts))
    for key, value in facts.items():
        number = isinstance(value, int) and not isinstance(value, bool)
        print(f"{key:>{w}}  {value:,}" if number else f"{key:>{w}}  {value}")
    print(f"{'kv_bytes_per_token':>{w}}  {info.kv_bytes_per_token:,}")
    if info.is_moe:
        card = info.active_parameters_without_embedding
        print(f"{'active_without_embedding':>{w}}  {card:,}")
        print(
            f"(active_parameters counts every weight one token uses, the input embedding included; "
            f"model cards such as gpt-oss's quote {card / 1e9:.2f}B, without it)"
        )
    if big:
        print("(shape only: built on the meta device, no memory allocated)")
    return 0
