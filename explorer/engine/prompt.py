"""Prompt preparation: text or token ids in, validated rows of ids out (EOS, pad, left padding).

The Session, the speculative session, the prefix cache and the benchmarks read a prompt through
these rules, so a prompt means the same thing everywhere.
"""

from __future__ import annotations

import torch


def _is_str_list(x) -> bool:
    return isinstance(x, (list, tuple)) and len(x) > 0 and all(isinstance(p, str) for p in x)


def eos_ids(lm) -> set[int]:
    cfg = getattr(lm.model, "generation_config", None)
    eos = getattr(cfg, "eos_token_id", None)
    if eos is None and lm.tokenizer is not None:
        eos = lm.tokenizer.eos_token_id
    if eos is None:
        return set()
    return {int(e) for e in eos} if isinstance(eos, (list, tuple)) else {int(eos)}


def pad_id(lm, eos: set[int]) -> int:
    for pad in (
        getattr(lm.tokenizer, "pad_token_id", None),
        getattr(getattr(lm.model, "generation_config", None), "pad_token_id", None),
    ):
        if pad is not None:
            return int(pad)
    return min(eos) if eos else 0


def prompt_rows(lm, prompt, batch_size: int) -> list[list[int]]:
    """Token ids of every row; validates lengths and ids. A single prompt is repeated batch_size times."""
    if _is_single(prompt):
        rows = [encode(lm, prompt)] * batch_size
    elif isinstance(prompt, (list, tuple)) and prompt and all(_is_single(p) for p in prompt):
        if batch_size not in (1, len(prompt)):
            raise ValueError(f"batch_size={batch_size} but {len(prompt)} prompts were given")
        rows = [encode(lm, p) for p in prompt]
    else:
        raise ValueError(
            "prompt must be a string, a list of strings, a list of token ids or a list of id lists; "
            f"got {prompt!r}"
        )
    for r in rows:
        lm.info.check_context(len(r), f"the prompt of {len(r):,} tokens")
    return rows


def _is_single(prompt) -> bool:
    """One prompt: a string or a (possibly empty) list of token ids."""
    return isinstance(prompt, str) or (
        isinstance(prompt, (list, tuple))
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    )


def trace_prompt(lm, prompt, rows: list[list[int]]):
    """What the Trace records as the prompt: the text(s) given, or the decoded ids."""
    if isinstance(prompt, str) or _is_str_list(prompt):
        return prompt if isinstance(prompt, str) else list(prompt)
    texts = [decode_ids(lm.tokenizer, r) for r in rows]
    return texts[0] if _is_single(prompt) else texts


def decode_ids(tok, ids: list[int]) -> str:
    if tok is None:
        return "".join(f"<{i}>" for i in ids)
    return tok.decode(ids, clean_up_tokenization_spaces=False)


def encode(lm, prompt) -> list[int]:
    tok = lm.tokenizer
    vocab = lm.info.vocab_size
    if isinstance(prompt, str):
        if tok is None:
            raise ValueError(
                f"{lm.info.name} has no tokenizer: pass the prompt as a list of token ids"
            )
        ids = list(tok(prompt, verbose=False)["input_ids"])  # our own error below names the lengths
    else:
        ids = list(prompt)
        bad = [
            t for t in ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab
        ]
        if bad:
            raise ValueError(
                f"prompt token ids {bad[:5]} are outside the vocabulary (0 to {vocab - 1})"
            )
    if not ids:
        bos = getattr(tok, "bos_token_id", None) if tok is not None else None
        if bos is None:
            raise ValueError(
                "the prompt is empty and the tokenizer has no BOS token to start from; "
                "give at least one token"
            )
        ids = [int(bos)]
    return ids


def left_pad(rows: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Left-pad rows to one length: ids [B, P] and a mask [B, P] (None when no row needs padding)."""
    width = max(len(r) for r in rows)
    ids = torch.tensor(
        [[pad] * (width - len(r)) + list(r) for r in rows], dtype=torch.long, device=device
    )
    if all(len(r) == width for r in rows):
        return ids, None
    mask = torch.tensor(
        [[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long, device=device
    )
    return ids, mask


def prompt_input(lm, text: str):
    """A typed prompt as the Session takes it: text, or token ids for a model without a tokenizer.

    Without a tokenizer, text of whole numbers ("1 2 3") is read as token ids; other text is fed
    as its UTF-8 bytes (ids 0-255), so architecture-only shapes still run.
    """
    if lm.tokenizer is not None:
        return text
    parts = text.replace(",", " ").split()
    if parts and all(p.isdigit() for p in parts):
        return [int(p) for p in parts]
    ids = list(text.encode("utf-8"))
    if not ids:
        raise ValueError(
            f"{lm.info.name} has no tokenizer: type a prompt (fed as bytes) or token ids such as 1 2 3"
        )
    return ids


def token_text(tokenizer, token_id: int) -> str:
    """One token's text as the tokenizer writes it (<id> without a tokenizer)."""
    if tokenizer is None:
        return f"<{token_id}>"
    return tokenizer.decode([token_id], clean_up_tokenization_spaces=False)
