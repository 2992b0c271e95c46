"""`explorer` command line: the same core as the notebooks and the dashboard.

One module per command group in this folder; each has ORDER and add(subparsers), which registers
its parsers and sets `func`. main() only dispatches: whatever a user can get wrong (a bad flag
value, a missing model, an unreadable trace file, Ctrl-C) ends with one line on stderr and a
non-zero exit status, never a traceback.
"""

from __future__ import annotations

import _thread
import argparse
import sys
import time
from types import ModuleType

from explorer._registry import Registry

EXIT_USAGE, EXIT_INTERRUPTED = 2, 130


COMMANDS: Registry[ModuleType] = Registry("command group")


def _groups() -> list:
    """The command-group modules of this folder (each has ORDER and add(subparsers)), in order."""
    for module in Registry.discover(__name__, skip=("common", "__main__")):
        if hasattr(module, "add"):
            COMMANDS.add(module.__name__.rsplit(".", 1)[1], module)
    return COMMANDS.values()


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (which flag, what is wrong, where the help is)."""

    def error(self, message: str):
        print(f"explorer: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="explorer", description="See LLM inference step by step.")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in _groups():
        group.add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The console-script entry: Ctrl-C anywhere, start-up (torch's import) included, is one line
    and exit status 130."""
    previous = sys.unraisablehook
    sys.unraisablehook = _redeliver(previous)
    try:
        return _main(argv)
    except KeyboardInterrupt as err:
        print(f"explorer: {_interrupted(err)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        sys.unraisablehook = previous


def _redeliver(previous):
    """An unraisable hook: a Ctrl-C that landed in a weakref or gc callback (where Python prints
    and drops it) is raised again in the main thread instead of being lost; the rest as before."""

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            # from another thread, so that it arrives after this hook returns (raised inside
            # the hook, it would be dropped again), at the main thread's next bytecode
            _thread.start_new_thread(_interrupt_soon, ())
            return
        previous(unraisable)

    return hook


def _interrupt_soon() -> None:
    time.sleep(0.001)  # the hook has returned by then
    _thread.interrupt_main()


def _interrupted(err: KeyboardInterrupt) -> str:
    """What an interrupt stopped: a serving run says what it had measured."""
    res = getattr(err, "result", None)
    if res is None:
        return str(err) if str(err).startswith("interrupted") else "interrupted (Ctrl-C)"
    done = sum(1 for r in res.records if r.ok)
    return (
        f"interrupted (Ctrl-C) during the {res.label} run: {done} of {len(res.records)} requests "
        "had finished; nothing after it ran and no figure of it is reported as complete"
    )


def _main(argv: list[str] | None) -> int:
    from explorer.engine.trace import TraceFormatError
    from explorer.model import ModelNotFoundError, is_out_of_memory

    try:
        args = build_parser().parse_args(
            argv
        )  # argparse prints its own one-line usage error, exit 2
        return args.func(args) or 0
    except SystemExit as done:  # argparse: --help (0) or a usage error it has already printed (2)
        return done.code if isinstance(done.code, int) else EXIT_USAGE
    except (ModelNotFoundError, TraceFormatError, ValueError) as err:
        print(f"explorer: {_one_line(err)}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as err:
        print(
            f"explorer: {err.strerror or err}: {err.filename}"
            if err.filename
            else f"explorer: {err}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    except (MemoryError, RuntimeError) as err:
        if not is_out_of_memory(err):
            raise
        print(
            f"explorer: out of memory: {_one_line(err)}; try a smaller batch, context or model",
            file=sys.stderr,
        )
        return 1


def _one_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    lines = text.splitlines()
    return lines[0] + (
        f" ({'; '.join(line.strip() for line in lines[1:] if line.strip())})"
        if len(lines) > 1
        else ""
    )
