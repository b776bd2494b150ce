"""What the trainers' layouts cost: `tokenmill run` with the default `output.formats` against the same run with each
layout added alone and with all of them, side by side on the same corpus, the order rotating each round.

The corpus is enwiki_slice (`../shared/corpora/enwiki_slice/`, its SOURCE.md) written `--repeat` times with unique
ids (20: the 1.2 GB benchmark corpus); the tokenizer GPT-2's. Every run is from scratch (its output removed),
reporting to one Prefect server started before the rounds, as a user's is, and after the page cache has written
out the run before it. It prints each run's wall, then per config the median wall and its ratio to the default's
median, and the machine.

    .venv/bin/python bench/formats.py --repeat 20 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path

import psutil
from megatron import RESERVE, Watched, checkout  # beside this file
from throughput import SHARED, machine, make_corpus, tokenmill_command

REPO = Path(__file__).resolve().parents[1]
DEFAULT = ["megatron", "packed"]
LAYOUTS = ["olmo", "datatrove", "litdata", "hf_parquet", "mds"]


def run(mill, corpus: Path, formats: list[str], work: Path) -> float:
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    os.sync()  # the run before it written out: no run pays for another's writeback
    config = work / "tokenmill.yaml"
    config.write_text(json.dumps({
        "name": "formats-bench", "input": {"paths": [str(corpus)], "id_field": "id"},
        "tokenizer": {"path": str(SHARED / "tokenizers/gpt2/tokenizer.json"), "eod": "<|endoftext|>"},
        "output": {"path": str(out), "formats": formats},
    }))  # fmt: skip
    command = [*tokenmill_command(code=REPO), "run", str(config)]
    watched = Watched(command, mill.env, psutil.virtual_memory().total - RESERVE, work / "run.log", mill.server, REPO)
    if watched.returncode != 0:
        raise SystemExit(f"tokenmill failed with {formats}:\n{watched.log[-3000:]}")
    return watched.wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=20, help="enwiki_slice written this many times")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--each", action="store_true", help="also each layout added alone")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tokenmill-formats-bench-"))
    corpus = work / "corpus.jsonl"
    size = make_corpus(SHARED / "corpora/enwiki_slice/enwiki_slice.jsonl.gz", args.repeat, corpus)
    configs = {"default": DEFAULT, "all layouts": DEFAULT + LAYOUTS}
    if args.each:
        configs |= {f"+{layout}": [*DEFAULT, layout] for layout in LAYOUTS}
    print(f"{size / 1e9:.2f} GB of JSONL; {args.rounds} rounds of {', '.join(configs)}", flush=True)
    walls: dict[str, list[float]] = {name: [] for name in configs}
    with checkout("tokenmill", REPO, work / "prefect-home") as mill:
        run(mill, corpus, DEFAULT, work)  # a warm-up: the server's first run, the page cache
        names = list(configs)
        for round_ in range(args.rounds):
            for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                walls[name].append(run(mill, corpus, configs[name], work))
                print(json.dumps({"config": name, "round": round_, "wall_s": round(walls[name][-1], 2)}), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    base = statistics.median(walls["default"])
    print("\n| output.formats | median wall s | / default |\n|---|--:|--:|")
    for name, measured in walls.items():
        print(f"| {name} | {statistics.median(measured):.1f} | {statistics.median(measured) / base:.2f} |")
    print(f"\n{machine()}")


if __name__ == "__main__":
    if not SHARED.is_dir():  # the benchmarks' corpora and tokenizers; the tests read tests/data
        raise SystemExit(f"bench/formats.py reads the corpora and tokenizers of {SHARED}, which is missing")
    main()
