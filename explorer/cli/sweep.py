"""explorer sweep NAME: every sweep in the registry (explorer.sweeps), its flags read from its Params."""

from __future__ import annotations

import json
import sys

from explorer.cli.common import add_threads_flag, print_json, set_threads, writable

ORDER = 60


def add(sub) -> None:
    from explorer import sweeps

    p = sub.add_parser("sweep", help="timed sweeps: " + ", ".join(sweeps.names()))
    kinds = p.add_subparsers(dest="kind", required=True, metavar="NAME")
    for name in sweeps.names():
        sweep = sweeps.get(name)
        q = kinds.add_parser(name, help=f"{sweep.title}: {sweep.help}")
        q.add_argument("--model", default="bundled:target")
        q.add_argument("--device", default="auto")
        q.add_argument("--dtype", default="auto")
        add_threads_flag(q)
        for param in sweep.params:
            q.add_argument(
                param.cli_flag,
                dest=f"param_{param.name}",
                default=param.default,
                metavar=param.kind.upper(),
                help=f"{param.help} (default: {param.default or 'the sweep' + chr(39) + 's own'})",
            )
        q.add_argument(
            "--csv",
            default=None,
            metavar="FILE",
            help="write the table to FILE (attrs to FILE.attrs.json)",
        )
        q.add_argument("--json", action="store_true", help="print the rows and attrs as JSON")
        q.set_defaults(func=run)


def run(args) -> int:
    from explorer import sweeps
    from explorer.model.loader import load

    sweep = sweeps.get(args.kind)
    texts = {
        k[len("param_") :]: v
        for k, v in vars(args).items()
        if k.startswith("param_") and v is not None
    }
    kwargs = sweep.arguments(texts, name_of=lambda p: p.cli_flag)  # before loading: fails fast
    writable(args.csv, "--csv")
    writable(args.csv and args.csv + ".attrs.json", "--csv")
    set_threads(args.threads)
    lm = load(args.model, device=args.device, dtype=args.dtype)
    df = sweep.run(lm, **kwargs)
    failed = _save(df, args.csv)
    _print(args, df)  # every row, whether or not the file was written
    if failed:
        print(
            f"explorer: --csv {args.csv}: could not be written ({failed}); the {len(df)} rows "
            "are printed above (stdout) instead",
            file=sys.stderr,
        )
        return 1
    return 130 if sweeps.interrupted(df) else 0


def _save(df, path: str | None) -> str | None:
    """Write the table and its attrs; None, or why the file could not be written."""
    if not path:
        return None
    try:
        df.to_csv(path, index=False)
        with open(path + ".attrs.json", "w") as f:
            json.dump(df.attrs, f, indent=2, default=str)
    except OSError as err:
        return str(err.strerror or err)
    return None


def _print(args, df) -> None:
    """The rows as JSON (--json) or a table, with the notes."""
    import pandas as pd

    if args.json:
        print_json({"rows": json.loads(df.to_json(orient="records")), "attrs": df.attrs})
    else:
        a = df.attrs
        print(
            f"sweep {args.kind}: {a['model']} on {a['device']} ({a['dtype']}, {a['threads']} threads), a low "
            f"quantile of {a['repeats']} after {a['warmup']} warm-up (explorer.costs.noise), {a['timer']}"
        )
        with pd.option_context(
            "display.width", 200, "display.max_columns", 40, "display.float_format", "{:.4g}".format
        ):
            print(df.drop(columns=["noisy_reason"], errors="ignore").to_string(index=False))
        print_noisy(df)
        if a.get("knee_batch_modelled", "absent") != "absent":
            print(f"roofline knee (modelled): B={a['knee_batch_modelled']}")
        for note in a["notes"]:
            print(f"note: {note}")


def print_noisy(df) -> None:
    """One line per row whose timing is noisy (explorer.costs.noise), with its reason."""
    if "noisy" not in df or "noisy_reason" not in df:
        return
    for i, row in enumerate(df.to_dict("records")):
        if row.get("noisy") is True:
            print(f"noisy: row {i}: {row['noisy_reason']}")
