"""Recording: one forward pass's logits, sampling stages and timing turned into a plain-data Step.

StepRecorder is the Session's recording half: row 0's probabilities, ranks, top-n and draw, the
token texts, and the modelled costs of the pass against the measured peaks and overhead floor.
It reads the Session's fields (lm, sampling, top_n, batch_size, trace, the cache and the timer).
"""

from __future__ import annotations

import dataclasses
import weakref

import torch

from explorer.costs.calibrate import active as active_calibration
from explorer.costs.split import step_roofline
from explorer.engine.options import cache_kv_dtype
from explorer.engine.prompt import decode_ids, token_text
from explorer.engine.sampling import Draw, process, step_statistics
from explorer.engine.trace import Step
from explorer.model.passes import kv_cache_bytes


class StepRecorder:
    """What a Session does after each forward pass: record it as a Step (see explorer.engine.session)."""

    # --- recording -------------------------------------------------------------------------------

    def _record_pass(self, index: int, fed: int, context: int, logits: torch.Tensor, forced):
        """Everything a step does after its forward pass: the sampling chain on the last
        position's logits [B, V], the token picked (or forced), the Step recorded. Returns
        (stages, tokens [B], ids, step); explorer.bench.overhead times this part on its own."""
        stages = process(logits, self._ids, self.sampling, self._mask)
        tokens, draw = self._pick(stages[-1][1], forced)  # [B]
        tokens = self._pad_finished(tokens)
        ids = tokens.tolist()
        step = self._record(index, fed, context, logits, stages, ids, draw, forced is not None)
        return stages, tokens, ids, step

    def _record(
        self,
        index: int,
        fed: int,
        context: int,
        raw: torch.Tensor,
        stages,
        tokens: list[int],
        draw: Draw | None,
        forced: bool,
    ) -> Step:
        """Row 0's Step: the token's probabilities and ranks, top_n, stages, the draw, costs."""
        st = step_statistics(raw, stages, tokens[0], self.top_n, cdf_lo=draw is None)
        texts = self._text_cache  # a lookup per top-n token, decoded once per tokenizer
        top = [
            {"id": i, "text": texts[i] if i in texts else self._text(i), "raw": a, "final": b}
            for i, a, b in st["top"]
        ]
        draw_d = self._draw_record(draw, st)
        step = Step(
            index=index,
            phase="prefill" if index == 0 else "decode",
            tokens_fed=fed,
            context_len=context,
            token_id=tokens[0],
            token_text=self._text(tokens[0]),
            forced=forced,
            prob_raw=st["prob_raw"],
            prob_final=st["prob_final"],
            rank_raw=st["rank_raw"],
            rank_final=st["rank_final"],
            entropy_raw=st["entropy_raw"],
            entropy_final=st["entropy_final"],
            top=top,
            stages=st["stages"],
            draw=draw_d,
            latency_s=self._timer.seconds,
            cpu_share=self._timer.cpu_share,
            kv_cache_bytes=kv_cache_bytes(self._cache),
            device=self._device_name,
            dtype=self.lm.info.dtype,
            batch_size=self.batch_size,
            row_tokens=list(tokens) if self.batch_size > 1 else None,
            sampling=self._override,
            cache_type=self.cache_type,
            compiled=None if self._compiled is None else self._recompiles is not None,
            weights=self.lm.info.weights,
            recompiles=self._recompiles,
            routing=getattr(self, "_routing_now", None),
        )
        self._fill_costs(step)
        return step

    def _draw_record(self, draw: Draw | None, st: dict) -> dict:
        """The draw as plain data: the number drawn and the token's span of the final CDF."""
        if draw is not None:
            hi = draw.cdf_hi[0] if draw.cdf_hi else st["prob_final"]  # greedy: argmax's prob
            return {
                "u": draw.u[0],
                "cdf_lo": draw.cdf_lo[0],
                "cdf_hi": hi,
                "greedy": self.sampling.is_greedy,
            }
        lo = st["cdf_lo_final"]  # forced: no number drawn; where the token sits in the final CDF
        return {"u": None, "cdf_lo": lo, "cdf_hi": lo + st["prob_final"], "greedy": False,
                "forced": True}  # fmt: skip

    def _fill_costs(self, step: Step) -> None:
        """Modelled FLOPs and bytes of this forward (explorer.costs), against measured peaks."""
        costs = step_roofline(
            self.lm.info,
            batch=self.batch_size,
            tokens_fed=step.tokens_fed,
            context_len=step.context_len,
            use_cache=self.use_cache,
            latency_s=step.latency_s,
            peaks=self._peaks(),
            logits_positions=1,
            floor_s=self._overhead_floor(),
            experts_touched=None if step.routing is None else step.routing["experts_touched"],
            kv_dtype=cache_kv_dtype(self.cache_type),
        )
        for key, value in costs.items():
            setattr(step, key, value)
        if self.trace.calibration is None:  # the calibration in use, saved with the trace
            cal = active_calibration(self.lm.info.name, self._device_name, self.lm.info.dtype)
            self.trace.calibration = cal.to_dict() if cal is not None else None

    def _peaks(self):
        """Measured peaks of this device and dtype (once per process, lazily); None with roofline=False."""
        if not self.roofline:
            return None
        if self._peaks_cache is None:
            from explorer.costs import hardware

            self._peaks_cache = hardware.measure(self.device, dtype=self.lm.model.dtype)
        if self.trace.hardware is None:
            self.trace.hardware = _plain(self._peaks_cache)
        return self._peaks_cache

    def _overhead_floor(self) -> float | None:
        """Measured overhead floor of this model (explorer.costs.overhead; once per model, lazily)."""
        if not self.roofline:
            return None
        if self.trace.overhead_floor is None:
            from explorer.costs.overhead import overhead_floor

            self.trace.overhead_floor = overhead_floor(self.lm.model)
        return self.trace.overhead_floor["floor_s"]

    # --- token text ------------------------------------------------------------------------------

    def _text(self, token_id: int) -> str:
        text = self._text_cache.get(token_id)
        if text is None:
            text = self._text_cache[token_id] = token_text(self.lm.tokenizer, token_id)
        return text

    def _token_texts(self) -> dict[int, str]:
        """The texts of this tokenizer's tokens decoded so far, shared by every Session on it (a
        token's text never changes): a new Session does not decode its top-n tokens again."""
        tok = self.lm.tokenizer
        if tok is None:
            return {}
        try:
            return _TOKEN_TEXTS.setdefault(tok, {})
        except TypeError:  # a tokenizer that takes no weak reference: this Session's own
            return {}

    def _decode(self, ids: list[int]) -> str:
        return decode_ids(self.lm.tokenizer, ids)


_TOKEN_TEXTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> {id: text}


def _plain(obj):
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    return obj.to_dict() if hasattr(obj, "to_dict") else dict(vars(obj))
