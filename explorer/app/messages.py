"""What the dashboard's message area says: the model ready, what changed, why a run stopped, a
model loading (with the seconds so far)."""

from __future__ import annotations

import contextlib
import threading
import time

from explorer.app.voila.sharing import sharing_note
from explorer.engine.sampling import Sampling

NOISE_NOTE = (
    "Random weights (an architecture-only shape): the text is noise, the token ids it picks mean "
    "nothing. Only the costs are real: latency, memory traffic, roofline."
)
HINT = "Press Step or Play."  # the first message's last words; replaced by the first step's
STEPPING = (
    "Stepping: the count beside the buttons follows each step (its phase, its time, the tokens so "
    "far); click a cell of the strip to look at an earlier step."
)


def ready_text(lm, fallback_note: str = "") -> str:
    """The first message: the model, its size and device; what a random-weight or tokenizer-free
    model shows."""
    info = lm.info
    note = f" {NOISE_NOTE}" if info.random_weights else ""
    tok = (
        ""
        if lm.tokenizer is not None
        else " It has no tokenizer: the prompt is fed as its UTF-8 bytes (or type token ids: "
        "1 2 3) and tokens show as <id>."
    )
    shared = sharing_note()
    return (
        f"{fallback_note}{info.name}: {info.parameters / 1e6:.1f}M parameters, {info.layers} "
        f"layers, on {info.device} {info.dtype}.{note}{tok}{' ' + shared if shared else ''} {HINT}"
    )


def stop_text(session) -> str:
    """Why a session (or a speculative run) stopped, and what lets it go on."""
    reason = session.stop_reason
    lm = getattr(session, "lm", None) or getattr(session, "target", None)
    positions = getattr(getattr(lm, "info", None), "max_positions", None)
    texts = {
        "eos": "the model wrote its end-of-text token (untick 'stop at end-of-text' to go past it)",
        "max_new_tokens": "max tokens reached (raise 'max tokens' to go on)",
        "max_positions": f"the model's context is full ({positions or 'all its'} positions)",
        "cache_len": "the static cache is full (prompt + max tokens; raise max tokens)",
    }
    return texts.get(reason, str(reason))


@contextlib.contextmanager
def loading(guard, name: str, rough_s: float | None, refresh):
    """While a model loads (the body): the guard is busy (refresh() turns Step, Play and the
    other runs off) and the message says what loads, for how long so far and about how long it
    takes, once a second from a helper thread."""
    about = f"; loading takes about {rough_s:.0f} s" if rough_s else ""
    done = threading.Event()
    t0 = time.perf_counter()

    def tick() -> None:
        while not done.wait(1.0):
            guard.say(
                f"Loading {name}… {time.perf_counter() - t0:.0f} s so far{about}. Step and Play "
                "come back when it is ready.",
                "busy",
            )

    guard.busy = f"Loading {name}"
    refresh()
    guard.say(f"Loading {name}… (Step and Play come back when it is ready{about}.)", "busy")
    ticker = threading.Thread(target=tick, name="explorer-loading", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
        guard.busy = None


def sampling_text(s: Sampling) -> str:
    d = s.to_dict()
    default = Sampling().to_dict()
    changed = [f"{k}={v}" for k, v in d.items() if v != default[k]]
    return ", ".join(changed) if changed else "plain sampling at temperature 1"


def compiled_note(session) -> str:
    c = session.trace.settings.get("compile")
    if not c:
        return ""
    if not c["active"]:
        return f"; torch.compile failed, running eager ({c['reason']})"
    return f"; compiled in {c['compile_s']:.1f} s, kept out of every step's latency"


def what_changed(old, new) -> str:
    names = {
        "model": "model",
        "prompt": "prompt",
        "use_cache": "KV cache",
        "batch_size": "batch size",
        "top_n": "top-n",
        "max_new_tokens": "max tokens",
        "stop_at_eos": "stop at end-of-text",
        "cache_type": "cache type",
        "compile": "compile",
        "weights": "weights",
    }
    changed = [label for key, label in names.items() if getattr(old, key) != getattr(new, key)]
    return ", ".join(changed) + " changed" if changed else "same settings"
