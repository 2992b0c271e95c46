"""The acceptance rule of speculative decoding, lossless (Leviathan et al. 2023; Chen et al. 2023):
keep x_i with probability min(1, p_i(x_i) / q_i(x_i)) in order, at the first rejection draw from the
residual normalise(max(0, p - q)), after k acceptances draw a bonus token from p_{k+1}; greedy mode
compares with the target's argmax instead.

One idea: turning the target's scores and the draft's proposal into emitted tokens.
explorer.engine.speculative.SpeculativeSession (the rounds, the caches, the trace) mixes the rule in;
it reads the session's sampling, random draws, top_n and token texts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from explorer.engine.sampling import Draw, Sampling, choose_token, process

RESIDUAL_EPS = 1e-12  # residual mass below this counts as empty (p == q): fall back to p


# --- small helpers -------------------------------------------------------------------------------


def final_probs(logits: torch.Tensor, context: list[int], s: Sampling) -> tuple[torch.Tensor, list]:
    """The sampling chain on one position: logits [1, V] -> (final probs [V], stages)."""
    ctx = torch.tensor([context], dtype=torch.long, device=logits.device)  # [1, T]
    stages = process(logits, ctx, s)
    return stages[-1][1].softmax(dim=-1)[0], stages


def draw_record(d: Draw, greedy: bool, of: str) -> dict:
    return {"u": d.u[0], "cdf_lo": d.cdf_lo[0], "cdf_hi": d.cdf_hi[0], "greedy": greedy, "of": of}


def _logits_of(probs: torch.Tensor) -> torch.Tensor:
    """Log-probabilities [1, V] of a probability vector [V] (zeros become -inf)."""
    return torch.where(probs > 0, probs.log(), torch.full_like(probs, float("-inf"))).unsqueeze(0)


@dataclass
class Scored:
    """The target's view of one verified position."""

    raw: torch.Tensor  # [1, V] raw logits
    stages: list  # process() output
    p: torch.Tensor  # [V] final probabilities


@dataclass
class Proposal:
    tokens: list[int] = field(default_factory=list)
    q: list[torch.Tensor] = field(
        default_factory=list
    )  # [V] final draft probabilities per position
    draws: list[dict] = field(default_factory=list)
    passes: list[dict] = field(default_factory=list)
    lookup: dict | None = None  # prompt lookup: where the proposal was copied from


class AcceptanceRule:
    """Accept, resample, bonus: the rule of one round (a mixin of SpeculativeSession)."""

    def _accept(self, prop: Proposal, scored: list[Scored]) -> tuple[list[dict], int]:
        """Test the drafts in order: keep x_i with probability min(1, p/q) (greedy: iff it is the target's argmax)."""
        drafts, n, rejected = [], 0, False
        greedy = self.sampling.is_greedy
        for i, x in enumerate(prop.tokens):
            p, q = float(scored[i].p[x]), float(prop.q[i][x])
            entry = {
                "id": x,
                "text": self._text(x),
                "q": q,
                "p": p,
                "accept_prob": min(1.0, p / q) if q > 0 else 0.0,
                "overlap": float(torch.minimum(scored[i].p, prop.q[i]).sum()),
                "u": None,
                "accepted": None,
                "draw": prop.draws[i],
            }
            if not rejected:
                if greedy:
                    ok = int(self._draw(scored[i].stages[-1][1]).tokens[0]) == x
                else:
                    entry["u"], ok = self.draws.accept(p, q)
                entry["accepted"] = bool(ok)
                rejected = not ok
                n += int(ok)
            drafts.append(entry)
        return drafts, n

    def _resample(self, at: Scored, q: torch.Tensor, position: int) -> tuple[int, dict]:
        """After rejecting x_{n+1}: draw from normalise(max(0, p - q)). Greedy: p and q are one-hot at their
        argmaxes, so the residual is one-hot at the target's argmax (mass 1)."""
        greedy = self.sampling.is_greedy
        if greedy:
            draw = self._draw(at.stages[-1][1])
            dist = torch.zeros_like(at.p).scatter_(
                0, draw.tokens.to(at.p.device), 1.0
            )  # [V] one-hot
            mass, fallback = 1.0, False
        else:
            residual = (at.p - q).clamp(min=0)  # [V]
            mass = float(residual.sum())
            fallback = (
                mass <= RESIDUAL_EPS
            )  # p == q up to rounding: the rejection had probability ~0
            dist = at.p if fallback else residual / mass
            draw = self._draw(_logits_of(dist))
        y = int(draw.tokens[0])
        top = torch.topk(dist, min(self.top_n, dist.numel()))
        entries = [
            {
                "id": int(i),
                "text": self._text(int(i)),
                "p": float(at.p[i]),
                "q": float(q[i]),
                "residual": float(v),
            }
            for v, i in zip(top.values, top.indices)
            if v > 0
        ]
        return y, {
            "position": position,
            "id": y,
            "text": self._text(y),
            "mass": mass,
            "fallback": fallback,
            "top": entries,
            "draw": draw_record(draw, greedy, "residual"),
        }

    def _bonus(self, at: Scored) -> tuple[int, dict]:
        """All k drafts kept: one more token from the target's last distribution p_{k+1}."""
        greedy = self.sampling.is_greedy
        draw = self._draw(at.stages[-1][1])
        y = int(draw.tokens[0])
        return y, {
            "id": y,
            "text": self._text(y),
            "p": float(at.p[y]),
            "draw": draw_record(draw, greedy, "p"),
        }

    def _draw(self, final_logits: torch.Tensor) -> Draw:
        """argmax in greedy mode (no randomness used), else a draw from self.draws."""
        if self.sampling.is_greedy:
            return choose_token(final_logits, True, None)
        return self.draws.token(final_logits)
