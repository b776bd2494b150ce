"""A mixture of three sources as one run, against the same three sources as three runs and against one run over
all their files as a single input: wall time from spawn to exit, side by side, interleaved, default config
otherwise (GPT-2, EOD, pack concat 2048; each run from scratch in a fresh output).

Sources (../shared/corpora, gzipped JSONL): enwiki_slice (57 MB of text), code (CPython's stdlib, 12 MB) and
multilingual (7 MB), weights 0.6 / 0.3 / 0.1. Each round runs, in an order that rotates by round: the mix; the
three single-source runs one after another (their walls summed); the single run over all files (after one
untimed warm-up run: a fresh server's first run, and the page cache, are no contender's). Printed: each
round's walls, the medians, the mix's wall against the three runs' sum, and MB/s of input for the mix and the
single run (the mix must be no slower per byte). One Prefect server for all runs (started first).

    .venv/bin/python bench/mixture.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import statistics
import subprocess
import time
from pathlib import Path

import yaml
from throughput import timed_run, tokenmill_command  # beside this file

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
SOURCES = {"wiki": ("enwiki_slice", 0.6), "code": ("code", 0.3), "multilingual": ("multilingual", 0.1)}
TOKENIZER = {"path": str(SHARED / "tokenizers/gpt2/tokenizer.json"), "eod": "<|endoftext|>"}


def paths(corpus: str) -> list[str]:
    return [str(SHARED / "corpora" / corpus / "*.jsonl.gz")]


def configs(work: Path, round_: int) -> dict[str, list[dict]]:
    """Each contender's configs (run one after another), building in fresh outputs under `work`."""
    out = work / f"round-{round_}"
    mix = {
        "name": "mix",
        "sources": [{"name": n, "input": {"paths": paths(c)}, "weight": w} for n, (c, w) in SOURCES.items()],
        "tokenizer": TOKENIZER,
        "output": {"path": str(out / "mix")},
    }
    singles = [
        {"name": n, "input": {"paths": paths(c)}, "tokenizer": TOKENIZER, "output": {"path": str(out / n)}}
        for n, (c, _) in SOURCES.items()
    ]
    together = {
        "name": "together",
        "input": {"paths": [p for c, _ in SOURCES.values() for p in paths(c)]},
        "tokenizer": TOKENIZER,
        "output": {"path": str(out / "together")},
    }
    return {"mix (1 run)": [mix], "3 runs": singles, "1 input, same files": [together]}


def run(config: dict, work: Path, env: dict) -> float:
    path = work / f"{config['name']}-{time.monotonic_ns()}.yaml"
    path.write_text(yaml.safe_dump(config))
    return timed_run(path, env)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=REPO / "out" / "bench-mix")
    args = parser.parse_args()

    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "TOKENMILL_DASK_ADDRESS")}
    env |= {"PREFECT_HOME": str(args.work / "prefect-home"), "CI": "1"}
    subprocess.run([*tokenmill_command(), "server", "start"], env=env, capture_output=True, check=True)
    walls: dict[str, list[float]] = {}
    try:
        # One untimed run first: a fresh server's first flow run, and a cold page cache, are no contender's cost.
        run(configs(args.work, -1)["1 input, same files"][0], args.work, env)
        shutil.rmtree(args.work / "round--1")
        for r in range(args.rounds):
            contenders = list(configs(args.work, r).items())
            contenders = contenders[r % 3 :] + contenders[: r % 3]  # interleaved: each goes first in turn
            for name, runs in contenders:
                walls.setdefault(name, []).append(sum(run(c, args.work, env) for c in runs))
            print(f"round {r + 1}: " + ", ".join(f"{n} {w[-1]:.1f} s" for n, w in walls.items()), flush=True)
            shutil.rmtree(args.work / f"round-{r}")
    finally:
        subprocess.run([*tokenmill_command(), "server", "stop"], env=env, capture_output=True)

    text_mb = sum(  # uncompressed input, as the runs measure it (gzip's trailer)
        int.from_bytes(f.read_bytes()[-4:], "little") / 1e6
        for c, _ in SOURCES.values()
        for f in (SHARED / "corpora" / c).glob("*.jsonl.gz")
    )
    median = {n: statistics.median(w) for n, w in walls.items()}
    print(f"\n# {datetime.datetime.now():%Y-%m-%d %H:%M}, {platform.machine()}, {os.cpu_count()} cores, "
          f"1-min load {os.getloadavg()[0]:.1f}; {text_mb:.0f} MB of JSONL, {args.rounds} rounds, medians")  # fmt: skip
    print("| contender | wall s (median) | MB/s of input | rounds |")
    print("|---|--:|--:|---|")
    for name, w in walls.items():
        print(f"| {name} | {median[name]:.1f} | {text_mb / median[name]:.1f} | {', '.join(f'{x:.1f}' for x in w)} |")
    mix, three, together = (median[n] for n in ("mix (1 run)", "3 runs", "1 input, same files"))
    print(f"\nmix / sum of three runs: {mix / three:.2f}; mix / one input of the same files: {mix / together:.2f}")


if __name__ == "__main__":
    if not SHARED.is_dir():  # the benchmarks' corpora and tokenizers; the tests read tests/data
        raise SystemExit(f"bench/mixture.py reads the corpora and tokenizers of {SHARED}, which is missing")
    main()
