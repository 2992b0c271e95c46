"""The dashboard's controls: widgets with stable CSS classes, and readers that turn them into settings.

Each control carries `ie-<name>` (browser tests find it by that class). Numbers use text boxes,
not sliders, so any value can be typed and a bad one gets a message instead of being clamped;
expensive controls (prompt, model, batch, ...) use continuous_update=False.
"""

from __future__ import annotations

from dataclasses import dataclass

import ipywidgets as W

from explorer.sampling import Sampling

CUSTOM_MODEL = "other: hub id or local path…"
LABEL = W.Layout(width="250px")
STYLE = {"description_width": "110px"}


def _cls(widget: W.Widget, name: str) -> W.Widget:
    widget.add_class(f"ie-{name}")
    return widget


def sampling_controls(s: Sampling) -> dict[str, W.Widget]:
    """temperature, top-k, top-p, min-p, repetition penalty, seed, greedy (apply from the next step)."""
    kw = dict(layout=LABEL, style=STYLE, continuous_update=False)
    return {
        "temperature": _cls(W.FloatText(value=s.temperature, step=0.1, description="temperature",
                                        tooltip="0 = greedy", **kw), "temperature"),
        "top-k": _cls(W.IntText(value=s.top_k, description="top-k", tooltip="0 = off", **kw), "top-k"),
        "top-p": _cls(W.FloatText(value=s.top_p, step=0.05, description="top-p", tooltip="1 = off", **kw), "top-p"),
        "min-p": _cls(W.FloatText(value=s.min_p, step=0.01, description="min-p", tooltip="0 = off", **kw), "min-p"),
        "repetition-penalty": _cls(W.FloatText(value=s.repetition_penalty, step=0.05, description="rep. penalty",
                                               tooltip="1 = off", **kw), "repetition-penalty"),
        "seed": _cls(W.Text(value="" if s.seed is None else str(s.seed), placeholder="random",
                            description="seed", **kw), "seed"),
        "greedy": _cls(W.Checkbox(value=s.greedy, description="greedy (argmax)", indent=False), "greedy"),
    }


@dataclass
class RunSettings:
    """What a new Session is built from (changing any of these starts a new Session)."""

    model: str
    prompt: str
    use_cache: bool = True
    batch_size: int = 1
    top_n: int = 20
    max_new_tokens: int | None = 200
    stop_at_eos: bool = True


def session_controls(models: list[str], rs: RunSettings, *, free_text: bool) -> dict[str, W.Widget]:
    """model, prompt, cache, batch, top-n, max tokens, stop at end-of-text."""
    options = list(models) + ([CUSTOM_MODEL] if free_text else [])
    value = rs.model if rs.model in models else (CUSTOM_MODEL if free_text else models[0])
    parts = {
        "model": _cls(W.Dropdown(options=options, value=value, description="model", layout=LABEL, style=STYLE),
                      "model"),
        "prompt": _cls(W.Textarea(value=rs.prompt, description="prompt", continuous_update=False,
                                  layout=W.Layout(width="250px", height="80px"), style=STYLE), "prompt"),
        "cache": _cls(W.Checkbox(value=rs.use_cache, description="KV cache", indent=False), "cache"),
        "batch": _cls(W.IntText(value=rs.batch_size, description="batch size", continuous_update=False,
                                layout=LABEL, style=STYLE), "batch"),
        "top-n": _cls(W.IntText(value=rs.top_n, description="top-n shown", continuous_update=False,
                                layout=LABEL, style=STYLE), "top-n"),
        "max-tokens": _cls(W.IntText(value=rs.max_new_tokens or 0, description="max tokens",
                                     tooltip="0 = until EOS or the model's last position",
                                     continuous_update=False, layout=LABEL, style=STYLE), "max-tokens"),
        "stop-eos": _cls(W.Checkbox(value=rs.stop_at_eos, description="stop at end-of-text", indent=False),
                         "stop-eos"),
    }
    if free_text:
        custom = W.Text(value="" if rs.model in models else rs.model, placeholder="e.g. Qwen/Qwen2.5-0.5B or /path",
                        description="hub id / path", continuous_update=False, layout=LABEL, style=STYLE)
        parts["model-custom"] = _cls(custom, "model-custom")
    return parts


def buttons() -> dict[str, W.Widget]:
    def button(name: str, label: str, icon: str, style: str = "", tip: str = "") -> W.Button:
        return _cls(W.Button(description=label, icon=icon, button_style=style, tooltip=tip,
                             layout=W.Layout(width="92px")), name)

    return {
        "step": button("step", "Step", "step-forward", "primary", "one forward pass, one token"),
        "play": button("play", "Play", "play", "success", "step until Pause, a stop, or max tokens"),
        "pause": button("pause", "Pause", "pause", "", "stop Play after the current step"),
        "rewind": button("rewind", "Rewind", "step-backward", "", "drop the last token (cache cropped)"),
        "reset": button("reset", "Reset", "refresh", "warning", "a new session with the current settings"),
    }


def read_sampling(parts: dict[str, W.Widget]) -> Sampling:
    """A validated Sampling from the controls (raises ValueError with a readable message)."""
    seed_text = parts["seed"].value.strip()
    if seed_text in ("", "random", "none", "None"):
        seed = None
    else:
        try:
            seed = int(seed_text)
        except ValueError:
            raise ValueError(f"seed must be a whole number >= 0, or empty for a random seed; got {seed_text!r}") from None
    return Sampling(temperature=float(parts["temperature"].value), top_k=int(parts["top-k"].value),
                    top_p=float(parts["top-p"].value), min_p=float(parts["min-p"].value),
                    repetition_penalty=float(parts["repetition-penalty"].value), seed=seed,
                    greedy=bool(parts["greedy"].value))


def write_sampling(parts: dict[str, W.Widget], s: Sampling) -> None:
    """Show `s` in the controls (used to put back the session's settings after a bad value)."""
    parts["temperature"].value = s.temperature
    parts["top-k"].value = s.top_k
    parts["top-p"].value = s.top_p
    parts["min-p"].value = s.min_p
    parts["repetition-penalty"].value = s.repetition_penalty
    parts["seed"].value = "" if s.seed is None else str(s.seed)
    parts["greedy"].value = s.greedy


def read_run_settings(parts: dict[str, W.Widget]) -> RunSettings:
    """The session-level settings from the controls, validated (ValueError on a bad value)."""
    model = parts["model"].value
    if model == CUSTOM_MODEL:
        model = parts["model-custom"].value.strip() if "model-custom" in parts else ""
        if not model:
            raise ValueError("type a hub id (e.g. Qwen/Qwen2.5-0.5B) or a local folder in 'hub id / path'")
    batch, top_n, max_tokens = parts["batch"].value, parts["top-n"].value, parts["max-tokens"].value
    if batch < 1 or batch > 256:
        raise ValueError(f"batch size must be between 1 and 256, got {batch}")
    if top_n < 1 or top_n > 200:
        raise ValueError(f"top-n shown must be between 1 and 200, got {top_n}")
    if max_tokens < 0:
        raise ValueError(f"max tokens must be >= 0 (0 = no limit), got {max_tokens}")
    return RunSettings(model=model, prompt=parts["prompt"].value, use_cache=bool(parts["cache"].value),
                       batch_size=batch, top_n=top_n, max_new_tokens=max_tokens or None,
                       stop_at_eos=bool(parts["stop-eos"].value))


def write_run_settings(parts: dict[str, W.Widget], rs: RunSettings) -> None:
    """Show `rs` in the controls (put back after a change that could not be applied)."""
    options = parts["model"].options
    if rs.model in options:
        parts["model"].value = rs.model
    elif "model-custom" in parts:
        parts["model"].value = CUSTOM_MODEL
        parts["model-custom"].value = rs.model
    parts["prompt"].value = rs.prompt
    parts["cache"].value = rs.use_cache
    parts["batch"].value = rs.batch_size
    parts["top-n"].value = rs.top_n
    parts["max-tokens"].value = rs.max_new_tokens or 0
    parts["stop-eos"].value = rs.stop_at_eos
