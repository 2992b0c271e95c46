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
    from explorer.app.voila.config import AppConfig
    from explorer.app.voila.serve import serve

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
