"""Speculative decoding, one round at a time, lossless (Leviathan et al. 2023; Chen et al. 2023).

One round (`SpeculativeSession.step()`):

    propose   the draft runs k forward passes (with its KV cache): x_i ~ q_i = q(. | ids, x_<i)
    verify    the target scores [last id, x_1..x_k] in ONE forward pass: p_1 .. p_{k+1}
    accept    x_i is kept with probability min(1, p_i(x_i) / q_i(x_i)), in order, up to the first rejection
    resample  at the first rejection n: y ~ normalise(max(0, p_n - q_n))          (the residual)
    bonus     if all k are kept: y ~ p_{k+1}                                       (one token for free)
    crop      both KV caches are cropped to the accepted prefix (never recomputed)

The emitted tokens x_1..x_n, y are distributed exactly as the target's own samples. p and q are the
*final* distributions after the same sampling chain (explorer.engine.sampling.process: repetition penalty,
temperature, top-k, top-p, min-p). Greedy mode keeps x_i while it equals the target's argmax and
then emits the target's argmax, so the output equals target-only greedy decoding token for token.

Cache invariant between rounds: the target cache holds every id but the last (len(ids) - 1
positions); the draft cache holds len(ids) - 1, or len(ids) - 2 after a fully accepted round
(x_k was proposed but never fed to the draft), so its next pass feeds 2 tokens.

Prompt-lookup decoding (Saxena 2023; transformers' prompt_lookup_num_tokens): the draft is no
model but `PromptLookup(ngram=3)`, which proposes the k ids that followed the most recent earlier
occurrence of the context's last n-gram (n = ngram down to min_ngram), or nothing when there is
none (the round is then a plain target step). Its q is one-hot at each proposed id, so acceptance is
min(1, p(x)) and the residual is p with x removed: the same lossless rule, with no draft pass at
all. Each Round's `lookup` says where the proposal came from ({"n", "from", "to"}: positions).

The acceptance rule (accept, resample, bonus) is its own room, explorer.engine.acceptance.

Statistics: per-token acceptance rate alpha and the accepted-length histogram (explorer.engine.rounds);
the expected speedup they predict is modelled in explorer.costs.speculation (Leviathan et al., eq. 1).
"""

from __future__ import annotations

import copy
import dataclasses
import time
import warnings
from dataclasses import asdict
from typing import Any

import torch
from transformers import DynamicCache

from explorer.engine.acceptance import (  # noqa: F401  (final_probs, RESIDUAL_EPS re-exported)
    RESIDUAL_EPS,
    AcceptanceRule,
    Proposal,
    Scored,
    draw_record,
    final_probs,
)
from explorer.engine.drafts import (
    PromptLookup,
    check_k,
    check_pair,
    vocab_size,
)
from explorer.engine.prompt import (  # the engine's prompt rules
    decode_ids,
    encode,
    eos_ids,
    token_text,
)
from explorer.engine.rounds import RandomDraws, Round, pass_record, round_stats, timed_forward
from explorer.engine.sampling import (
    Sampling,
    entropy,
    stage_summary,
)
from explorer.engine.session import SessionDone
from explorer.engine.settings import check_int
from explorer.engine.trace import Step, Trace
from explorer.model.loader import LoadedModel
from explorer.model.passes import copy_cache, crop_cache, kv_cache_bytes


def _checked_settings(
    k: int, k_max: int | None, sampling: Sampling | None, top_n: int, max_new_tokens: int | None
) -> tuple[int, Sampling]:
    """Validate a SpeculativeSession's settings (ValueError with one clear line); returns k_max
    (default 2k) and the sampling (default Sampling())."""
    check_k(k)
    k_max = check_k(2 * k if k_max is None else k_max, "k_max")
    if k_max < k:
        raise ValueError(f"k_max ({k_max}) must be >= k ({k})")
    sampling = Sampling() if sampling is None else sampling
    if not isinstance(sampling, Sampling):
        raise ValueError(f"sampling must be an explorer.Sampling, got {type(sampling).__name__}")
    sampling.validate()
    check_int("top_n", top_n, 1)
    if max_new_tokens is not None:
        check_int("max_new_tokens", max_new_tokens, 1)
    return k_max, sampling


# --- the session ---------------------------------------------------------------------------------


class SpeculativeSession(AcceptanceRule):
    """Speculative decoding step by step: each step() is one round (see the module docstring).

    SpeculativeSession(target, draft, prompt, sampling=Sampling(), *, k=4, top_n=20, max_new_tokens=None,
    adaptive=False, k_max=None, record_steps=True, stop_at_eos=True, peaks=None)

    draft: a LoadedModel that shares the target's tokenizer, or PromptLookup(ngram) (no model).

    prompt: a string (needs the target's tokenizer) or a list of token ids. With adaptive=True, k grows
    by 1 after a fully accepted round (up to k_max, default 2k) and shrinks by 1 after a rejection (down
    to 1); each Round records its k and k_next. record_steps=False skips the per-token Steps of the
    Trace (the Rounds are always kept), for benchmarks and enumerations. peaks: the machine's
    Peaks the pass records use (None: measured on the first pass).
    """

    def __init__(
        self,
        target: LoadedModel,
        draft: LoadedModel,
        prompt: str | list[int],
        sampling: Sampling | None = None,
        *,
        k: int = 4,
        top_n: int = 20,
        max_new_tokens: int | None = None,
        adaptive: bool = False,
        k_max: int | None = None,
        record_steps: bool = True,
        stop_at_eos: bool = True,
        peaks=None,
    ):
        self.lookup = draft if isinstance(draft, PromptLookup) else None
        if self.lookup is None:
            check_pair(target, draft)
        k_max, sampling = _checked_settings(k, k_max, sampling, top_n, max_new_tokens)
        self.target, self.draft = target, draft
        self.prompt_ids = encode(target, prompt)
        self.sampling, self.k, self.k_max, self.adaptive = sampling, k, k_max, bool(adaptive)
        self.top_n = min(top_n, vocab_size(target))
        self.max_new_tokens, self.record_steps = max_new_tokens, bool(record_steps)
        draft_positions = None if self.lookup else draft.info.max_positions
        self.max_positions = min(
            p for p in (target.info.max_positions, draft_positions, 1 << 62) if p
        )
        if len(self.prompt_ids) >= self.max_positions:
            raise ValueError(
                f"the prompt has {len(self.prompt_ids)} tokens; the models hold {self.max_positions}"
            )
        self.k_requested = k
        self.k = self._fit_k(k)
        self.k_max = max(self.k, min(self.k_max, self.max_positions - len(self.prompt_ids) - 1))
        self.draws = RandomDraws(sampling.seed)
        self.eos_ids = eos_ids(target) if stop_at_eos else set()
        self.rounds: list[Round] = []
        self.stop_reason: str | None = None
        self._ids = list(self.prompt_ids)
        self._tcache: DynamicCache | None = None  # created by the prefill of round 0
        self._dcache: DynamicCache | None = None
        self._peaks = peaks  # explorer.costs.hardware.Peaks (None: measured on the first pass)
        self._prefill_record: dict | None = None
        self._texts: dict[int, str] = {}
        dt = target.info.dtype
        self._trace = Trace(
            prompt=prompt
            if isinstance(prompt, str)
            else decode_ids(target.tokenizer, self.prompt_ids),
            settings=self._settings(),
            model=target.info.to_dict(),
            device=str(target.device),
            dtype=dt,
            prompt_ids=list(self.prompt_ids),
        )

    # --- public API ---

    @property
    def trace(self) -> Trace:
        """The run as a Trace: one Step per emitted id (phase "speculative"), and every Round in `rounds`."""
        t = self._trace
        del t.rounds[len(self.rounds) :]
        t.rounds.extend(r.to_dict() for r in self.rounds[len(t.rounds) :])
        return t

    @property
    def tokens(self) -> list[int]:
        """All emitted ids (prompt excluded)."""
        return self._ids[len(self.prompt_ids) :]

    @property
    def text(self) -> str:
        return decode_ids(self.target.tokenizer, self.tokens)

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    @property
    def lm(self) -> LoadedModel:
        return self.target

    def step(self) -> Round:
        """Run one round. On any error the session (ids, both caches, draws, records) is left unchanged."""
        return self._guarded()

    def run(self, n_tokens: int) -> list[Round]:
        """Run rounds until at least n_tokens more ids are emitted (a round may overshoot by up to k; the
        max_new_tokens limit is exact) or the session stops."""
        if not isinstance(n_tokens, int) or isinstance(n_tokens, bool) or n_tokens < 1:
            raise ValueError(f"n_tokens must be a whole number >= 1, got {n_tokens!r}")
        goal, out = len(self.tokens) + n_tokens, []
        while len(self.tokens) < goal and not self.done:
            out.append(self._guarded())
        return out

    def __iter__(self):
        while not self.done:
            yield self.step()

    def set_sampling(self, sampling: Sampling) -> None:
        """New settings for the next round (validated first; on error nothing changes). The seed is not reused."""
        if not isinstance(sampling, Sampling):
            raise ValueError(
                f"sampling must be an explorer.Sampling, got {type(sampling).__name__}"
            )
        sampling.validate()
        self.sampling = sampling
        self._trace.settings = self._settings()

    def _fit_k(self, k: int) -> int:
        """k, or the positions left after the prompt when k asks for more (with a warning that says so)."""
        room = max(1, self.max_positions - len(self.prompt_ids) - 1)
        if k > room:
            warnings.warn(
                f"k={k} draft tokens do not fit: the models hold {self.max_positions} positions and the "
                f"prompt takes {len(self.prompt_ids)}, so k={room} is used (see session.k and each "
                "round's k)",
                stacklevel=3,
            )
            return room
        return k

    def set_k(self, k: int) -> None:
        """Draft tokens per round from the next round on (k >= 1; raises k_max if needed)."""
        check_k(k)
        self.k_requested = k
        k = self._fit_k(k)
        self.k, self.k_max = k, max(self.k_max, k)
        self._trace.settings = self._settings()

    def stats(self) -> dict[str, Any]:
        """Acceptance statistics over the rounds so far (measured counts; see module docstring)."""
        return round_stats(self.rounds)

    # --- one round, phase by phase ---

    def _guarded(self) -> Round:
        if self.done:
            raise SessionDone(f"the session has stopped ({self.stop_reason}); start a new one")
        saved = self._save()
        try:
            return self._round()
        except BaseException:
            self._restore(saved)
            raise

    def _round(self) -> Round:
        t0 = time.perf_counter()
        self.prefill()
        prefill = self._prefill_record if not self.rounds else None
        k = self._round_k()
        prop = self._propose(k)
        k = len(prop.tokens)  # prompt lookup may find fewer than k (or none: a plain target step)
        scored, verify = self._verify(prop.tokens)
        drafts, n = self._accept(prop, scored)
        residual = bonus = None
        if n < k:
            new, residual = self._resample(scored[n], prop.q[n], n)
        else:
            new, bonus = self._bonus(scored[k])
        emitted, stop = self._apply_stops(prop.tokens[:n] + [new])
        rnd = Round(
            index=len(self.rounds),
            k=k,
            context_len=len(self._ids),
            tokens=emitted,
            texts=[self._text(t) for t in emitted],
            drafts=drafts,
            accepted=n,
            residual=residual,
            bonus=bonus,
            draft_passes=prop.passes,
            verify_pass=verify,
            greedy=self.sampling.is_greedy,
            prefill=prefill,
            stop=stop,
            lookup=prop.lookup,
        )
        self._commit(rnd, scored, prop)
        rnd.wall_s = time.perf_counter() - t0
        return rnd

    def prefill(self) -> dict:
        """Both models read prompt[:-1] into fresh caches (the last prompt id is fed by the first round).

        The first step() does this by itself; call it early to prefill once and fork() many times.
        Returns {"target": pass, "draft": pass} (None for a 1-token prompt); round 0 records it too.
        """
        if self._tcache is not None:
            return self._prefill_record
        tcache, dcache = DynamicCache(), DynamicCache()
        body, out = self._ids[:-1], {}
        models = [("target", self.target, tcache)]
        if self.lookup is None:
            models.append(("draft", self.draft, dcache))
        else:
            dcache, out["draft"] = None, None  # prompt lookup: no draft model, no draft cache
        for name, lm, cache in models:
            out[name] = None
            if body:
                _, sec = timed_forward(lm, body, cache, last_only=True)
                out[name] = pass_record(lm, len(body), len(body), sec, cache, self._get_peaks, 1)
        self._tcache, self._dcache, self._prefill_record = tcache, dcache, out
        return out

    def fork(self) -> SpeculativeSession:
        """An independent copy that shares the two models: caches cloned, records and draw state copied."""
        new = copy.copy(self)
        new._ids, new.rounds, new._texts = list(self._ids), list(self.rounds), dict(self._texts)
        new._tcache, new._dcache = copy_cache(self._tcache), copy_cache(self._dcache)
        new.draws = self.draws.copy() if hasattr(self.draws, "copy") else copy.deepcopy(self.draws)
        new._trace = dataclasses.replace(
            self._trace,
            steps=list(self._trace.steps),
            rounds=[],
            settings=dict(self._trace.settings),
        )
        return new

    def _round_k(self) -> int:
        """k for this round: no more drafts than positions left, nor than max_new_tokens still allows
        (less the residual/bonus token); 0 means a plain target step."""
        k = min(self.k, self.max_positions - len(self._ids))
        if self.max_new_tokens is not None:
            k = min(k, self.max_new_tokens - len(self.tokens) - 1)
        return max(k, 0)

    def _propose(self, k: int) -> Proposal:
        """k draft passes: each feeds the ids the draft cache lacks and draws x_i from q_i. Prompt
        lookup: up to k ids copied from the context, each with a one-hot q (no pass, no randomness)."""
        if self.lookup is not None:
            return self._propose_lookup(k)
        prop, ctx = Proposal(), list(self._ids)
        greedy = self.sampling.is_greedy
        for _ in range(k):
            have = self._dcache.get_seq_length()
            feed = ctx[have:]  # 1 id, or 2 after a fully accepted round
            logits, sec = timed_forward(self.draft, feed, self._dcache, last_only=True)  # [1, 1, V]
            q, stages = final_probs(logits[:, -1], ctx, self.sampling)
            draw = self._draw(stages[-1][1])
            x = int(draw.tokens[0])
            prop.passes.append(
                pass_record(self.draft, len(feed), len(ctx), sec, self._dcache, self._get_peaks, 1)
            )
            prop.tokens.append(x)
            prop.q.append(q)
            prop.draws.append(draw_record(draw, greedy, "q"))
            ctx.append(x)
        return prop

    def _propose_lookup(self, k: int) -> Proposal:
        tokens, where = self.lookup.propose(self._ids, k)
        vocab = vocab_size(self.target)
        prop = Proposal(lookup=where)
        for x in tokens:
            q = torch.zeros(vocab, device=self.target.device)
            q[x] = 1.0
            prop.tokens.append(x)
            prop.q.append(q)
            prop.draws.append(
                {"u": None, "cdf_lo": 0.0, "cdf_hi": 1.0, "greedy": self.sampling.is_greedy,
                 "of": "lookup"}
            )  # fmt: skip
        return prop

    def _verify(self, xs: list[int]) -> tuple[list[Scored], dict]:
        """One target pass over [last id, x_1..x_k]: the final distributions p_1 .. p_{k+1}."""
        feed = self._ids[-1:] + xs
        logits, sec = timed_forward(self.target, feed, self._tcache)  # [1, k+1, V]
        ctx_len = len(self._ids) + len(xs)
        record = pass_record(
            self.target, len(feed), ctx_len, sec, self._tcache, self._get_peaks, len(feed)
        )
        scored = []
        for i in range(len(feed)):
            p, stages = final_probs(logits[:, i], self._ids + xs[:i], self.sampling)
            scored.append(Scored(raw=logits[:, i], stages=stages, p=p))
        return scored, record

    def _apply_stops(self, emitted: list[int]) -> tuple[list[int], str | None]:
        """Cut the emitted ids at EOS, max_new_tokens or the position limit."""
        out = []
        for t in emitted:
            out.append(t)
            if t in self.eos_ids:
                return out, "eos"
            if (
                self.max_new_tokens is not None
                and len(self.tokens) + len(out) >= self.max_new_tokens
            ):
                return out, "max_new_tokens"
            if len(self._ids) + len(out) >= self.max_positions:
                return out, "max_positions"
        return out, None

    def _commit(self, rnd: Round, scored: list[Scored], prop: Proposal) -> None:
        """Append the ids, crop both caches to the accepted prefix, adapt k, record the round and its Steps."""
        base = len(self._ids)
        self._ids.extend(rnd.tokens)
        keep = len(self._ids) - 1
        crop_cache(self._tcache, min(keep, self._tcache.get_seq_length()))
        if self._dcache is not None:
            crop_cache(self._dcache, min(keep, self._dcache.get_seq_length()))
        if self.adaptive and rnd.k > 0:
            self.k = min(self.k + 1, self.k_max) if rnd.accepted == rnd.k else max(self.k - 1, 1)
        rnd.k_next = self.k
        rnd.verify_pass["kv_cache_bytes_after"] = kv_cache_bytes(self._tcache)
        self.rounds.append(rnd)
        share = (rnd.draft_s + rnd.verify_s) / len(rnd.tokens)
        for i, t in enumerate(rnd.tokens if self.record_steps else []):
            origin = (
                "draft"
                if i < rnd.accepted
                else ("residual" if rnd.residual is not None else "bonus")
            )
            draw = (
                rnd.drafts[i]["draw"] if origin == "draft" else (rnd.residual or rnd.bonus)["draw"]
            )
            self._trace.steps.append(
                self._token_step(base + i, t, scored[i], rnd, origin, draw, share)
            )
        if rnd.stop:
            self.stop_reason = self._trace.stop_reason = rnd.stop
            if self._trace.steps:
                self._trace.steps[-1].stop = rnd.stop

    def _token_step(
        self, pos: int, tok: int, at: Scored, rnd: Round, origin: str, draw: dict, share: float
    ) -> Step:
        """A Step for one emitted id, from the target's scoring of its position (probabilities are the target's;
        latency_s is the round's forward time shared evenly over the ids it emitted; cost fields stay None,
        the per-pass costs are in the Round)."""
        raw_p, fin = at.raw.softmax(dim=-1)[0], at.stages[-1][1]  # [V], [1, V]
        top = torch.topk(raw_p, self.top_n)
        ent = entropy(torch.cat([at.raw, fin]))  # [2]
        return Step(
            index=len(self._trace.steps),
            phase="speculative",
            tokens_fed=rnd.verify_pass["tokens_fed"],
            context_len=pos + 1,
            token_id=tok,
            token_text=self._text(tok),
            prob_raw=float(raw_p[tok]),
            prob_final=float(at.p[tok]),
            rank_raw=int((at.raw[0] > at.raw[0, tok]).sum()),
            rank_final=int((fin[0] > fin[0, tok]).sum()),
            entropy_raw=float(ent[0]),
            entropy_final=float(ent[1]),
            top=[
                {"id": i, "text": self._text(i), "raw": a, "final": float(at.p[i])}
                for a, i in zip(top.values.tolist(), top.indices.tolist())
            ],
            stages=stage_summary(at.raw, at.stages),
            draw=draw,
            latency_s=share,
            kv_cache_bytes=rnd.verify_pass["kv_cache_bytes_after"],
            device=str(self.target.device),
            dtype=self.target.info.dtype,
            round=rnd.index,
            origin=origin,
        )

    # --- state for rollback ---

    def _save(self) -> tuple:
        lens = tuple(
            None if c is None else c.get_seq_length() for c in (self._tcache, self._dcache)
        )
        return (
            len(self._ids),
            lens,
            self.draws.get_state() if hasattr(self.draws, "get_state") else None,
            self.k,
            len(self.rounds),
            len(self._trace.steps),
            self.stop_reason,
            self._prefill_record,
        )

    def _restore(self, saved: tuple) -> None:
        n_ids, (tlen, dlen), draws, k, n_rounds, n_steps, stop, self._prefill_record = saved
        del self._ids[n_ids:]
        self._tcache = None if tlen is None else crop_cache(self._tcache, tlen)
        self._dcache = None if dlen is None else crop_cache(self._dcache, dlen)
        if draws is not None:
            self.draws.set_state(draws)
        self.k, self.stop_reason = k, stop
        del self.rounds[n_rounds:], self._trace.steps[n_steps:]
        self._trace.stop_reason = stop

    def _text(self, token_id: int) -> str:
        """Text of one id (cached; target and draft share the tokenizer, check_pair made sure)."""
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = token_text(self.target.tokenizer, token_id)
        return text

    def _get_peaks(self):
        if self._peaks is None:
            from explorer.costs import hardware

            dtype = next(self.target.model.parameters()).dtype
            self._peaks = hardware.measure(self.target.device, dtype=dtype)
            self._trace.hardware = (
                self._peaks.to_dict() if hasattr(self._peaks, "to_dict") else None
            )
        return self._peaks

    def _settings(self) -> dict:
        return {
            **self.sampling.to_dict(),
            "k": self.k,
            "k_requested": self.k_requested,
            "adaptive": self.adaptive,
            "k_max": self.k_max,
            "top_n": self.top_n,
            "max_new_tokens": self.max_new_tokens,
            "use_cache": True,
            "batch_size": 1,
            "speculative": True,
            "draft_model": (
                {"name": self.lookup.name, "prompt_lookup": asdict(self.lookup)}
                if self.lookup is not None
                else self.draft.info.to_dict()
            ),
        }
