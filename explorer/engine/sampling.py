"""The sampling chain as pure tensor functions, stage by stage, in transformers' order.

    logits [B, V] --repetition penalty--> --temperature--> --top-k--> --top-p--> --min-p--> sample / argmax

Each stage is a function from logits to logits (filtered tokens get -inf) and matches the
corresponding transformers LogitsProcessor exactly (tests/engine/test_sampling.py checks this).

Our defaults are explicit: Sampling() is plain sampling at temperature 1 with every filter off.
transformers' generate() silently uses top_k=50 when you pass do_sample=True without top_k (from
GenerationConfig's defaults), so Sampling(top_k=50) is what matches generate(do_sample=True).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import torch

from explorer.engine.settings import SEED_MAX, setting, validate

NEG_INF = float("-inf")


@dataclass
class Sampling:
    """Sampling settings. 0 / 1.0 values switch a filter off; temperature 0 or greedy=True means argmax.

    Each field is declared once (explorer.engine.settings.setting): its range, label and help are
    what the validation, the dashboard's controls and the CLI flags read.
    """

    temperature: float = setting(1.0, "temperature", "0 means greedy", low=0, step=0.1)
    top_k: int = setting(0, "top-k", "0 = off (generate() would silently use 50)", low=0)
    top_p: float = setting(1.0, "top-p", "1 = off", low=0, high=1, low_open=True, step=0.05)
    min_p: float = setting(0.0, "min-p", "0 = off", low=0, high=1, high_open=True, step=0.01)
    repetition_penalty: float = setting(
        1.0, "rep. penalty", "1 = off", low=0, low_open=True, step=0.05
    )
    seed: int | None = setting(
        None, "seed", "empty = a random seed", kind=int, low=0, high=SEED_MAX, optional=True
    )
    greedy: bool = setting(False, "greedy (argmax)", "argmax instead of sampling")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        validate(self)

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0

    def to_dict(self) -> dict:
        return asdict(self)


# --- the stages: logits [B, V] -> logits [B, V] -------------------------------------------------


def repetition_penalty(
    logits: torch.Tensor,
    context_ids: torch.Tensor,
    penalty: float,
    context_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Divide positive / multiply negative logits of every distinct token already in the context.

    context_ids [B, T] (prompt included); context_mask [B, T] marks real tokens (left padding is 0).
    """
    if penalty == 1.0:
        return logits
    ids = context_ids.to(logits.device)
    mark = (
        torch.ones_like(ids, dtype=torch.bool)
        if context_mask is None
        else context_mask.to(logits.device).bool()
    )
    counts = torch.zeros(logits.shape, dtype=torch.int32, device=logits.device)  # [B, V]
    seen = (
        counts.scatter_add_(1, ids, mark.to(torch.int32)) > 0
    )  # [B, V]: token occurs in the context
    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, penalised, logits)


def temperature(logits: torch.Tensor, t: float) -> torch.Tensor:
    return logits if t in (0, 1.0) else logits / t


def top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits; ties with the k-th survive (as in TopKLogitsWarper)."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # [B, 1]
    return logits.masked_fill(logits < kth, NEG_INF)


def top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches p (as in TopPLogitsWarper)."""
    if p >= 1.0:
        return logits
    sorted_logits, sorted_idx = torch.sort(logits, descending=False)  # ascending, as transformers
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cum <= (1 - p)
    remove_sorted[..., -1:] = False  # always keep the most likely token
    remove = remove_sorted.scatter(1, sorted_idx, remove_sorted)
    return logits.masked_fill(remove, NEG_INF)


def min_p(logits: torch.Tensor, m: float) -> torch.Tensor:
    """Drop tokens whose probability is below m x the top token's probability (as in MinPLogitsWarper)."""
    if m <= 0:
        return logits
    probs = logits.softmax(dim=-1)
    remove = probs < m * probs.amax(dim=-1, keepdim=True)
    remove.scatter_(1, probs.argmax(dim=-1, keepdim=True), False)
    return logits.masked_fill(remove, NEG_INF)


STAGE_NAMES = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p")


def process(
    logits: torch.Tensor,
    context_ids: torch.Tensor,
    s: Sampling,
    context_mask: torch.Tensor | None = None,
) -> list[tuple[str, torch.Tensor]]:
    """Run the chain; returns [(stage name, logits after it)] in order. The last entry is final.

    In greedy mode the temperature stage is skipped (0 would divide by zero); filters still run,
    so charts show what they would keep. They never change the argmax.
    """
    x = logits.float()  # [B, V]
    out = []
    x = repetition_penalty(x, context_ids, s.repetition_penalty, context_mask)
    out.append(("repetition_penalty", x))
    x = temperature(x, 1.0 if s.is_greedy else s.temperature)
    out.append(("temperature", x))
    x = top_k(x, s.top_k)
    out.append(("top_k", x))
    x = top_p(x, s.top_p)
    out.append(("top_p", x))
    x = min_p(x, s.min_p)
    out.append(("min_p", x))
    return out


def stage_summary(
    logits: torch.Tensor, stages: list[tuple[str, torch.Tensor]], row: int = 0
) -> list[dict]:
    """For each stage: tokens it kept and the probability mass they held *in the distribution entering it*."""
    summary = []
    prev = logits[row].float()
    for name, after in stages:
        kept = torch.isfinite(after[row])
        mass = prev.softmax(dim=-1)[kept].sum().item()
        summary.append({"name": name, "mass": mass, "kept": int(kept.sum().item())})
        prev = after[row]
    return summary


# --- choosing a token ----------------------------------------------------------------------------


@dataclass
class Draw:
    """The chosen token of every row, and where each row's uniform number fell in its sorted CDF."""

    tokens: torch.Tensor  # [B] long
    u: list[float | None]  # None in greedy mode
    cdf_lo: list[float]  # cumulative final probability of the tokens ranked above the chosen one
    cdf_hi: list[float]  # ... including the chosen one


def choose_token(
    final_logits: torch.Tensor,
    greedy: bool,
    generator: torch.Generator | None,
    greedy_cdf: bool = True,
) -> Draw:
    """argmax, or inverse-CDF sampling over tokens sorted by final probability (most likely first).

    greedy_cdf=False skips computing a greedy token's cdf_hi (its final probability; the caller
    has it already): cdf_hi is then an empty list.
    """
    if greedy:  # argmax, as generate() does (first index among ties); the CDF starts at 0
        tokens = final_logits.argmax(dim=-1)  # [B]
        b = final_logits.shape[0]
        if not greedy_cdf:
            return Draw(tokens=tokens, u=[None] * b, cdf_lo=[0.0] * b, cdf_hi=[])
        hi = final_logits.float().softmax(dim=-1).gather(1, tokens.unsqueeze(-1)).squeeze(-1)
        return Draw(tokens=tokens, u=[None] * b, cdf_lo=[0.0] * b, cdf_hi=hi.tolist())
    probs = final_logits.float().softmax(dim=-1)  # [B, V]
    sorted_p, order = torch.sort(probs, dim=-1, descending=True)
    cdf = sorted_p.cumsum(dim=-1)  # [B, V]
    uniforms = torch.rand(probs.shape[0], generator=generator, dtype=torch.float64).to(
        probs.device
    )  # [B]
    thresholds = uniforms.to(cdf.dtype).unsqueeze(-1) * cdf[:, -1:]
    pos = torch.searchsorted(cdf, thresholds, right=True).squeeze(-1)
    pos = torch.minimum(pos, (sorted_p > 0).sum(dim=-1) - 1)  # never land on a filtered token
    u = uniforms.tolist()
    tokens = order.gather(1, pos.unsqueeze(-1)).squeeze(-1)
    hi = cdf.gather(1, pos.unsqueeze(-1)).squeeze(-1)
    lo = hi - sorted_p.gather(1, pos.unsqueeze(-1)).squeeze(-1)
    return Draw(tokens=tokens, u=u, cdf_lo=lo.tolist(), cdf_hi=hi.tolist())


def step_statistics(
    logits: torch.Tensor,
    stages: list[tuple[str, torch.Tensor]],
    token: int,
    top_n: int,
    row: int = 0,
    cdf_lo: bool = True,
) -> dict:
    """Everything a recorded step needs about `token` in row `row`, in one pass and two copies to the host.

    Equal to stage_summary() and entropy() (tests check it), but each distinct stage tensor is
    handled once (a stage that is switched off returns its input unchanged) and the work is batched.
    Returns {"prob_raw", "prob_final", "rank_raw", "rank_final", "entropy_raw", "entropy_final",
    "cdf_lo_final" (final mass of the tokens ranked above it; None with cdf_lo=False), "stages",
    "top": [(id, raw, final)]}.
    Ranks count the tokens with a strictly larger logit (0 = most likely); top is by raw probability.
    """
    tensors = [logits] + [after for _, after in stages]
    uniq: list[torch.Tensor] = []
    where = [_index_by_identity(uniq, t) for t in tensors]  # position of each tensor in uniq
    x = (
        torch.stack([t[row].float() for t in uniq])
        if len(uniq) > 1
        else uniq[0][row : row + 1].float()
    )  # [U, V]
    u, n = x.shape[0], top_n
    numbers, counts = _stat_numbers(x, token, n, cdf_lo)
    negent, mass = numbers[:u], numbers[u : u + u * u]
    base = u + u * u
    prob, tops = numbers[base : base + u], numbers[base + u : base + u + u * n]
    lo = numbers[base + u + u * n :] if cdf_lo else None
    kept_n, rank, ids = counts[:u], counts[u : 2 * u], counts[2 * u :]
    f = where[-1]
    summary = [
        {"name": name, "mass": mass[where[i] * u + where[i + 1]], "kept": kept_n[where[i + 1]]}
        for i, (name, _) in enumerate(stages)
    ]
    return {
        "prob_raw": prob[0],
        "prob_final": prob[f],
        "rank_raw": rank[0],
        "rank_final": rank[f],
        "entropy_raw": -negent[0],
        "entropy_final": -negent[f],
        "cdf_lo_final": lo[f] if cdf_lo else None,
        "stages": summary,
        "top": [(i, tops[j], tops[f * n + j]) for j, i in enumerate(ids)],
    }


def _stat_numbers(x: torch.Tensor, token: int, n: int, cdf_lo: bool) -> tuple[list, list]:
    """step_statistics' device phase: every figure of the U distinct stages x [U, V], computed in
    one batch and copied to the host in two .tolist() calls, (floats, counts), in the order
    step_statistics unpacks.

    Few kernels, no [U, U, V] temporary: the masses of every distribution on every stage's kept
    tokens are one [U, V] @ [V, U] product. The floats and the integer counts go in two lists
    (one cat each: a cat of one dtype costs a fraction of a promoting one)."""
    u = x.shape[0]
    logp = x.log_softmax(dim=-1)  # [U, V]
    p = logp.exp()
    kept = x > _neg_inf(x.device)  # [U, V] tokens a stage kept (filtered tokens are -inf)
    above = x > x.narrow(1, token, 1)  # [U, V] tokens ranked above the token
    top_ids = torch.topk(x[0], n).indices  # [n]
    floats = [
        (p * logp).nansum(-1),  # [U] minus the entropy; 0 * -inf terms are dropped
        # [U*U] mass of distribution i on the tokens kept in j (i == j: all of it, p is 0 where x is -inf)
        (p @ kept.T.to(p.dtype)).flatten() if u > 1 else p.sum(-1),
        p.select(1, token),  # [U] probability of the token
        p.index_select(1, top_ids).flatten(),  # [U*n]
    ]
    if cdf_lo:
        floats.append((p * above).sum(-1))  # [U] mass ranked above it
    counts = torch.cat([kept.sum(-1), above.sum(-1), top_ids])  # [U] kept, [U] rank, [n] ids
    return torch.cat(floats).tolist(), counts.tolist()


_NEG_INF: dict[torch.device, torch.Tensor] = {}


def _neg_inf(device: torch.device) -> torch.Tensor:
    """-inf as a 0-dim tensor on `device` (a comparison with a tensor skips wrapping a number)."""
    t = _NEG_INF.get(device)
    if t is None:
        t = _NEG_INF[device] = torch.tensor(NEG_INF, device=device)
    return t


def _index_by_identity(uniq: list[torch.Tensor], t: torch.Tensor) -> int:
    for i, u in enumerate(uniq):
        if u is t:
            return i
    uniq.append(t)
    return len(uniq) - 1


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of softmax(logits) per row; -inf logits contribute 0. [B, V] -> [B]"""
    logp = logits.float().log_softmax(dim=-1)
    p = logp.exp()
    return -(torch.where(p > 0, p * logp, torch.zeros_like(p))).sum(dim=-1)


def make_generator(seed: int | None) -> torch.Generator:
    """A CPU generator for the uniform draws (so CPU and GPU runs draw the same numbers). Without
    a seed, one from the OS: torch.seed() would reseed torch's global generators (the caller's
    torch.manual_seed lost) and costs ~0.5 ms a Session (it seeds every CUDA device too)."""
    g = torch.Generator(device="cpu")
    g.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(8), "little") % 2**63)
    return g
