"""The summary table `vllm bench serve` prints, from a ServingResult."""

from __future__ import annotations

from explorer._format import text as fmt_text


def format_summary(res) -> str:
    r = res.result
    lines = [f"{' Serving Benchmark Result ':=^60}"]

    def row(name, value, fmt="{:.2f}"):
        text = value if isinstance(value, str) else fmt_text(value, fmt)
        lines.append(f"{name:<40}{text:<20}")

    row("Engine:", res.label, "{}")
    row("Status:", res.meta.get("status", ""), "{}")
    row("Successful requests:", r["completed"], "{}")
    row("Failed requests:", r.get("failed", 0), "{}")
    row("Benchmark duration (s):", r["duration"])
    row("Total input tokens:", r["total_input_tokens"], "{}")
    row("Total generated tokens:", r["total_output_tokens"], "{}")
    row("Request throughput (req/s):", r["request_throughput"])
    if r.get("request_goodput") is not None:
        row("Request goodput (req/s):", r["request_goodput"])
    row("Output token throughput (tok/s):", r["output_throughput"])
    row("Total Token throughput (tok/s):", r["total_token_throughput"])
    for key, title in (
        ("ttft", "Time to First Token"),
        ("tpot", "Time per Output Token (excl. 1st token)"),
        ("itl", "Inter-token Latency"),
        ("e2el", "End-to-end Latency"),
        ("queue", "Queue time (ours)"),
    ):
        if f"mean_{key}_ms" not in r:
            continue
        lines.append(f"{title:-^60}")
        for stat in ("mean", "median", "p90", "p99"):
            name = {"mean": "Mean", "median": "Median", "p90": "P90", "p99": "P99"}[stat]
            row(f"{name} {key.upper()} (ms):", r.get(f"{stat}_{key}_ms"))
    lines.append("=" * 60)
    return "\n".join(lines)
