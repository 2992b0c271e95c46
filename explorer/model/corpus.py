"""The bundled models' text: how the corpus is cut into documents and which documents are held out.

scripts/train_bundled.py builds its corpus with these functions; the ladder sweep scores
perplexity on the held-out documents (ones the bundled models never trained on). Standard library
only: the text ships with every CPython (pydoc_data.topics, the reference-manual topics help()
shows).
"""

from __future__ import annotations

import hashlib
import re

VAL_FRACTION = (
    0.05  # the share of documents held out (assets/models/training.json: validation_split)
)


def clean_text(text: str) -> str:
    """Lightly normalise whitespace: tabs, trailing spaces, runs of blank lines."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").expandtabs(4)
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()


def split_paragraph_groups(text: str, max_chars: int = 2000) -> list[str]:
    """Split a long text at blank lines into pieces of at most ~max_chars."""
    pieces: list[str] = []
    current: list[str] = []
    size = 0
    for para in text.split("\n\n"):
        if current and size + len(para) > max_chars:
            pieces.append("\n\n".join(current))
            current, size = [], 0
        current.append(para)
        size += len(para) + 2
    if current:
        pieces.append("\n\n".join(current))
    return pieces


def pydoc_topic_documents() -> list[str]:
    """The reference-manual topics shipped in ``pydoc_data``, in sorted order."""
    from pydoc_data.topics import topics

    docs: list[str] = []
    for name in sorted(topics):
        docs.extend(split_paragraph_groups(clean_text(topics[name])))
    return docs


def is_validation_doc(doc: str, val_fraction: float = VAL_FRACTION) -> bool:
    """Deterministic, order-independent split: hash of the document's text."""
    digest = hashlib.sha256(doc.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < val_fraction


def heldout_documents(val_fraction: float = VAL_FRACTION) -> list[str]:
    """The pydoc topic documents the bundled models held out of training (same text, same hash
    split; the stdlib docstrings' held-out share is left out: it needs ~240 module imports)."""
    return [d for d in pydoc_topic_documents() if is_validation_doc(d, val_fraction)]
