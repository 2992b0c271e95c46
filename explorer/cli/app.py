"""explorer app: serve the dashboard with Voila."""

from __future__ import annotations

ORDER = 20


def add(sub) -> None:
    _add_app(sub)


def _add_app(sub) -> None:
    p = sub.add_parser(
        "app", help="serve the dashboard with Voila on 127.0.0.1 (preheated kernels, idle culling)"
    )
    p.add_argument("--port", type=int, default=8866)
    p.add_argument(
        "--ip",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only)",
    )
    p.add_argument(
        "--shared",
        action="store_true",
        help="classroom mode: no free-text model box, models from --models-config; prints the capacity",
    )
    p.add_argument(
        "--models-config",
        default=None,
        metavar="FILE",
        help='JSON allow-list for --shared: {"models": ["bundled:target", ...]}',
    )
    p.add_argument(
        "--pool-size",
        type=int,
        default=1,
        metavar="N",
        help="preheated kernels kept ready (0: none)",
    )
    p.add_argument(
        "--cull-idle-timeout",
        type=int,
        default=120,
        metavar="S",
        help="reclaim a kernel S seconds after its tab closed (default 120)",
    )
    p.add_argument(
        "--refill-delay",
        type=float,
        default=8.0,
        metavar="S",
        help="start a taken kernel's replacement S seconds later (default 8)",
    )
    p.add_argument(
        "--notebook",
        default=None,
        help="serve another notebook instead of notebooks/dashboard.ipynb",
    )
    p.add_argument("--no-browser", action="store_true", help="do not open a browser tab")
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        metavar="N",
        help="torch CPU threads per kernel (default 0: cores - 1, leaving one to the browser)",
    )
    p.set_defaults(func=_cmd_app)


def _cmd_app(args) -> int:
    from explorer.app.voila.config import AppConfig, read_models_config
    from explorer.app.voila.serve import serve

    if args.models_config is not None:
        for name in read_models_config(args.models_config):
            _check_loadable(name, args.models_config)
    if args.notebook is not None:
        _check_notebook(args.notebook)
    config = AppConfig(
        port=args.port,
        ip=args.ip,
        shared=args.shared,
        models_config=args.models_config,
        pool_size=args.pool_size,
        cull_idle_timeout=args.cull_idle_timeout,
        refill_delay=args.refill_delay,
        notebook=args.notebook,
        open_browser=not args.no_browser,
        threads=args.threads,
    )
    return serve(config)


def _check_loadable(name: str, source: str) -> None:
    """A model of the allow-list this machine can load offline: an offline name, a local folder
    saved with save_pretrained, or a hub id whose files are already in the Hugging Face cache."""
    from pathlib import Path

    from explorer.model.loader import available_models

    if name in available_models():
        return
    local = Path(name).expanduser()
    if (local / "config.json").is_file():
        return
    if not local.exists() and "/" in name and not name.startswith(("bundled:", "arch:")):
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return
    raise ValueError(
        f"--models-config {source}: model {name!r} cannot be loaded here (offline names: "
        f"{', '.join(available_models())}; or a folder saved with save_pretrained; or a hub id "
        "already downloaded to the Hugging Face cache)"
    )


def _check_notebook(path: str) -> None:
    """--notebook names a readable .ipynb notebook (Voila answers 403 to anything else)."""
    from pathlib import Path

    import nbformat

    p = Path(path).expanduser()
    if not p.is_file():
        raise ValueError(f"--notebook {path}: no such file")
    if p.suffix != ".ipynb":
        raise ValueError(f"--notebook {path}: not a notebook (a .ipynb file is needed)")
    try:
        nbformat.read(p, as_version=4)
    except Exception as err:  # nbformat raises JSON, validation and encoding errors alike
        raise ValueError(
            f"--notebook {path}: not a readable notebook ({_first_line(err)})"
        ) from None


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:120]
