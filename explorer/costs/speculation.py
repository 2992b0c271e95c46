"""The expected speedup of speculative decoding (Leviathan et al. 2023, eq. 1): modelled, not measured.

With a per-token acceptance rate alpha (i.i.d.), k draft tokens per round, c = draft pass time /
target decode pass time and v = verify pass time / target decode pass time:

    E[tokens per round] = (1 - alpha^(k+1)) / (1 - alpha)
    speedup             = E[tokens per round] / (k c + v)

v = 1 is the paper's formula (scoring k+1 tokens costs what one decode pass does). The inputs alpha,
c and v are measured by explorer.engine.speculative (alpha) and explorer.bench.speculative (c, v).
"""

from __future__ import annotations


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """E[tokens emitted per round] = (1 - alpha^(k+1)) / (1 - alpha), for i.i.d. acceptance with rate alpha."""
    return float(k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def expected_speedup(alpha: float, k: int, c: float, v: float = 1.0) -> float:
    """(1 - alpha^(k+1)) / ((1 - alpha)(k c + v)): c = draft pass / target pass time, v = verify / target pass
    (v = 1 is the paper's formula, which assumes scoring k+1 tokens costs one decode pass)."""
    return expected_tokens_per_round(alpha, k) / (k * c + v)


def breakeven_alpha(k: int, c: float, v: float = 1.0) -> float | None:
    """Smallest alpha at which expected_speedup(alpha, k, c, v) reaches 1 (None if even alpha=1 does not)."""
    need = k * c + v  # tokens per round needed to break even
    if need <= 1:
        return 0.0
    if k + 1 <= need:
        return None
    lo, hi = 0.0, 1.0  # expected_tokens_per_round rises from 1 to k+1 on [0, 1]
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens_per_round(mid, k) < need else (lo, mid)
    return hi
