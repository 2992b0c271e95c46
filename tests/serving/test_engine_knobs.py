"""Each serving engine's knobs are declared once (a Knobs dataclass): validation, the CLI flags, the
Serving tab's controls, the recorded result and the simulator's policy all read that declaration."""

from __future__ import annotations

import dataclasses
import pkgutil

import pytest

from explorer.serving import Workload, engines, serve
from explorer.serving.simulate import policy as policies

ALL = engines.names()
KNOBS = [(e, k) for e in ALL for k in engines.get(e).Knobs.specs()]


def bad_values(spec) -> list:
    """Values the declaration forbids: past each bound, outside the choices, the wrong type."""
    if spec.kind is bool:
        return ["yes"]
    if spec.choices:
        return ["not-a-choice"]
    if spec.kind is str:
        return [3]
    out = [] if spec.optional else [None]
    if spec.low is not None:
        out.append(spec.low if spec.low_open else spec.low - 1)
    if spec.high is not None:
        out.append(spec.high if spec.high_open else spec.high + 1)
    if spec.kind is int:
        out.append(1.5)
    return out


def test_every_engine_module_registers_itself():
    modules = {m.name for m in pkgutil.iter_modules(engines.__path__) if not m.name.startswith("_")}
    assert set(ALL) == modules
    assert ALL[:3] == ("sequential", "static", "continuous")
    assert engines.names(local_only=True) == ("sequential", "static", "continuous")
    for name in ALL:
        cls = engines.get(name)
        assert cls.name == name and issubclass(cls.Knobs, engines.Knobs)
        assert cls.Knobs.engine == name
        cls.Knobs()  # the declared defaults are allowed values
        assert cls.Knobs.specs(), f"{name} declares no knobs"


@pytest.mark.parametrize("engine, knob", KNOBS)
def test_a_knobs_range_is_enforced_from_its_declaration(engine, knob):
    spec = engines.get(engine).Knobs.specs()[knob]
    bad = bad_values(spec)
    assert bad
    for value in bad:
        with pytest.raises(ValueError, match=f"^{engine} engine: {knob}\\b.*must be") as err:
            engines.make(engine, None, **{knob: value})  # the knobs fail before the model check
        assert spec.range_text() in str(err.value)
    engines.make(engine, object(), **{knob: getattr(engines.get(engine).Knobs(), knob)})


def test_an_unknown_knob_is_named_with_the_engines_knobs():
    with pytest.raises(ValueError, match="the static engine has no knob page_size; its knobs are"):
        engines.knobs_of("static", {"page_size": 16})


def flag_value(spec, default):
    """A value the knob allows other than its default, as typed on the command line."""
    if spec.kind is bool:
        return not default, ["--no-" if default else "--"]
    if spec.choices:
        return next(c for c in spec.choices if c != default), None
    if spec.kind is str:
        return "https://example.org:1", None
    value = (spec.low or 0) + (2 if spec.kind is int else 0.5)
    return value, None


@pytest.mark.parametrize("command", [["bench", "serving"], ["simulate"]])
def test_cli_flags_exist_for_every_knob_of_every_engine(command):
    from explorer.cli import build_parser
    from explorer.cli.serving import knobs_of

    modelled = command == ["simulate"]
    names = policies.modelled() if modelled else ALL
    served = {"vllm", "vllm-v0", "sglang", "trtllm"}  # their policies declare their own knobs
    assert set(policies.modelled()) == {"sequential", "static", "continuous"} | served
    parser = build_parser()
    for engine in names:
        defaults = policies.knobs_class(engine)()
        args = parser.parse_args([*command, "--engine", engine])
        assert knobs_of(args, engine) == {}  # no flag given: the declaration's defaults
        for knob, spec in defaults.specs().items():
            value, prefix = flag_value(spec, getattr(defaults, knob))
            flag = (spec.cli or "--" + knob.replace("_", "-")).removeprefix("--")
            argv = [f"{prefix[0]}{flag}"] if prefix else [f"--{flag}", str(value)]
            args = parser.parse_args([*command, "--engine", engine, *argv])
            assert knobs_of(args, engine) == {knob: value}, (engine, knob)
            policies.knobs_class(engine)(**knobs_of(args, engine))  # an allowed value


def test_the_serving_tab_has_a_control_for_every_knob_of_every_local_engine():
    from explorer.app.tabs.serving import build, knob_part, read_knobs, show_knobs

    _, parts = build()
    local = engines.names(local_only=True)
    assert list(parts["serve-engine"].options) == list(local)
    for engine in local:
        knobs = engines.get(engine).Knobs
        show_knobs(parts, engine)
        assert read_knobs(parts, engine) == knobs()  # the controls start at the defaults
        for knob, spec in knobs.specs().items():
            w = parts[knob_part(knob)]
            assert f"ie-{knob_part(knob)}" in w._dom_classes
            assert w.description == spec.label and w.layout.display is None
        for other in set(engines.knob_table(local)) - set(knobs.specs()):
            assert parts[knob_part(other)].layout.display == "none"
    parts[knob_part("max_batch")].value = 0
    with pytest.raises(ValueError, match="static engine: max_batch .*>= 1"):
        read_knobs(parts, "static")


@pytest.mark.parametrize("engine", ["sequential", "static", "continuous"])
def test_the_policy_and_the_real_engine_take_the_same_knobs(target, engine):
    from explorer.serving.simulate.run import engine_policy

    # the same defaults, from the one declaration
    assert engine_policy(engine, {}).knobs == engines.make(engine, target).knobs
    # one Knobs object reaches both
    knobs = engines.get(engine).Knobs()
    assert engines.make(engine, target, knobs=knobs).knobs is knobs
    assert policies.policy_for(engine, knobs).knobs is knobs
    with pytest.raises(TypeError, match=f"the {engine} policy takes"):
        policies.policy_for(engine, engines.get("http").Knobs())


def test_measured_and_simulated_results_record_the_same_knobs(target):
    from explorer.serving.simulate import StepModel, simulate

    wl = Workload(num_prompts=3, input_len=6, output_len=3)
    knobs = engines.get("static").Knobs(max_batch=2, max_wait_s=0.0)
    measured = serve(target, wl, "static", knobs=knobs)
    model = StepModel(1e-10, 2e-11, 1e-3, 1e-4, 0.0, key={"device": "cpu", "dtype": "float32"})
    simulated = simulate(target.info, wl, "static", model, **dataclasses.asdict(knobs))
    want = {"engine": "static", "max_batch": 2, "max_wait_s": 0.0}
    assert measured.engine == want
    assert {k: simulated.engine[k] for k in want} == want


@pytest.mark.parametrize(
    "over, engine, want",
    [
        ("batch", "static", {"max_batch": 4}),
        ("batch", "continuous", {"max_requests_per_batch": 4}),
        ("batch", "sequential", {}),
        ("kv", "continuous", {"num_blocks": 4}),
    ],
)
def test_the_serving_sweep_sets_the_knob_each_engine_names(over, engine, want):
    from explorer.sweeps.serving import _setting

    _, knobs = _setting(over, 4, engine, 2, 8, 4, 0)
    assert knobs == want
    engines.knobs_of(engine, knobs)  # a knob the engine takes, in range


def test_a_new_engine_is_one_registered_class_with_its_knobs(monkeypatch):
    """Registering an engine (as its module would) is all the CLI and the validation need."""
    from explorer.cli import build_parser
    from explorer.cli.serving import knobs_of
    from explorer.engine.settings import setting

    monkeypatch.setattr(engines.ENGINES, "entries", dict(engines.ENGINES.entries))

    @dataclasses.dataclass
    class ToyKnobs(engines.Knobs):
        lanes: int = setting(2, "lanes", "requests served side by side", low=1, high=8)

    @engines.register("toy", ToyKnobs, order=50)
    class Toy(engines.Engine):
        pass

    assert engines.names()[-1] == "toy" and engines.make("toy", object()).knobs == ToyKnobs()
    args = build_parser().parse_args(["bench", "serving", "--engine", "toy", "--lanes", "3"])
    assert knobs_of(args, "toy") == {"lanes": 3}
    with pytest.raises(ValueError, match="toy engine: lanes must be a whole number >= 1 and <= 8"):
        engines.make("toy", object(), lanes=9)
    with pytest.raises(
        ValueError,
        match="the simulator has no policy for engine .toy.; it models sequential, static, "
        "continuous, vllm",
    ):
        policies.policy_for("toy", ToyKnobs())
