"""Drafts for speculative decoding: a model that shares the target's tokenizer, or prompt lookup.

A draft model pairs with a target when the target can score the draft's token ids unchanged
(check_pair). PromptLookup needs no model: it copies the continuation of the context's last n-gram
(Saxena 2023; transformers' prompt_lookup_num_tokens). k is the number of tokens a draft proposes
per round (check_k, parse_ks for the CLI's --k).
"""

from __future__ import annotations

from dataclasses import dataclass

from explorer.model.loader import LoadedModel


@dataclass(frozen=True)
class PromptLookup:
    """A draft without a model: propose the continuation of the last n-gram's most recent earlier
    occurrence in the context (prompt + emitted ids). ngram: the longest n-gram tried first;
    min_ngram: the shortest one still trusted."""

    ngram: int = 3
    min_ngram: int = 1

    def __post_init__(self):
        for name in ("ngram", "min_ngram"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"PromptLookup {name} must be a whole number >= 1, got {v!r}")
        if self.min_ngram > self.ngram:
            raise ValueError(
                f"PromptLookup min_ngram ({self.min_ngram}) must be <= ngram ({self.ngram})"
            )

    @property
    def name(self) -> str:
        return f"prompt-lookup(ngram={self.ngram}, min_ngram={self.min_ngram})"

    def propose(self, ids: list[int], k: int) -> tuple[list[int], dict | None]:
        """(up to k ids, {"n", "from", "to"}) where ids[from:to] is the copied span; ([], None) when
        no n-gram of the context's tail occurs earlier."""
        if k < 1:
            return [], None
        for n in range(min(self.ngram, len(ids) - 1), self.min_ngram - 1, -1):
            tail = ids[-n:]
            for start in range(len(ids) - n - 1, -1, -1):  # most recent earlier occurrence first
                if ids[start : start + n] == tail:
                    span = ids[start + n : start + n + k]
                    if span:
                        return span, {"n": n, "from": start + n, "to": start + n + len(span)}
        return [], None


def check_pair(target: LoadedModel, draft: LoadedModel) -> None:
    """Raise ValueError saying why two models cannot pair: the target must score the draft's ids as they are."""
    tv, dv = vocab_size(target), vocab_size(draft)
    why = None
    if tv != dv:
        why = f"their vocabularies differ in size (target {tv:,} logits, draft {dv:,})"
    elif (target.tokenizer is None) != (draft.tokenizer is None):
        has = "target" if target.tokenizer is not None else "draft"
        why = f"only the {has} has a tokenizer, so nothing shows that their token ids mean the same text"
    elif (
        target.tokenizer is not None and target.tokenizer.get_vocab() != draft.tokenizer.get_vocab()
    ):
        diff = len(
            set(target.tokenizer.get_vocab().items()) ^ set(draft.tokenizer.get_vocab().items())
        )
        why = f"their tokenizers map tokens to ids differently ({diff:,} (token, id) pairs differ)"
    if why:
        raise ValueError(
            f"cannot pair target {target.info.name!r} with draft {draft.info.name!r}: {why}; "
            "speculative decoding feeds the draft's token ids to the target unchanged, so both "
            "need the same tokenizer and vocabulary"
        )
    if target.device != draft.device:
        raise ValueError(
            f"target is on {target.device} but draft is on {draft.device}; load both on one device"
        )


def vocab_size(lm: LoadedModel) -> int:
    out = lm.model.get_output_embeddings() if hasattr(lm.model, "get_output_embeddings") else None
    return int(out.weight.shape[0]) if out is not None else int(lm.info.vocab_size)


def check_k(k, name: str = "k") -> int:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(
            f"{name} must be a whole number >= 1 (draft tokens proposed per round), got {k!r}"
        )
    return k


def parse_ks(text: str) -> list[int]:
    """'1..8' -> [1..8]; '1,2,4' -> [1, 2, 4]; '3' -> [3]."""
    try:
        if ".." in text:
            lo, hi = (int(x) for x in text.split("..", 1))
            ks = list(range(lo, hi + 1))
        else:
            ks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(
            f"--k takes a number, a list like 1,2,4 or a range like 1..8, got {text!r}"
        ) from None
    if not ks:
        raise ValueError(f"--k {text!r} names no k")
    return [check_k(k) for k in ks]
