"""What the command groups share: JSON output, and the sampling flags built from Sampling's declarations."""

from __future__ import annotations

import argparse
import json


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2, default=str))


def add_sampling_flags(p: argparse.ArgumentParser) -> None:
    """One flag per Sampling field, from its declaration (explorer.engine.settings)."""
    from explorer.engine.sampling import Sampling
    from explorer.engine.settings import specs

    defaults = Sampling()
    for name, spec in specs(Sampling).items():
        flag = spec.cli or "--" + name.replace("_", "-")
        if spec.kind is bool:
            p.add_argument(flag, action="store_true", help=spec.help)
        else:
            p.add_argument(
                flag,
                type=spec.kind,
                default=getattr(defaults, name),
                metavar=spec.kind.__name__.upper(),
                help=f"{spec.help}; {spec.range_text()}",
            )


def sampling_of(args):
    """A validated Sampling from the flags add_sampling_flags() made."""
    from explorer.engine.sampling import Sampling
    from explorer.engine.settings import specs

    return Sampling(**{name: getattr(args, name) for name in specs(Sampling)})
