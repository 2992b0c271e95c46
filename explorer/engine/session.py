"""The step-by-step engine: one forward pass per token, every sampling stage recorded.

The low-level phases (forward, kv_cache_bytes, crop_cache, copy_cache) live in explorer.model.passes,
prompt preparation in explorer.engine.prompt, turning a pass into a Step in explorer.engine.recording,
and the views of a step taken (profile, logit lens, attention, routing) in explorer.engine.views.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from contextlib import contextmanager

import torch

from explorer.costs.timing import Timer
from explorer.engine.options import graphs_compiled
from explorer.engine.prompt import (  # noqa: F401  (prompt_input re-exported for the dashboard)
    decode_ids,
    eos_ids,
    left_pad,
    pad_id,
    prompt_input,
    prompt_rows,
    trace_prompt,
)
from explorer.engine.recording import StepRecorder
from explorer.engine.routing import capture
from explorer.engine.sampling import (
    Draw,
    Sampling,
    choose_token,
    make_generator,
)
from explorer.engine.settings import SessionOptions, check_int
from explorer.engine.trace import Step, Trace
from explorer.engine.views import StepViews
from explorer.model.passes import (
    cache_length,
    copy_cache,
    crop_cache,
    forward,
)

# --- the Session ---------------------------------------------------------------------------------


class SessionDone(RuntimeError):
    """step() on a session that has stopped (EOS, max_new_tokens or max positions)."""


class SessionBusy(RuntimeError):
    """A step, profile or inside view was asked for while another one runs on the same session."""


class Session(StepViews, StepRecorder):
    """Step through generation one forward pass at a time, recording every step as a plain-data Step.

    The cache holds every token except the last chosen one; each step() feeds what is not yet in
    it (the prompt at prefill, then the last token; the whole sequence when use_cache=False),
    and picks the next token from the last position's logits through the sampling chain.

    prompt: a string, a list of strings (a batch), a list of token ids, or a list of id lists.
    A batch is left-padded with an attention mask; Steps describe row 0 and list every row's
    token in `row_tokens`. As in generate(), a row that has produced EOS gets the pad token from
    then on, and the session stops when every row has.
    """

    def __init__(
        self,
        lm,
        prompt,
        sampling: Sampling | None = None,
        *,
        use_cache: bool = True,
        top_n: int = 20,
        max_new_tokens: int | None = None,
        batch_size: int = 1,
        roofline: bool = True,
        stop_at_eos: bool = True,
        prefix_cache=None,
        cache: str = "dynamic",
        cache_len: int | None = None,
        compile: bool | str = False,
        weights: str | None = None,
    ):
        from explorer.engine.options import Compiled

        sampling = Sampling() if sampling is None else sampling
        _check_sampling(sampling)
        self.options = SessionOptions(
            use_cache=use_cache,
            batch_size=batch_size,
            top_n=top_n,
            max_new_tokens=max_new_tokens,
            stop_at_eos=stop_at_eos,
        )  # validates each against its declared range
        mode = _compile_mode(lm, self.options, cache, compile, prefix_cache)
        if weights is not None:
            from explorer.model.loader import with_weights

            lm = with_weights(lm, weights)  # a converted copy, cached on lm
        self.lm, self.device = lm, lm.device
        # a copy: later edits to the caller's object need set_sampling
        self.sampling = dataclasses.replace(sampling)
        self.use_cache = bool(use_cache)
        self.top_n = min(top_n, lm.info.vocab_size)
        self.max_new_tokens = max_new_tokens
        self.roofline = roofline
        self.stop_at_eos = stop_at_eos
        self._eos = eos_ids(lm)
        self._pad = pad_id(lm, self._eos)
        self._rows = prompt_rows(lm, prompt, batch_size)  # kept for _fresh_cache()'s prefix check
        self.batch_size = len(self._rows)
        self.prompt_len = max(len(r) for r in self._rows)  # padded length
        # ids [B, P], mask [B, P] or None
        self._ids, self._mask = left_pad(self._rows, self._pad, self.device)
        self.prefix_cache = prefix_cache  # explorer.engine.prefix.PrefixCache: copied in
        self.cache_type = cache if use_cache else None
        self.cache_len = self._static_cache_len(cache, cache_len)
        self._compiled = Compiled(lm.model, mode) if mode is not None else None
        self._recompiles: int | None = None  # graphs compiled during the latest timed pass
        self._cache = self._fresh_cache()
        self._start_bookkeeping(sampling.seed)
        self.trace = self._new_trace(prompt)
        self.stop_reason: str | None = None
        self._busy = threading.Lock()

    def _static_cache_len(self, cache: str, cache_len: int | None) -> int | None:
        """The static cache's length (None for a dynamic cache or none at all)."""
        if cache != "static":
            return None
        from explorer.engine.options import static_cache_len

        length = static_cache_len(
            self.prompt_len, self.max_new_tokens, self.lm.info.max_positions, cache_len
        )
        _check_static_cache(self.lm, length, self.batch_size)
        return length

    def _start_bookkeeping(self, seed: int | None) -> None:
        """The generator, the per-step records and the caches of a session that has not stepped."""
        self._gen = make_generator(seed)
        self._gen_states: list[torch.Tensor] = []  # generator state before each step, for rewind
        self._finished = [False] * self.batch_size
        self._last = None  # (step index, raw logits [B, V], stages) of the latest forward
        self._timer = Timer(self.device)
        self._text_cache = self._token_texts()  # {token id: text}, shared per tokenizer
        self._override: dict | None = None  # sampling fields when they differ from trace.settings
        self._device_name = str(self.device)
        self._peaks_cache = None  # explorer.costs.hardware.Peaks, measured on the first step

    def _new_trace(self, prompt) -> Trace:
        """The empty Trace: the prompt, every setting of this session, the model and the device."""
        lm = self.lm
        settings = {
            **self.sampling.to_dict(),
            "use_cache": self.use_cache,
            "top_n": self.top_n,
            "batch_size": self.batch_size,
            "max_new_tokens": self.max_new_tokens,
            "cache": self.cache_type,
            "cache_len": self.cache_len,
            "compile": None if self._compiled is None else self._compiled.to_dict(),
            "weights": lm.info.weights,
        }
        if self.prefix_cache is not None:
            settings["prefix_cache"] = {
                "tokens": cache_length(self._cache),
                "build_s": self.prefix_cache.build_s,
            }
        return Trace(
            prompt=trace_prompt(lm, prompt, self._rows),
            settings=settings,
            model=lm.info.to_dict(),
            device=str(self.device),
            dtype=lm.info.dtype,
            prompt_ids=list(self._rows[0]),
        )

    def _fresh_cache(self):
        """The cache before the prefill: empty (dynamic or static), or a copy of the prefix's KV."""
        from explorer.engine.options import new_cache

        if not self.use_cache:
            if self.prefix_cache is not None:
                raise ValueError("prefix_cache needs use_cache=True (it is a KV cache)")
            return None
        if self.prefix_cache is None:
            return new_cache(self.cache_type, self.lm.model, self.cache_len)
        if self._mask is not None:
            raise ValueError(
                "prefix_cache needs prompt rows of one length (left padding would shift the prefix)"
            )
        return self.prefix_cache.start(self.lm, self._rows)

    # --- public API ------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    @property
    def eos_ids(self) -> frozenset[int]:
        """The model's end-of-text token ids (a row that produces one has ended)."""
        return frozenset(self._eos)

    @property
    def tokens(self) -> list[int]:
        """Row 0's generated token ids so far."""
        return self._ids[0, self.prompt_len :].tolist()

    @property
    def row_tokens(self) -> list[list[int]]:
        """Every row's generated token ids (pad after a row's EOS)."""
        return self._ids[:, self.prompt_len :].tolist()

    @property
    def steps(self) -> list[Step]:
        return self.trace.steps

    @property
    def text(self) -> str:
        """Row 0's generated text."""
        return self._decode(self.tokens)

    @property
    def last_logits(self) -> torch.Tensor | None:
        """The raw logits [B, V] of the latest step (None before the first step, after rewind)."""
        return None if self._last is None else self._last[1]

    def inputs(self, length: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(token ids [B, L], attention mask [B, L] or None) of every row's first `length`
        positions (default: all so far)."""
        ids = self._ids if length is None else self._ids[:, :length]
        return ids, None if self._mask is None else self._mask[:, : ids.shape[1]]

    def cache_copy(self, n: int):
        """A copy of the KV cache's first n positions, every row (None: no cache kept;
        ValueError: it holds fewer)."""
        if self._cache is None:
            return None
        held = cache_length(self._cache)
        if held < n:
            raise ValueError(f"the session's cache holds {held} positions, fewer than {n}")
        return crop_cache(copy_cache(self._cache), n)

    def cache_head(self, n: int):
        """A copy of the KV cache's first n positions, row 0 only (ValueError: it holds fewer)."""
        if self._cache is None:
            raise ValueError(f"the session's cache holds 0 positions, fewer than {n}")
        cache = self.cache_copy(n)
        if self.batch_size > 1:
            with torch.inference_mode():
                cache.batch_select_indices(torch.tensor([0], device=self.device))
        return cache

    def step(self) -> Step:
        """Run exactly one forward pass and return its Step (raises SessionDone once stopped)."""
        return self._step(forced=None)

    def choose(self, token_id: int | str | list) -> Step:
        """Force the next token (a counterfactual branch): one forward pass, the token recorded as forced.

        An int (or the text of one token, e.g. " the") forces every row; a list gives one per row. Its
        probabilities and ranks are recorded.
        """
        ids = (
            [token_id] * self.batch_size
            if not isinstance(token_id, (list, tuple))
            else list(token_id)
        )
        ids = [self._token_of(t) if isinstance(t, str) else t for t in ids]
        if len(ids) != self.batch_size:
            raise ValueError(f"choose() got {len(ids)} ids for a batch of {self.batch_size} rows")
        vocab = self.lm.info.vocab_size
        for t in ids:
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab:
                raise ValueError(
                    f"token id {t!r} is outside the vocabulary: ids go from 0 to {vocab - 1}"
                )
        return self._step(forced=torch.tensor(ids, device=self.device))

    def _token_of(self, text: str) -> int:
        """The id of a token given by its text (exactly one token), e.g. choose(" the")."""
        tok = self.lm.tokenizer
        if tok is None:
            raise ValueError(
                f"{self.lm.info.name} has no tokenizer: choose() takes a token id (0 to "
                f"{self.lm.info.vocab_size - 1}), not text {text!r}"
            )
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise ValueError(
                f"choose() takes a token id or the text of exactly one token; {text!r} is "
                f"{len(ids)} tokens {ids}: choose one of them by id"
            )
        return int(ids[0])

    def run(self, n: int | None = None) -> list[Step]:
        """Step n times, or until a stop (EOS, max_new_tokens, max positions); n=None runs to the stop."""
        if n is not None:
            check_int("n", n, 0)
        out = []
        while not self.done and (n is None or len(out) < n):
            out.append(self.step())
        return out

    def __iter__(self):
        while not self.done:
            yield self.step()

    def rewind(self, k: int = 1) -> None:
        """Drop the last k tokens: crop the cache (no recompute) and restore the generator state.

        The same seed then replays the same continuation. Rewinding every token returns to before
        prefill (the next step is a prefill again). distribution() is unavailable until the next step.
        """
        check_int("k", k, 0)
        with self._exclusive("rewind()", wait=True):
            self._rewind_unlocked(k)

    def _rewind_unlocked(self, k: int) -> None:
        n = len(self.trace.steps)
        if k > n:
            raise ValueError(f"cannot rewind {k} tokens: only {n} have been generated")
        if k == 0:
            return
        keep = n - k
        self._ids = self._ids[:, : self.prompt_len + keep]
        self._mask = None if self._mask is None else self._mask[:, : self.prompt_len + keep]
        if self._cache is not None:
            if keep == 0:
                self._cache = self._fresh_cache()  # before the prefill: the prefix copied again
            else:
                crop_cache(self._cache, self.prompt_len + keep - 1)
        self._gen.set_state(self._gen_states[keep])
        del self._gen_states[keep:]
        del self.trace.steps[keep:]
        self._finished = (
            [any(t in self._eos for t in row) for row in self.row_tokens]
            if self.stop_at_eos
            else [False] * self.batch_size
        )
        self.stop_reason = self.trace.stop_reason = None
        self._last = None

    def fork(self) -> Session:
        """An independent copy (cache, generator, trace) to explore another branch."""
        with self._exclusive("fork()", wait=True):
            return self._fork_unlocked()

    def _fork_unlocked(self) -> Session:
        other = copy.copy(self)
        other.sampling = dataclasses.replace(self.sampling)
        other._cache = copy_cache(self._cache)
        other._gen = torch.Generator(device="cpu")
        other._gen.set_state(self._gen.get_state())
        other._gen_states = list(self._gen_states)
        other._finished = list(self._finished)
        other._timer = Timer(self.device)
        other._busy = threading.Lock()
        other.trace = dataclasses.replace(
            self.trace,
            steps=[copy.copy(s) for s in self.trace.steps],
            settings=dict(self.trace.settings),
        )
        return other

    def set_sampling(self, sampling: Sampling) -> None:
        """Change the settings for the next steps; validates first (on error nothing changes).

        A different seed restarts the generator from that seed; steps taken with settings other than
        the Trace's own record theirs in `Step.sampling`.
        """
        _check_sampling(sampling)
        with self._exclusive("set_sampling()", wait=True):
            if sampling.seed is not None and sampling.seed != self.sampling.seed:
                self._gen = make_generator(sampling.seed)
            self.sampling = dataclasses.replace(sampling)
            now = sampling.to_dict()
            self._override = None if now == {k: self.trace.settings.get(k) for k in now} else now

    def distribution(self, row: int = 0) -> dict:
        """The full distribution of the latest step (the one that chose the last token).

        Returns {"step": index, "logits": raw logits [V], "raw": probs [V], "final": probs [V],
        "stages": [{"name", "probs"}]} as CPU float32 tensors (call .tolist() for plain lists). Raises before the first step and
        after rewind() until the next step.
        """
        if self._last is None:
            raise ValueError(
                "no distribution held: call step() first (rewind() drops the held one)"
            )
        index, raw, stages = self._last
        if not 0 <= row < raw.shape[0]:
            raise ValueError(f"row {row} is outside the batch of {raw.shape[0]}")
        probs = [{"name": name, "probs": x[row].softmax(-1).cpu()} for name, x in stages]
        return {
            "step": index,
            "logits": raw[row].to("cpu", copy=True),
            "raw": raw[row].softmax(-1).cpu(),
            "final": probs[-1]["probs"],
            "stages": probs,
        }

    @contextmanager
    def _exclusive(self, what: str, *, wait: bool = False):
        """This session's lock (SessionBusy unless `wait`: a mutation waits for the step that
        runs), then, for a forward pass, its model's: one forward at a time per model, whichever
        Session, replay or serving run asks (explorer.model.sharing)."""
        from explorer.model.sharing import model_lock

        if not self._busy.acquire(blocking=wait):
            raise SessionBusy(
                f"{what} cannot run while another step runs on this session; try again when it ends"
            )
        try:
            if wait:  # rewind, fork, set_sampling: this session's state only, no forward pass
                yield
            else:
                with model_lock(self.lm.model):
                    yield
        finally:
            self._busy.release()

    # --- one step, phase by phase ----------------------------------------------------------------

    def _step(self, forced: torch.Tensor | None) -> Step:
        with self._exclusive("step()"), torch.inference_mode():
            return self._step_unlocked(forced)

    def _step_unlocked(self, forced: torch.Tensor | None) -> Step:
        if self.done:
            raise SessionDone(
                f"the session has stopped ({self.stop_reason}); rewind() or fork() to go on"
            )
        index = len(self.trace.steps)
        feed, mask, past = self._inputs()
        state = self._gen.get_state()
        try:
            logits = self._timed_forward(feed, mask)  # [B, V] raw logits of the last position
            stages, tokens, ids, step = self._record_pass(
                index, feed.shape[1], past + feed.shape[1], logits, forced
            )
        except BaseException:
            if self._cache is not None:
                crop_cache(self._cache, past)  # leave the session as it was
            self._gen.set_state(state)
            raise
        self._gen_states.append(state)
        self._last = (index, logits, stages)
        self._append(tokens, ids)
        self.trace.steps.append(step)
        self._check_stop(step)
        return step

    def _inputs(self) -> tuple[torch.Tensor, torch.Tensor | None, int]:
        """What this forward feeds: the tokens not yet in the cache (all of them without a cache)."""
        past = cache_length(self._cache)
        return self._ids[:, past:], self._mask, past  # [B, T], [B, L]

    def _timed_forward(self, feed: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        fn = self._compiled_fn(feed, mask)
        if fn is not None:  # a fresh [B, 1] tensor: a slice of _ids changes stride each step
            feed = feed.clone(memory_format=torch.contiguous_format)  # a new stride: a recompile
        before = graphs_compiled() if fn is not None else None
        with capture(self.lm.model, enabled=fn is None) as routers, self._timer.region():
            logits, self._cache = forward(
                self.lm.model, feed, self._cache, mask, last_only=True, fn=fn
            )
        self._recompiles = None if fn is None else graphs_compiled() - before
        self._routing_now = None if routers is None else routers.record(choices=False)  # MoE
        return logits[:, -1]  # [B, V]

    def _compiled_fn(self, feed: torch.Tensor, mask: torch.Tensor | None):
        """The compiled forward for a decode pass, else None. The first call warms it up on this
        session's own cache (dynamo guards on the cache object), then crops the cache back."""
        c = self._compiled
        if c is None or self._cache is None or feed.shape[1] != 1 or not c.active:
            return None
        if c.compile_s is None:
            past, grown = cache_length(self._cache), [mask]
            feed = feed.clone(memory_format=torch.contiguous_format)  # strides (1, 1)

            def one_pass(fn):  # a decode pass; the cache grows by one position
                if self.cache_len is not None and cache_length(self._cache) >= self.cache_len:
                    return  # a full static cache: no room for another scratch pass
                forward(self.lm.model, feed, self._cache, grown[0], last_only=True, fn=fn)
                if grown[0] is not None:
                    grown[0] = torch.cat([grown[0], grown[0][:, -1:]], dim=1)

            try:
                c.warm_up(one_pass, self.device)
            finally:
                crop_cache(self._cache, past)
            self.trace.settings["compile"] = c.to_dict()
        return c.fn if c.active else None

    def _pick(
        self, final: torch.Tensor, forced: torch.Tensor | None
    ) -> tuple[torch.Tensor, Draw | None]:
        if forced is not None:
            return forced, None
        draw = choose_token(
            final, self.sampling.is_greedy, self._gen, greedy_cdf=False
        )  # _record fills it
        return draw.tokens, draw

    def _pad_finished(self, tokens: torch.Tensor) -> torch.Tensor:
        """Rows that already produced EOS get the pad token (as in generate())."""
        if not any(self._finished):
            return tokens
        done = torch.tensor(self._finished, device=tokens.device)
        return torch.where(done, torch.full_like(tokens, self._pad), tokens)

    def _append(self, tokens: torch.Tensor, ids: list[int]) -> None:
        """Add the chosen tokens [B] (ids: the same as a list) and grow the mask."""
        self._ids = torch.cat(
            [self._ids, tokens.view(-1, 1).to(self._ids.dtype)], dim=1
        )  # [B, L + 1]
        if self._mask is not None:
            self._mask = torch.cat([self._mask, self._mask.new_ones(self.batch_size, 1)], dim=1)
        if self.stop_at_eos and self._eos:
            for r, t in enumerate(ids):
                self._finished[r] = self._finished[r] or t in self._eos

    def _check_stop(self, step: Step) -> None:
        n = len(self.trace.steps)
        limit = self.lm.info.max_positions
        if all(self._finished) and self.stop_at_eos and self._eos:
            reason = "eos"
        elif self.max_new_tokens is not None and n >= self.max_new_tokens:
            reason = "max_new_tokens"
        elif limit and self._ids.shape[1] > limit:
            reason = "max_positions"
        elif self.cache_len is not None and self._ids.shape[1] > self.cache_len:
            reason = "cache_len"  # the static cache is full
        else:
            return
        step.stop = self.stop_reason = self.trace.stop_reason = reason


# --- helpers -------------------------------------------------------------------------------------


def _check_static_cache(lm, cache_len: int, rows: int) -> None:
    """A static cache is allocated whole: within the model's positions and the free memory."""
    from explorer.model.memory import check_fits

    lm.info.check_context(cache_len, f"a static cache of cache_len {cache_len:,}")
    check_fits(
        lm.info.kv_bytes_per_token * cache_len * rows,
        lm.device,
        f"a static cache of {cache_len:,} positions x {rows} row(s)",
        "give a smaller cache_len",
    )


def _check_sampling(sampling) -> None:
    if not isinstance(sampling, Sampling):
        raise ValueError(f"sampling must be an explorer.Sampling, got {type(sampling).__name__}")
    sampling.validate()  # fields may have been changed after construction


def _compile_mode(lm, options: SessionOptions, cache: str, compile, prefix_cache) -> str | None:
    """torch.compile's mode for this session (None: eager), after checking the cache options agree."""
    from explorer.engine.options import check_cache_type, compile_mode

    check_cache_type(cache)
    mode = compile_mode(compile, lm.device)
    if not options.use_cache and (cache == "static" or mode is not None):
        raise ValueError(
            "cache='static' and compile= need use_cache=True (they speed up cached decoding)"
        )
    if prefix_cache is not None and cache == "static":
        raise ValueError("prefix_cache works with cache='dynamic' only (it copies a DynamicCache)")
    return mode
