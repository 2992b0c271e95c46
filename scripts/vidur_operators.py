"""Rebuild assets/published/vidur-operators/ from a checkout of microsoft/vidur (MIT).

    python scripts/vidur_operators.py --git-dir /path/to/vidur/.git

Keeps, of data/profiling/compute/{a100,h100}/*/*/mlp.csv, the files whose layer shape is one of
our architectures (explorer.serving.simulate.operators.known_shapes), and of those the token
counts 2^k and 3 x 2^k; of data/profiling/network/{a100,h100}_dgx/all_reduce.csv the runs inside
one box (GPUs = devices per node) at sizes nearest 2^k and 1.5 x 2^k bytes. Only the median of
each operator is kept (milliseconds, as Vidur records them).
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import subprocess

from explorer.serving.simulate.operators import (
    ALLREDUCE,
    ALLREDUCE_FIELDS,
    COMPUTE,
    COMPUTE_FIELDS,
    from_vidur,
    known_shapes,
    shape_of_row,
)

CHIPS = ("a100", "h100")


def git(git_dir: str, *args: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", git_dir, *args], check=True, capture_output=True, text=True
    ).stdout


def kept_tokens(n: int) -> bool:
    """2^k or 3 x 2^k."""
    for base in (1, 3):
        q = n / base
        if q >= 1 and q == int(q) and int(q) & (int(q) - 1) == 0:
            return True
    return False


def rounded(value: str) -> str:
    """Vidur's medians (ms, CUDA-event resolution about a microsecond) to 5 decimals."""
    try:
        return str(round(float(value), 5)) if "." in value else value
    except ValueError:
        return value


def compute(git_dir: str) -> list[dict]:
    names = git(git_dir, "ls-tree", "-r", "--name-only", "HEAD", "data/profiling/compute").split()
    out = []
    for name in names:
        parts = name.split("/")
        if parts[-1] != "mlp.csv" or parts[3] not in CHIPS:
            continue
        raw = list(csv.DictReader(io.StringIO(git(git_dir, "show", f"HEAD:{name}"))))
        if shape_of_row(raw[0]) not in known_shapes():
            print(f"skipped {name}: shape {shape_of_row(raw[0]).describe()} is none of ours")
            continue
        rows, seen = [], set()
        for r in from_vidur(raw, parts[3], "/".join(parts[4:6])):
            key = (r["tokens"], r["tp"])
            if kept_tokens(int(r["tokens"])) and key not in seen:  # Vidur repeats a few: first
                seen.add(key)
                rows.append({k: rounded(v) for k, v in r.items()})
        print(f"kept {name}: {len(rows)} of {len(raw)} rows")
        out += rows
    return out


def allreduce(git_dir: str) -> list[dict]:
    out = []
    for chip in CHIPS:
        name = f"data/profiling/network/{chip}_dgx/all_reduce.csv"
        raw = list(csv.DictReader(io.StringIO(git(git_dir, "show", f"HEAD:{name}"))))
        raw = [r for r in raw if r["num_workers"] == r["devices_per_node"] and r["rank"] == "0"]
        for gpus in sorted({r["num_workers"] for r in raw}, key=int):
            sizes = sorted({int(r["size"]) for r in raw if r["num_workers"] == gpus})
            targets = [b * 2**k for k in range(11, 27) for b in (1, 1.5)]
            keep = {min(sizes, key=lambda s: abs(math.log(s / t))) for t in targets}
            for r in raw:
                if r["num_workers"] == gpus and int(r["size"]) in keep:
                    median = rounded(r["time_stats.all_reduce.median"])
                    out.append(
                        dict(zip(ALLREDUCE_FIELDS, (chip, f"{chip}_dgx", gpus, r["size"], median)))
                    )
        print(f"kept {name}: {sum(1 for r in out if r['chip'] == chip)} rows")
    return out


def write(path, fields, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--git-dir", required=True, help="the .git of a microsoft/vidur checkout")
    args = p.parse_args()
    print("commit", git(args.git_dir, "rev-parse", "HEAD").strip())
    write(COMPUTE, COMPUTE_FIELDS, compute(args.git_dir))
    write(ALLREDUCE, ALLREDUCE_FIELDS, allreduce(args.git_dir))


if __name__ == "__main__":
    main()
