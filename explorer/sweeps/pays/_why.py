"""Small phrases the tricks' `why` lines share, written from a split (explorer.costs.split)."""

from __future__ import annotations

from explorer._format import ms


def regime_phrase(parts: dict) -> str:
    """'compute-bound here (floors: compute 1.2 ms, memory 0.3 ms of 2 ms measured)'."""
    floors = parts["floors"]
    memory = sum(floors[k] for k in ("weights", "kv_read", "kv_write"))
    latency = parts["bound_s"] + parts["overhead_s"] if parts["overhead_s"] is not None else None
    return (
        f"{parts['regime']}-bound here (floors: memory {ms(memory)}, compute "
        f"{ms(floors['compute'])}; {ms(latency)} measured)"
    )
