"""The Speculative tab: draft/target rounds over the dashboard's model, prompt and sampling.

Round runs one speculative round (explorer.engine.speculative.SpeculativeSession.step()) and appends it to
the charts; Benchmark times k = 1..k against target-only decoding in one run
(explorer.bench.speculative.benchmark, one k at a time so the progress bar moves) and draws predicted vs measured speedup.
"""

from __future__ import annotations

import time

import ipywidgets as W
import plotly.graph_objects as go

from explorer import plots
from explorer._format import number
from explorer.app.controls import tagged
from explorer.app.guard import on_engine_thread
from explorer.app.messages import stop_text
from explorer.app.runner import Runner
from explorer.app.tabs import Tab, register
from explorer.app.views import LiveChart, figure_widget
from explorer.engine.session import prompt_input

RUN_TOKENS = 32


@register(50)
class SpeculativeTab(Tab):
    name, title = "speculative", "Speculative"
    about = (
        "How to read it: each round is one row (green: draft tokens the target accepted, red: the "
        "first it rejected, orange or blue: the token the target adds itself, resampled after a "
        "rejection or a bonus); the more accepted per round, the fewer target passes per token."
    )

    def __init__(self, dash):
        super().__init__(dash)
        self.session = None  # explorer.engine.speculative.SpeculativeSession, built on a round
        self._key = None  # (target, draft, prompt, stop at eos) the session was built for
        self._alpha_counts: dict = {}
        self.rows: list = []  # the k benchmark's rows so far
        self.widget, self.parts = build(dash.model_names())
        p = self.parts
        self.rounds = LiveChart(p["spec-rounds"], plots.rounds_columns, "spec-rounds")
        self.alpha = LiveChart(
            p["spec-alpha"], lambda rs: plots.alpha_columns(rs, self._alpha_counts), "spec-alpha"
        )
        self.runner = Runner(
            self,
            "The speculative benchmark",
            controls=[p[n] for n in ("spec-step", "spec-run", "spec-reset", "spec-bench")]
            + [p["spec-draft"], p["spec-k"]],
            progress=p["spec-progress"],
            unit="values of k",
        )
        guard = dash.guard
        p["spec-step"].on_click(guard.action("A speculative round", lambda _: self.step()))
        p["spec-run"].on_click(guard.action("Speculative run", lambda _: self.run(RUN_TOKENS)))
        p["spec-reset"].on_click(guard.action("Speculative reset", lambda _: self.reset()))
        p["spec-bench"].on_click(lambda _: self.start_benchmark())

    # --- host hooks ---

    def figures(self) -> list[go.FigureWidget]:
        return [self.parts[n] for n in ("spec-rounds", "spec-alpha", "spec-hist", "spec-speedup")]

    # --- actions ---

    def step(self):
        """One round; returns the Round."""
        session = self._session()
        if session.done:
            self.dash.guard.say(
                f"The speculative run has stopped: {stop_text(session)}. Press Reset.", "info"
            )
            return None
        session.set_sampling(self.dash.session.sampling)
        rnd = on_engine_thread(session.step)
        self._render([rnd])
        return rnd

    def run(self, n_tokens: int) -> list:
        # seconds of work in one callback: the buttons are off and the status says so meanwhile
        self.set_busy(True)
        try:
            session = self._session()
            session.set_sampling(self.dash.session.sampling)
            before = len(session.tokens)
            self.parts["spec-status"].value = f"Running {n_tokens} tokens..."
            rounds = on_engine_thread(session.run, n_tokens) if not session.done else []
        finally:
            self.set_busy(False)
        self._render(rounds)
        emitted = len(session.tokens) - before
        if session.done:  # ended before the tokens asked for: say why
            self.dash.guard.say(
                f"The speculative run stopped after {emitted} of {n_tokens} tokens: "
                f"{stop_text(session)}. Reset starts again.",
                "info",
            )
        return rounds

    def reset(self) -> None:
        self.session, self._key = None, None
        self._alpha_counts.clear()
        self.rounds.reset()
        self.alpha.reset()
        plots.replace(self.parts["spec-hist"], plots.accepted_histogram_columns([]))
        self.parts["spec-status"].value = "Reset: press Round."

    def start_benchmark(self) -> bool:
        """Benchmark k = 1..k on a background thread (the progress bar moves per k)."""
        try:
            k_max = _check_k(self.parts["spec-k"].value)
            target = self.dash.session.lm
            if self.parts["spec-draft"].value == PROMPT_LOOKUP:
                raise ValueError(
                    "the k benchmark times a draft model's passes; prompt lookup has none: press "
                    "Round to watch it, or run `explorer bench lookup` for its speedup"
                )
            draft = self.dash.load_model(self.parts["spec-draft"].value)
            from explorer.engine.speculative import check_pair

            check_pair(target, draft)
        except Exception as err:  # noqa: BLE001
            self.dash.guard.fail(err, "The speculative benchmark")
            return False
        args = (target, draft, self._prompt(target), self.dash.session.sampling, k_max)
        return self.runner.start(
            f"Benchmarking k = 1..{k_max} against target-only decoding…", self._benchmark, *args
        )

    def _benchmark(self, target, draft, prompt, sampling, k_max: int) -> None:
        from explorer.bench.speculative import benchmark

        speedup = self.parts["spec-speedup"]
        self.rows = rows = []
        self.runner.tick(0, k_max)
        t0 = time.perf_counter()
        try:
            for k in range(1, k_max + 1):
                rows.extend(
                    benchmark(target, draft, prompt, sampling, ks=[k], n_tokens=32, repeats=2)
                )
                self.runner.tick(k, k_max)
        finally:  # the rows finished so far stay on the chart, even after an error
            if rows:
                plots.replace(speedup, plots.speedup_columns(rows))
        best = max(rows, key=lambda r: r["measured"])
        self.runner.finished(
            f"Benchmark done in {time.perf_counter() - t0:.1f} s: best measured speedup "
            f"{best['measured']:.2f}x at k={best['k']} (alpha {best['alpha']:.2f}); "
            f"{rows[0]['timing']}; 2 repeats, 32 tokens, {rows[0]['device']} {rows[0]['dtype']}."
        )

    # --- internals ---

    def _prompt(self, lm):
        return prompt_input(lm, self.dash.run_settings.prompt)

    def _session(self):
        from explorer.engine.speculative import SpeculativeSession

        k = _check_k(self.parts["spec-k"].value)
        chosen = self.parts["spec-draft"].value
        target = self.dash.session.lm
        rs = self.dash.run_settings
        key = (target.info.name, chosen, rs.prompt, rs.stop_at_eos)
        if self.session is not None and self._key == key:
            if self.session.k != k:
                self.session.set_k(k)
            return self.session
        if chosen == PROMPT_LOOKUP:
            from explorer.engine.speculative import PromptLookup

            draft = PromptLookup()
        else:
            draft = self.dash.load_model(chosen)
        session = SpeculativeSession(
            target,
            draft,
            self._prompt(target),
            self.dash.session.sampling,
            k=k,
            top_n=self.dash.run_settings.top_n,
            max_new_tokens=self.dash.run_settings.max_new_tokens,
            stop_at_eos=self.dash.run_settings.stop_at_eos,  # the side panel's choice, as Play
        )
        self.reset()
        self.session, self._key = session, key
        return session

    def _render(self, rounds) -> None:
        if not rounds:
            return
        self.rounds.append(rounds, {"yaxis.range": plots.rounds_range(rounds[-1].index)})
        self.alpha.append(rounds)
        stats = self.session.stats()
        plots.replace(
            self.parts["spec-hist"], plots.accepted_histogram_columns(stats["accepted_histogram"])
        )
        alpha = number(stats["alpha"], ".3f")
        status = self.parts["spec-status"]
        status.value = (
            f"{stats['rounds']} rounds, {stats['emitted']} tokens emitted, alpha {alpha} "
            f"(accepted {stats['accepted']} of {stats['tested']} tested), "
            f"{stats['mean_tokens_per_round']:.2f} tokens per round; draft passes "
            f"{stats['draft_s'] * 1e3:.1f} ms, verify passes {stats['verify_s'] * 1e3:.1f} ms "
            f"(measured). Text: {self.session.text[-120:]!r}"
        )
        last = rounds[-1]
        if self.session.lookup is not None:
            status.value += f"<br>Round {last.index}: " + (
                f"copied {last.k} ids from positions {last.lookup['from']}..{last.lookup['to'] - 1} "
                f"after a {last.lookup['n']}-gram match"
                if last.lookup
                else "no earlier n-gram matched: a plain target step"
            )


PROMPT_LOOKUP = "prompt lookup (no draft model)"  # the draft copies n-gram continuations


def build(model_names: list[str]) -> tuple[W.Widget, dict]:
    """The tab's widget and its parts (name -> widget, CSS class ie-<name>); no callbacks."""
    parts = controls(model_names)
    for name, figure in (
        ("spec-rounds", plots.rounds_figure),
        ("spec-alpha", plots.alpha_figure),
        ("spec-hist", plots.accepted_histogram_figure),
        ("spec-speedup", plots.speedup_figure),
    ):
        parts[name] = tagged(figure_widget(figure), name)
    page = W.VBox(
        [
            W.HTML(
                "<b>Speculative decoding</b>: the draft proposes, the target checks all proposals "
                "in one pass; the output is distributed exactly as the target's own samples."
            ),
            W.HBox(
                [parts[n] for n in ("spec-draft", "spec-k", "spec-step", "spec-run", "spec-reset")]
            ),
            parts["spec-status"],
            parts["spec-rounds"],
            W.HBox([parts["spec-alpha"], parts["spec-hist"]]),
            W.HBox([parts["spec-bench"], parts["spec-progress"]]),
            parts["spec-speedup"],
        ]
    )
    parts["speculative"] = tagged(page, "speculative")
    return page, parts


def controls(model_names: list[str]) -> dict[str, W.Widget]:
    """The tab's controls by part name (each tagged with its CSS class ie-<name>)."""
    draft = "bundled:draft" if "bundled:draft" in model_names else model_names[0]
    options = [*model_names, PROMPT_LOOKUP]
    widgets = {
        "spec-draft": W.Dropdown(
            options=options, value=draft, description="draft model", layout=W.Layout(width="280px")
        ),
        "spec-k": W.IntText(
            value=4,
            description="k (drafts)",
            continuous_update=False,
            layout=W.Layout(width="170px"),
        ),
        "spec-step": W.Button(
            description="Round",
            icon="step-forward",
            button_style="primary",
            tooltip="one round: k draft passes, one verify pass",
        ),
        "spec-run": W.Button(
            description=f"Run {RUN_TOKENS} tokens", icon="forward", layout=W.Layout(width="auto")
        ),
        "spec-reset": W.Button(description="Reset", icon="refresh"),
        "spec-bench": W.Button(
            description="Benchmark k = 1..k",
            icon="tachometer",
            layout=W.Layout(width="auto"),
            tooltip="predicted vs measured speedup against target-only decoding",
        ),
        "spec-progress": W.IntProgress(
            value=0, min=0, max=1, description="benchmark", layout=W.Layout(width="320px")
        ),
        "spec-status": W.HTML(
            value="Press Round: the draft proposes k tokens, the target verifies them in one pass."
        ),
    }
    return {name: tagged(widget, name) for name, widget in widgets.items()}


def _check_k(k) -> int:
    if not isinstance(k, int) or k < 1 or k > 16:
        raise ValueError(f"k (draft tokens per round) must be between 1 and 16, got {k!r}")
    return k
