"""Prefix caching: the KV of a shared prompt prefix (a system prompt, a few-shot header) computed once
and copied into every Session that starts with it, so its prefill runs over the new tokens only.

    pc = explorer.PrefixCache(lm, system_prompt)              # one prefill of the prefix, timed
    s = explorer.Session(lm, system_prompt + question, prefix_cache=pc)
    s.step().tokens_fed                                        # the question's tokens, not the whole prompt

Matching is on token ids: the prompt's ids must begin with the prefix's ids (a text prefix that
ends mid-word may tokenize differently inside the prompt: the error says where they part). The
cache is copied, never shared or recomputed; a prefix from another model, dtype or device is
refused. This is what vLLM's automatic prefix caching and SGLang's RadixAttention do per KV block.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from explorer.costs.timing import alternate, time_call
from explorer.model.passes import copy_cache, crop_cache, forward, kv_cache_bytes


def _owner(lm) -> tuple:
    """What a prefix cache belongs to: model name, dtype, device, and that very model object."""
    return (lm.info.name, lm.info.dtype, str(lm.device), id(lm.model))


class PrefixCache:
    """The KV cache of `prefix` (text or token ids) on `lm`, built once (build_s: measured)."""

    def __init__(self, lm, prefix):
        from explorer.engine.prompt import encode

        ids = encode(lm, prefix)
        lm.info.check_context(len(ids) + 1, f"the prefix of {len(ids):,} tokens and one more")
        cache = DynamicCache()
        feed = torch.tensor([ids], device=lm.device)
        _, build_s = time_call(lambda: forward(lm.model, feed, cache, last_only=True), lm.device)
        self._hold(_owner(lm), ids, cache, build_s)  # build_s: the prefill later Sessions skip

    def _hold(self, owner: tuple, ids: list[int], cache: DynamicCache, build_s: float) -> None:
        self._owner = owner  # (model name, dtype, device, id of the model object)
        self.model_name, self.dtype, self.device = owner[:3]
        self.ids, self.cache, self.build_s = list(ids), cache, build_s
        self.bytes = kv_cache_bytes(cache)

    @classmethod
    def _of(cls, owner: tuple, ids: list[int], cache: DynamicCache) -> PrefixCache:
        out = cls.__new__(cls)
        out._hold(owner, ids, cache, 0.0)  # from KV already computed: nothing was prefilled
        return out

    @classmethod
    def from_session(cls, session, ids: list[int]) -> PrefixCache:
        """The prefix `ids` from a Session whose cache already holds their KV (row 0): copied and
        cropped, nothing recomputed (build_s = 0)."""
        return cls._of(_owner(session.lm), ids, session.cache_head(len(ids)))

    def head(self, n: int) -> PrefixCache:
        """The first n tokens of this prefix, as a prefix cache of their own (a copy)."""
        if not 1 <= n <= len(self.ids):
            raise ValueError(f"a head of 1..{len(self.ids)} tokens, got {n}")
        return PrefixCache._of(self._owner, self.ids[:n], crop_cache(copy_cache(self.cache), n))

    def shared_with(self, ids: list[int]) -> int:
        """How many leading tokens `ids` share with this prefix."""
        n = 0
        for a, b in zip(self.ids, ids):
            if a != b:
                break
            n += 1
        return n

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return (
            f"PrefixCache({self.model_name}, {len(self.ids)} tokens, {self.bytes / 1e6:.2f} MB of "
            f"KV, built in {self.build_s * 1e3:.1f} ms)"
        )

    def check_model(self, lm) -> None:
        """ValueError naming both when `lm` is not the model (and dtype, device) the prefix was built on."""
        mine, theirs = self._owner[:3], _owner(lm)[:3]
        if self._owner != _owner(lm):
            raise ValueError(
                f"this prefix cache was built on {self.model_name} ({self.dtype}, {self.device}); "
                f"the session runs {lm.info.name} ({lm.info.dtype}, {lm.device})"
                + (" - another loaded copy, whose weights may differ" if mine == theirs else "")
                + ": build a PrefixCache on the session's own model"
            )

    def start(self, lm, rows: list[list[int]]) -> DynamicCache:
        """A fresh copy of the prefix's cache for rows that all begin with the prefix (one per row);
        at least one prompt token is always left to feed, so the first step still gives logits."""
        self.check_model(lm)
        n = len(self.ids)
        for r, row in enumerate(rows):
            if row[:n] != self.ids:
                at = next(
                    (i for i, (a, b) in enumerate(zip(row, self.ids)) if a != b), min(len(row), n)
                )
                who = f"row {r} of the prompt" if len(rows) > 1 else "the prompt"
                raise ValueError(
                    f"{who} does not begin with the cached prefix: its {len(row)} tokens part from the "
                    f"prefix's {n} at token {at} (a text prefix that ends mid-word can tokenize "
                    "differently inside the prompt; end it at a space or newline, or pass token ids)"
                )
        keep = min(n, min(len(row) for row in rows) - 1)
        cache = copy_cache(self.cache)
        if keep < n:
            crop_cache(cache, keep)
        if len(rows) > 1:
            with torch.inference_mode():
                cache.batch_repeat_interleave(len(rows))
        return cache


DEFAULT_PREFIX = (
    "You are a careful assistant for Python programmers. Answer in plain words, show short code, "
    "name the module and the function you use, and say what can go wrong.\n"
)


def prefix_benchmark(
    lm, *, prefix=None, question=None, prefix_tokens: int = 256, repeats: int = 7
) -> dict:
    """TTFT (the first step: Session creation, the prefix copy and the prefill, wall clock after a
    device sync) with and without a PrefixCache, alternately (ABBA) after one warm-up of each, and
    the largest difference between their next-token logits. The prefix is DEFAULT_PREFIX repeated
    to about prefix_tokens tokens (random ids for a model without a tokenizer)."""
    from explorer.engine.prompt import encode
    from explorer.engine.sampling import Sampling
    from explorer.engine.session import Session
    from explorer.engine.settings import check_int

    check_int("prefix_tokens", prefix_tokens, 1)
    check_int("repeats", repeats, 1)
    if prefix is None:
        if lm.tokenizer is not None:
            one = lm.tokenizer(DEFAULT_PREFIX)["input_ids"]
            prefix = (one * (prefix_tokens // len(one) + 1))[:prefix_tokens]
        else:
            prefix = [(7 * i) % lm.info.vocab_size for i in range(1, prefix_tokens + 1)]
    pc = PrefixCache(lm, prefix)
    if question is None:
        question = (
            "Question: how do I read a file line by line?\nAnswer:"
            if lm.tokenizer is not None
            else list(range(3, 19))
        )
    ids = pc.ids + encode(lm, question)

    def first(cached: bool):
        s = Session(lm, ids, Sampling(greedy=True), prefix_cache=pc if cached else None)
        s.step()
        return s

    a, b = first(True), first(False)  # warm-up, and the logits compared
    diff = float((a.last_logits - b.last_logits).abs().max())
    times = alternate(
        {"plain": lambda: first(False), "cached": lambda: first(True)}, repeats, lm.device
    )
    cached, plain = times["cached"], times["plain"]
    cached.warmup = plain.warmup = 1  # the first() calls above
    return {
        "model": lm.info.name,
        "device": str(lm.device),
        "dtype": lm.info.dtype,
        "prefix_tokens": len(pc),
        "prompt_tokens": len(ids),
        "build_s": pc.build_s,
        "prefix_kv_bytes": pc.bytes,
        "ttft_plain": plain.to_dict(),
        "ttft_cached": cached.to_dict(),
        "speedup": plain.estimate / cached.estimate,
        "max_abs_logit_diff": diff,
        "repeats": repeats,
    }
