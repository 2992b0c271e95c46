"""Trace / Step / table -> plotly Figure: the only room that imports plotly, one module per topic.

    common        the house style; extend / replace / clear on named traces; figure_html
    strip         the token strip            distribution  one step's distribution and stages
    latency       latency per step           traffic       bytes moved by part, achieved bandwidth
    roofline      intensity vs ceilings      speculative   rounds, alpha, accepted lengths, speedup
    sweeps        the registered sweeps' charts (explorer.sweeps)
    pays          where a trick pays: speedup over a setting by regime, the atlas of all tricks
    serving       many requests: Gantt, ITL timeline, latency CDFs, engine state, Pareto
    scenarios     seeing it break: a failure scenario's broken run beside its fixed run
    why           one step's split (floors + overhead), the profiler breakdown, the trust table
    inside        logit lens and the newest token's attention
    moe           mixture of experts: the moe sweep's chart, the router's choice, load per expert
    step          the step, drawn: the model op by op, coloured by bound; the operators' roofline

Every name is also reachable as `explorer.plots.<name>` (e.g. plots.strip_figure).
"""

from explorer.plots import (
    common,
    distribution,
    inside,
    latency,
    moe,
    pays,
    roofline,
    scenarios,
    serving,
    speculative,
    step,
    strip,
    sweeps,
    traffic,
    why,
)

_MODULES = (
    common, strip, distribution, latency, traffic, roofline, speculative, sweeps, serving, scenarios,
    why, inside, pays, moe, step,
)  # fmt: skip
__all__: list[str] = []
for _m in _MODULES:
    for _name, _value in vars(_m).items():
        if not _name.startswith("_") and getattr(_value, "__module__", _m.__name__) == _m.__name__:
            globals()[_name] = _value
            __all__.append(_name)
for _name in (
    "STRIP_WINDOW",
    "STRIP_SCALES",
    "SPEC_ROUNDS_WINDOW",
    "OUTCOME_COLORS",
    "AI_RANGE",
    "PHASE_COLORS",
    "PART_COLORS",
    "TRAFFIC_PARTS",
    "MB",
    "BASE_LAYOUT",
    "Columns",
    "SWEEP_PLOTS",
    "SPLIT_COLORS",
    "REGIME_COLORS",
    "OVERHEAD_CEILING",
    "SINK_SHARE",
    "LOG_AXIS",
    "LOG_AXIS_WIDE",
):
    for _m in _MODULES:
        if hasattr(_m, _name):
            globals()[_name] = getattr(_m, _name)
            __all__.append(_name)
