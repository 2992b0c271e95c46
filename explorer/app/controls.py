"""The dashboard's controls: widgets with stable CSS classes, and readers that turn them into settings.

Each control carries `ie-<name>` (browser tests find it by that class). Numbers use text boxes,
not sliders, so any value can be typed and a bad one gets a message instead of being clamped;
expensive controls (prompt, model, batch, ...) use continuous_update=False.
"""

from __future__ import annotations

from dataclasses import dataclass

import ipywidgets as W

from explorer.engine.options import CACHE_TYPES
from explorer.engine.sampling import Sampling
from explorer.engine.settings import SessionOptions, Spec, specs

CUSTOM_MODEL = "other: hub id or local path…"
LABEL = W.Layout(width="250px")
STYLE = {"description_width": "110px"}


def tagged(widget: W.Widget, name: str) -> W.Widget:
    """Tag a widget with the CSS class ie-<name> (tests and the browser find it by that)."""
    widget.add_class(f"ie-{name}")
    return widget


def stop_button(name: str, tooltip: str) -> W.Button:
    """A background run's Stop button (off until the run starts; its Runner wires the click),
    tagged ie-<name>."""
    return tagged(W.Button(description="Stop", icon="stop", disabled=True, tooltip=tooltip), name)


SESSION_WIDGETS = {
    "use_cache": "cache",
    "batch_size": "batch",
    "top_n": "top-n",
    "max_new_tokens": "max-tokens",
    "stop_at_eos": "stop-eos",
}  # SessionOptions field -> control name (its CSS class)


def widget_name(field: str) -> str:
    return SESSION_WIDGETS.get(field, field.replace("_", "-"))


def control(spec: Spec, value, name: str) -> W.Widget:
    """The widget a setting's Spec calls for, showing `value` (bad typed values get a message, not clamped)."""
    kw = dict(
        description=spec.label,
        tooltip=spec.help,
        layout=LABEL,
        style=STYLE,
        continuous_update=False,
    )
    if spec.kind is bool:
        widget = W.Checkbox(value=bool(value), description=spec.label, indent=False)
    elif spec.choices:
        kw.pop("continuous_update")
        widget = W.Dropdown(value=value, options=list(spec.choices), **kw)
    elif spec.kind is str:
        widget = W.Text(value=value or "", placeholder="none" if spec.optional else "", **kw)
    elif spec.optional and spec.low is not None and spec.low >= 1:  # 0 is free to mean "none"
        widget = W.IntText(value=value or 0, **{**kw, "tooltip": f"0 = none: {spec.help}"})
    elif spec.optional:
        widget = W.Text(
            value="" if value is None else str(value),
            placeholder="random" if name == "seed" else "none",
            **kw,
        )
    elif spec.kind is int:
        widget = W.IntText(value=value, **kw)
    else:
        widget = W.FloatText(value=value, step=spec.step or 0.1, **kw)
    return tagged(widget, name)


def read_control(field: str, spec: Spec, widget: W.Widget):
    """The typed value of one control (ValueError naming the setting and its range)."""
    value = widget.value
    if spec.kind is bool:
        return bool(value)
    if spec.kind is str and not spec.choices:
        text = value.strip()
        return None if spec.optional and text.lower() in ("", "none") else text
    if spec.optional and spec.low is not None and spec.low >= 1:
        return None if value == 0 else value
    if spec.optional:
        text = str(value).strip()
        if text.lower() in ("", "random", "none"):
            return None
        try:
            return int(text)
        except ValueError:
            raise ValueError(
                f"{field} must be {spec.range_text()}; leave it empty for none "
                f"({spec.help}), got {text!r}"
            ) from None
    return value


def show_value(spec: Spec, widget: W.Widget, value) -> None:
    if spec.optional and not (spec.low is not None and spec.low >= 1):
        widget.value = "" if value is None else str(value)
    elif spec.optional:
        widget.value = value or 0
    else:
        widget.value = value


def sampling_controls(s: Sampling) -> dict[str, W.Widget]:
    """One control per Sampling field, from its declaration (apply from the next step)."""
    return {
        widget_name(f): control(spec, getattr(s, f), widget_name(f))
        for f, spec in specs(Sampling).items()
    }


def read_sampling(parts: dict[str, W.Widget]) -> Sampling:
    """A validated Sampling from the controls (raises ValueError with a readable message)."""
    return Sampling(
        **{f: read_control(f, spec, parts[widget_name(f)]) for f, spec in specs(Sampling).items()}
    )


def write_sampling(parts: dict[str, W.Widget], s: Sampling) -> None:
    """Show `s` in the controls (used to put back the session's settings after a bad value)."""
    for f, spec in specs(Sampling).items():
        show_value(spec, parts[widget_name(f)], getattr(s, f))


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
    cache_type: str = "dynamic"  # the ladder's engine options (explorer.engine.options)
    compile: bool = False
    weights: str = "as loaded"  # or a name of explorer.model.quant.WEIGHTS (a converted copy)

    def options(self) -> SessionOptions:
        """The engine options, validated against their declared ranges."""
        return SessionOptions(**{f: getattr(self, f) for f in specs(SessionOptions)})


def session_controls(models: list[str], rs: RunSettings, *, free_text: bool) -> dict[str, W.Widget]:
    """model, prompt, then one control per SessionOptions field (cache, batch, top-n, max tokens, stop)."""
    options = list(models) + ([CUSTOM_MODEL] if free_text else [])
    value = rs.model if rs.model in models else (CUSTOM_MODEL if free_text else models[0])
    parts = {
        "model": tagged(
            W.Dropdown(
                options=options,
                value=value,
                description="model",
                layout=LABEL,
                style={"description_width": "45px"},  # room for "arch:qwen2.5-0.5b"
            ),
            "model",
        ),
        "prompt": tagged(
            W.Textarea(
                value=rs.prompt,
                description="prompt",
                continuous_update=False,
                layout=W.Layout(width="250px", height="80px"),
                style=STYLE,
            ),
            "prompt",
        ),
    }
    parts.update(
        {
            widget_name(f): control(spec, getattr(rs, f), widget_name(f))
            for f, spec in specs(SessionOptions).items()
        }
    )
    parts.update(engine_controls(rs))
    if free_text:
        custom = W.Text(
            value="" if rs.model in models else rs.model,
            placeholder="e.g. Qwen/Qwen2.5-0.5B or /path",
            description="hub id / path",
            continuous_update=False,
            layout=LABEL,
            style=STYLE,
        )
        parts["model-custom"] = tagged(custom, "model-custom")
    return parts


# Page-wide style: tab titles as wide as their text (ipywidgets cuts them at 144 px: "optimisation
# ladde"); plotly's toolbar only while the pointer is over a chart, so it never sits on a title.
PAGE_CSS = """<style>
.ie-dashboard .lm-TabBar-tab { flex: 0 0 auto !important; max-width: none !important; }
.ie-dashboard .js-plotly-plot .modebar-container { opacity: 0; transition: opacity 0.2s; }
.ie-dashboard .js-plotly-plot:hover .modebar-container { opacity: 1; }
</style>"""


def side_panel(run_parts: dict[str, W.Widget], sampling_parts: dict[str, W.Widget]) -> W.VBox:
    """The side panel from the settings' declarations: the model and prompt, then every
    SessionOptions control, the engine's rungs and every Sampling control, in declaration order
    (a new setting's widget is shown without an edit here)."""
    engine = set(ENGINE_CONTROLS.values())
    first = [n for n in ("model", "model-custom", "prompt") if n in run_parts]
    session = [n for n in run_parts if n not in engine and n not in first]
    return W.VBox(
        [
            W.HTML("<b>Model and prompt</b>"),
            *(run_parts[n] for n in first + session),
            W.HTML("<b>Engine</b> (the optimisation ladder)"),
            *(run_parts[n] for n in ENGINE_CONTROLS.values()),
            W.HTML("<b>Sampling</b> (applies from the next step)"),
            *sampling_parts.values(),
        ],
        layout=W.Layout(width="270px", min_width="270px", overflow="hidden"),  # no scrollbar
    )


WEIGHTS_OFFERED = (
    "as loaded",
    "fp32",
    "bf16",
    "fp16",
    "int8",
    "int8:fbgemm",
    "int8:torchao",
    "int4",
)


def engine_controls(rs: RunSettings) -> dict[str, W.Widget]:
    """The ladder's rungs a Session can climb: cache type, torch.compile, the weights' format."""
    drop = dict(layout=LABEL, style=STYLE)
    weights = list(WEIGHTS_OFFERED) + ([rs.weights] if rs.weights not in WEIGHTS_OFFERED else [])
    return {
        "cache-type": tagged(
            W.Dropdown(
                options=list(CACHE_TYPES),
                value=rs.cache_type,
                description="cache type",
                tooltip="static: preallocated to prompt + max tokens (what torch.compile wants); fp8 / int4: a quantized KV cache (fewer KV bytes, a little error)",
                **drop,
            ),
            "cache-type",
        ),
        "compile": tagged(
            W.Checkbox(
                value=rs.compile,
                description="torch.compile the decode step",
                indent=False,
                tooltip="compiled once when the session starts (its time is said apart)",
            ),
            "compile",
        ),
        "weights": tagged(
            W.Dropdown(
                options=weights,
                value=rs.weights,
                description="weights",
                tooltip="a converted copy of the model; int8: fbgemm on CPU, torchao on CUDA; int4: "
                "torchao on CUDA",
                **drop,
            ),
            "weights",
        ),
    }


ENGINE_CONTROLS = {"cache_type": "cache-type", "compile": "compile", "weights": "weights"}


def button(
    name: str, label: str, icon: str, style: str = "", tip: str = "", width: str | None = "92px"
) -> W.Button:
    """A Button tagged ie-<name> (width None: as wide as its label)."""
    layout = W.Layout(width=width) if width else W.Layout()
    return tagged(
        W.Button(description=label, icon=icon, button_style=style, tooltip=tip, layout=layout), name
    )


def buttons() -> dict[str, W.Widget]:
    return {
        "step": button("step", "Step", "step-forward", "primary", "one forward pass, one token"),
        "play": button(
            "play", "Play", "play", "success", "step until Pause, a stop, or max tokens"
        ),
        "pause": button("pause", "Pause", "pause", "", "stop Play after the current step"),
        "rewind": button(
            "rewind", "Rewind", "step-backward", "", "drop the last token (cache cropped)"
        ),
        "reset": button(
            "reset", "Reset", "refresh", "warning", "a new session with the current settings"
        ),
    }


def read_run_settings(parts: dict[str, W.Widget]) -> RunSettings:
    """The session-level settings from the controls, validated (ValueError on a bad value)."""
    model = parts["model"].value
    if model == CUSTOM_MODEL:
        model = parts["model-custom"].value.strip() if "model-custom" in parts else ""
        if not model:
            raise ValueError(
                "type a hub id (e.g. Qwen/Qwen2.5-0.5B) or a local folder in 'hub id / path'"
            )
    values = {
        f: read_control(f, spec, parts[widget_name(f)]) for f, spec in specs(SessionOptions).items()
    }
    engine = {f: parts[name].value for f, name in ENGINE_CONTROLS.items()}
    rs = RunSettings(model=model, prompt=parts["prompt"].value, **values, **engine)
    rs.options()  # raises with the setting's name and range
    return rs


def write_run_settings(parts: dict[str, W.Widget], rs: RunSettings) -> None:
    """Show `rs` in the controls (put back after a change that could not be applied)."""
    options = parts["model"].options
    if rs.model in options:
        parts["model"].value = rs.model
    elif "model-custom" in parts:
        parts["model"].value = CUSTOM_MODEL
        parts["model-custom"].value = rs.model
    parts["prompt"].value = rs.prompt
    for f, spec in specs(SessionOptions).items():
        show_value(spec, parts[widget_name(f)], getattr(rs, f))
    for f, name in ENGINE_CONTROLS.items():
        parts[name].value = getattr(rs, f)


def labelled(parts: dict, prefix: str, label_width: str = "100px"):
    """A builder of labelled input widgets for a tab: box(kind, name, value, label, width, **kw)
    makes the widget, gives it the CSS class ie-<prefix>-<name> and stores it in parts."""

    def box(kind, name, value, label, width="190px", **kw):
        w = kind(
            value=value,
            description=label,
            layout=W.Layout(width=width),
            style={"description_width": label_width},
            **kw,
        )
        parts[f"{prefix}-{name}"] = tagged(w, f"{prefix}-{name}")
        return w

    return box
