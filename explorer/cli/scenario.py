"""explorer scenario: watch a production failure happen on a real engine, then its fix, measured.

    explorer scenario --list
    explorer scenario kv-exhaustion              # broken and fixed on this machine, the verdict
    explorer scenario overload --json            # {"scenario", "broken", "fixed", "verdict", ...}
    explorer scenario overload --hardware h100   # the same preset at GPU scale (modelled)
    explorer scenario memory-wall --memory-budget 0.05
    explorer scenario kv-exhaustion --url http://gpu-node:8000 [--fixed-url ...]  # a real server

The scenarios live in explorer.serving.scenarios (one module each, registered).
"""

from __future__ import annotations

import argparse
import sys

from explorer.cli.common import print_json

ORDER = 47
RUN_KEYS = ("p99_ttft_ms", "p99_itl_ms", "output_throughput", "preemptions", "steady")


def add(sub) -> None:
    from explorer.serving.engines import names as engine_names
    from explorer.serving.scenarios import SCALES

    p = sub.add_parser(
        "scenario", help="a production failure on a real engine, its evidence, why, and its fix"
    )
    p.add_argument("name", nargs="?", default=None, help="the scenario (see --list)")
    p.add_argument("--list", action="store_true", help="list the scenarios")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument(
        "--hardware", default=None, help="a known chip: the preset at GPU scale, modelled"
    )
    p.add_argument(
        "--memory-budget",
        type=float,
        default=None,
        metavar="GB",
        help="memory-wall: the memory budget (GB) the growing batches run under",
    )
    p.add_argument(
        "--model", default=None, help="default bundled:target (arch:llama-3.1-8b with --hardware)"
    )
    p.add_argument(
        "--engine",
        choices=engine_names(),
        default=None,
        help="the broken run's engine (default: the scenario's own)",
    )
    p.add_argument("--device", default="auto")
    p.add_argument(
        "--scale",
        choices=SCALES,
        default="default",
        help="the measured preset's size: small runs each scenario in seconds (the notebook's)",
    )
    p.add_argument(
        "--url",
        default=None,
        help="a server's base URL (OpenAI protocol), started with the scenario's broken flags: "
        "the scenarios whose knobs live in the server run against it (the flags are printed)",
    )
    p.add_argument("--fixed-url", default=None, help="with --url: a server with the fixed flags")
    p.add_argument("--served-model", default=None, help="with --url: the model name it serves")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from explorer.serving import scenarios

    if args.list:
        for name in scenarios.names():
            sc = scenarios.get(name)
            print(f"{name:<15}{sc.title.split(': ', 1)[-1]}; fix: {sc.fix}")
        return 0
    if args.name is None:
        raise ValueError(
            f"name a scenario ({', '.join(scenarios.names())}), or give --list to see them"
        )
    sc = scenarios.get(args.name)  # an unknown name: one line listing them, before any load
    _check_server_flags(args)
    if args.url:
        return _remote(args)
    if args.hardware:
        scenarios.check_modelled(sc.name)
    if args.engine:
        scenarios.check_engine(args.name, args.engine)
    if args.memory_budget is not None:
        scenarios.check_budget(sc.name, args.memory_budget)
    lm = None
    if args.hardware is None or (args.model and not args.model.startswith("arch:")):
        from explorer.model.loader import load

        lm = load(args.model, device=args.device)
    say = None if args.json else (lambda text: print(f"  {text}", file=sys.stderr, flush=True))
    try:
        res = scenarios.run(
            sc.name,
            lm,
            hardware=args.hardware,
            model=args.model,
            engine=args.engine,
            progress=say,
            memory_budget_gb=args.memory_budget,
            scale=args.scale,
        )
    except scenarios.ScenarioInterrupted as cut:
        _report(args, cut.scenario)
        raise
    _report(args, res)
    return 0


SERVER_ONLY = (("fixed_url", "--fixed-url"), ("served_model", "--served-model"))
LOCAL_ONLY = (
    ("hardware", "--hardware", None),
    ("memory_budget", "--memory-budget", None),
    ("engine", "--engine", None),
    ("scale", "--scale", "default"),
)


def _check_server_flags(args) -> None:
    """The flags of a run against a server and of a local one are not mixed (each would be
    ignored by the other): one line naming the flag."""
    if not args.url:
        for dest, flag in SERVER_ONLY:
            if getattr(args, dest) is not None:
                raise ValueError(f"{flag} goes with --url (a server's base URL); give --url too")
        return
    for dest, flag, default in LOCAL_ONLY:
        if getattr(args, dest) != default:
            raise ValueError(f"{flag} does not apply to a run against a server (--url); drop it")


def _remote(args) -> int:
    """--url: the scenario's workload against a server; the evidence a client sees, the flags."""
    from explorer.model.loader import load
    from explorer.serving.scenarios import remote

    remote.check_remote(args.name)  # before any load
    for url in (args.url, args.fixed_url):
        if url is not None:
            remote.check_reachable(url)  # a server that is not there: one line, before the load
    res = remote.run_remote(
        args.name,
        args.url,
        fixed_url=args.fixed_url,
        served_model=args.served_model,
        lm=load(args.model, device=args.device),  # its tokenizer cuts the prompts
        progress=None if args.json else (lambda t: print(f"  {t}", file=sys.stderr, flush=True)),
    )
    if args.json:
        print_json(res.to_dict())
        return 0
    print(f"{res.scenario} against a server (measured from the client)")
    for role in ("broken", "fixed"):
        print(f"  start the {role} server with:")
        for server, flags in res.knobs[role].items():
            print(f"    {server:<19} {flags}")
    print(f"verdict: {res.verdict}")
    print(f"why: {res.why}")
    return 0


def _report(args, res) -> None:
    if args.json:
        print_json(res.to_dict())
        return
    kind = "modelled" if res.modelled else "measured"
    print(f"{res.scenario} ({kind}): {res.title}")
    for which in ("broken", "fixed"):
        run_ = getattr(res, which)
        if run_ is None:
            print(f"  {which:<7} not run")
            continue
        figs = _figures(run_)
        print(f"  {which:<7} {run_.label}: " + ", ".join(f"{k} {v}" for k, v in figs.items()))
    print(f"verdict: {res.verdict}")
    print(f"why: {res.why}")
    if res.partial:
        print("partial: the scenario was stopped; these figures are not a finished run")


def _figures(res) -> dict:
    from explorer.serving.scenarios._context import preemptions

    out = {}
    for k in RUN_KEYS:
        v = preemptions(res) if k == "preemptions" else res.result.get(k)
        out[k] = f"{v:.4g}" if isinstance(v, float) else v
    return out
