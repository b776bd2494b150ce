"""A nightly run over a growing input: what each night costs with the default config (GPT-2).

The input is `--files` gzipped JSONL files of `--docs` enwiki_slice documents each, as a crawl drops them into a
prefix. Four `tokenmill run`s of the same config, each spawned as a user's cron would, against one Prefect
server (started first, its own PREFECT_HOME):

1. the first night: every file is new;
2. nothing changed;
3. one file landed, named after the others as dated dumps are (the input grew by 1 / `--files`);
4. one file landed whose name sorts in the middle of the others (the shards after it are renumbered);
5. one of the files was replaced with other documents.

Printed per night: wall time from spawn to exit, the flow's own seconds, the shards kept and made (from the
manifest's lineage), and the input bytes actually tokenized (the shards whose tokenize result is new: not the
ones reused, under their id or another) against the whole input.

    python bench/incremental.py [--files 100] [--docs 300]
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import itertools
import json
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

from throughput import timed_run, tokenmill_command  # beside this file

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


def documents():
    """enwiki_slice's documents, over and over with fresh ids once it runs out."""
    for lap in itertools.count():
        with gzip.open(SHARED / "corpora/enwiki_slice/enwiki_slice.jsonl.gz", "rb") as f:
            for line in f:
                doc = json.loads(line)
                yield json.dumps({"id": f"{doc['id']}@{lap}", "text": doc["text"]}).encode() + b"\n"


def land(path: Path, docs, n: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(gzip.compress(b"".join(next(docs) for _ in range(n)), mtime=0))
    tmp.rename(path)  # as a crawler's upload appears: whole


def night(work: Path, config: Path, env: dict, tokenized_before: set[str]) -> dict:
    """One run; `tokenized_before`: the sources of every shard tokenized on earlier nights (updated here)."""
    wall, printed = timed_run(config, env)
    root = work / "out" / "nightly"
    manifest = json.loads((root / (root / "LATEST").read_text().strip() / "manifest.json").read_text())
    results = [json.loads(m.read_text())["result"] for m in (work / "out" / "_commits" / "tokenize").glob("*.json")]
    fresh = [r for r in results if r["source"] not in tokenized_before]
    tokenized_before.update(r["source"] for r in results)
    flow = re.search(r"whole flow: ([\d.]+) s", printed)
    return {
        "wall_s": round(wall, 1),
        "flow_s": float(flow[1]) if flow else None,
        "nothing_to_do": "Nothing to do" in printed,
        "version": manifest["version"],
        "lineage": manifest["lineage"],
        "input_mb": round(sum(f["bytes"] for f in manifest["inputs"]["files"]) / 1e6, 1),
        "tokenized_mb": round(sum(r["bytes_in"] for r in fresh) / 1e6, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--docs", type=int, default=300, help="documents per file")
    parser.add_argument("--work", type=Path, default=REPO / "out" / "bench-incremental")
    args = parser.parse_args()

    shutil.rmtree(args.work, ignore_errors=True)
    (args.work / "in").mkdir(parents=True)
    docs = documents()
    for i in range(args.files):
        land(args.work / "in" / f"dump-{i:04d}.jsonl.gz", docs, args.docs)
    config = args.work / "config.yaml"
    config.write_text(
        f"name: nightly\ninput: {{paths: ['{args.work}/in/*.jsonl.gz'], id_field: id}}\n"
        f"tokenizer: {{path: {SHARED / 'tokenizers/gpt2/tokenizer.json'}, eod: '<|endoftext|>'}}\n"
        f"output: {{path: {args.work / 'out'}}}\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "TOKENMILL_DASK_ADDRESS")}
    env |= {"PREFECT_HOME": str(args.work / "prefect-home"), "CI": "1"}
    subprocess.run([*tokenmill_command(), "server", "start"], env=env, capture_output=True, check=True)
    try:
        seen: set[str] = set()
        nights = {"first night": night(args.work, config, env, seen)}
        nights["nothing changed"] = night(args.work, config, env, seen)
        land(args.work / "in" / f"dump-{args.files:04d}.jsonl.gz", docs, args.docs)
        nights["one file landed (last)"] = night(args.work, config, env, seen)
        land(args.work / "in" / f"dump-{args.files // 2:04d}a.jsonl.gz", docs, args.docs)  # sorts after dump-NNNN.
        nights["one file landed (middle)"] = night(args.work, config, env, seen)
        land(args.work / "in" / "dump-0000.jsonl.gz", docs, args.docs)
        nights["one file replaced"] = night(args.work, config, env, seen)
    finally:
        subprocess.run([*tokenmill_command(), "server", "stop"], env=env, capture_output=True)

    print(f"# {datetime.datetime.now():%Y-%m-%d %H:%M}, {platform.machine()}, {os.cpu_count()} cores, 1-min load "
          f"{os.getloadavg()[0]:.1f}; {args.files} files of {args.docs} enwiki documents, default config")  # fmt: skip
    print("| night | wall s | flow s | shards kept | shards made | input MB | tokenized MB | tokenized share |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for name, n in nights.items():
        kept, made = n["lineage"]["shards_kept"], n["lineage"]["shards_made"]
        if n["nothing_to_do"]:
            kept, made = "(nothing to do)", 0
        share = f"{n['tokenized_mb'] / n['input_mb']:.1%}"
        print(f"| {name} | {n['wall_s']} | {n['flow_s']} | {kept} | {made} | {n['input_mb']} | {n['tokenized_mb']} "
              f"| {share} |")  # fmt: skip


if __name__ == "__main__":
    if not SHARED.is_dir():  # the benchmarks' corpora and tokenizers; the tests read tests/data
        raise SystemExit(f"bench/incremental.py reads the corpora and tokenizers of {SHARED}, which is missing")
    main()
