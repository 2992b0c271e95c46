"""What the command groups share: JSON output, and the sampling flags built from Sampling's declarations."""

from __future__ import annotations

import argparse
import json
import os


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2, default=str))


def whole(low: int = 1):
    """An argparse type: a whole number >= low (Spec.parse; argparse turns the error into one line)."""
    from explorer.engine.settings import Spec

    spec = Spec(int, "", "", low=low)

    def parse(text: str) -> int:
        try:
            return spec.parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    parse.__name__ = "int"
    return parse


def add_threads_flag(p: argparse.ArgumentParser) -> None:
    """--threads N: torch's CPU threads for the run (applied by set_threads)."""
    p.add_argument(
        "--threads",
        type=whole(1),
        default=None,
        help="CPU threads for torch (default: torch's choice); 1 is steadier on a shared machine",
    )


def set_threads(threads: int | None) -> None:
    """torch's CPU threads from --threads (None: leave torch's choice)."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def writable(path: str | None, flag: str) -> None:
    """Checked before anything is measured: the folder of an output file exists and is writable."""
    if not path:
        return
    folder = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(folder):
        raise ValueError(f"{flag} {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"{flag} {path}: the folder {folder} is not writable")
    if os.path.isdir(path):
        raise ValueError(f"{flag} {path}: that is a folder; give a file name")
    _can_write_file(path, flag)


def _can_write_file(path: str, flag: str) -> None:
    """The file itself: an existing one writable, a new one creatable (made and removed again)."""
    existed = os.path.exists(path)
    try:
        with open(path, "a"):
            pass
    except OSError as err:
        raise ValueError(f"{flag} {path}: cannot be written ({err.strerror or err})") from None
    if not existed:
        os.remove(path)


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


def cost_info(name: str, device: str, dtype: str):
    """ModelInfo without allocating for arch: shapes (meta device); other names are loaded."""
    from explorer.model.device import dtype_name, resolve_device, resolve_dtype
    from explorer.model.loader import arch_info, load

    if name.startswith("arch:"):
        return arch_info(name, dtype_name(resolve_dtype(dtype, resolve_device(device))))
    return load(name, device=device, dtype=dtype).info
