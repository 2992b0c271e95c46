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

import time

import torch
from transformers import DynamicCache

from explorer.costs.timing import synchronize
from explorer.engine.passes import copy_cache, crop_cache, forward, kv_cache_bytes


class PrefixCache:
    """The KV cache of `prefix` (text or token ids) on `lm`, built once (build_s: measured)."""

    def __init__(self, lm, prefix, *, _cache: DynamicCache | None = None):
        from explorer.engine.session import _encode

        ids = _encode(lm, prefix)
        if not ids:
            raise ValueError("the prefix is empty: nothing to cache")
        limit = lm.info.max_positions
        if limit and len(ids) >= limit:
            raise ValueError(
                f"the prefix has {len(ids)} tokens; {lm.info.name} holds {limit} positions"
            )
        self.ids = list(ids)
        self.model_name, self.dtype, self.device = lm.info.name, lm.info.dtype, str(lm.device)
        self._model_id = id(lm.model)
        if _cache is not None:  # from_cache(): KV some earlier pass already computed
            cache, self.build_s = _cache, 0.0
        else:
            cache = DynamicCache()
            synchronize(lm.device)
            t0 = time.perf_counter()
            forward(lm.model, torch.tensor([self.ids], device=lm.device), cache, last_only=True)
            synchronize(lm.device)
            self.build_s = time.perf_counter() - t0  # the prefill every later Session skips
        self.cache = cache
        self.bytes = kv_cache_bytes(cache)

    @classmethod
    def from_cache(cls, lm, ids: list[int], cache: DynamicCache) -> PrefixCache:
        """The prefix `ids` from a cache that already holds at least their KV (row 0, e.g. a finished
        Session's): copied and cropped, nothing recomputed (build_s = 0)."""
        held = cache.get_seq_length()
        if held < len(ids):
            raise ValueError(f"the cache holds {held} positions, fewer than the {len(ids)} ids")
        copy = crop_cache(copy_cache(cache), len(ids))
        if copy.layers and copy.layers[0].keys.shape[0] > 1:
            with torch.inference_mode():
                for layer in copy.layers:
                    layer.keys, layer.values = layer.keys[:1], layer.values[:1]
        return cls(lm, list(ids), _cache=copy)

    def head(self, n: int) -> PrefixCache:
        """The first n tokens of this prefix, as a prefix cache of their own (a copy)."""
        if not 1 <= n <= len(self.ids):
            raise ValueError(f"a head of 1..{len(self.ids)} tokens, got {n}")
        out = PrefixCache.__new__(PrefixCache)
        out.__dict__.update(self.__dict__)
        out.ids, out.cache = self.ids[:n], crop_cache(copy_cache(self.cache), n)
        out.bytes = kv_cache_bytes(out.cache)
        return out

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
        mine = (self.model_name, self.dtype, self.device)
        theirs = (lm.info.name, lm.info.dtype, str(lm.device))
        if mine != theirs or id(lm.model) != self._model_id:
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
    from explorer.costs.timing import Measurement, Timer, time_call
    from explorer.engine.sampling import Sampling
    from explorer.engine.session import Session, _check_int

    _check_int("prefix_tokens", prefix_tokens, 1)
    _check_int("repeats", repeats, 1)
    if prefix is None:
        if lm.tokenizer is not None:
            one = lm.tokenizer(DEFAULT_PREFIX)["input_ids"]
            prefix = (one * (prefix_tokens // len(one) + 1))[:prefix_tokens]
        else:
            prefix = [(7 * i) % lm.info.vocab_size for i in range(1, prefix_tokens + 1)]
    pc = PrefixCache(lm, prefix)
    if question is None:
        question = (
            lm.tokenizer("Question: how do I read a file line by line?\nAnswer:")["input_ids"]
            if lm.tokenizer is not None
            else list(range(3, 19))
        )
    ids = pc.ids + list(
        question if isinstance(question, list) else lm.tokenizer(question)["input_ids"]
    )

    def first(cached: bool):
        s = Session(lm, ids, Sampling(greedy=True), prefix_cache=pc if cached else None)
        s.step()
        return s

    a, b = first(True), first(False)  # warm-up, and the logits compared
    diff = float((a._last[1] - b._last[1]).abs().max())
    times = {"cached": [], "plain": []}
    for r in range(repeats):
        order = (("plain", False), ("cached", True))
        for name, flag in order if r % 2 == 0 else order[::-1]:
            times[name].append(time_call(lambda flag=flag: first(flag), lm.device)[1])
    method = Timer(lm.device).method
    cached = Measurement(times["cached"], warmup=1, method=method)
    plain = Measurement(times["plain"], warmup=1, method=method)
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
        "speedup": plain.median / cached.median,
        "max_abs_logit_diff": diff,
        "repeats": repeats,
    }
