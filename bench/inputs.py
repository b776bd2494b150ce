"""What the input layouts cost: the same documents as JSON Lines, JSON Lines compressed with zstd or with gzip (at
gzip's default level, as a crawl's `.json.gz` parts come), Parquet (row groups of 5,000 rows, as the Hugging Face hub
writes them), an Arrow stream (record batches of 1,000 rows, as Hugging Face datasets' `save_to_disk` writes them), one
JSON array (Alpaca's layout, indented; and on one line, as `json.dump` writes it), plain text split by `<|endoftext|>`
lines (TinyStories' layout), a tree of text files of one document each (a thousand a directory, as a source checkout
holds them; the input is the directory), JSON Lines in files of about 128 KB (a crawl's many small parts, a thousand
a directory) and Parquet and Arrow files as polars writes them (large strings; string views), each read by
`tokenmill run` with the default config but `pack.mode: none`, side by side, the order rotating each round
(`--layouts`: some of them).

In each round it measures this machine's parse+encode limit on the corpus as `bench/megatron.py` does (pyarrow's JSON
reader and gigatoken alone, the first 300 MB in memory, times the cores), and gives each layout's rate (the JSON Lines'
bytes over its wall) against the median of those limits.

The corpus is a JSONL file of `{"text"}` records (`bench/corpora.py prose` builds 0.16 GB of unique prose; default:
enwiki_slice written `--repeat` times), the tokenizer GPT-2's. Every run is from scratch (its output removed),
reporting to one Prefect server started before the rounds, as a user's is. It prints each run's wall, then per layout
the median wall, its ratio to the JSON Lines', the largest process's peak RSS, and the machine. Every layout must give
the same tokens.

    .venv/bin/python bench/inputs.py --corpus /tmp/corpora/prose.jsonl --rounds 3
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

import orjson
import polars as pl
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard
from megatron import RESERVE, Watched, checkout, limits_now  # beside this file
from throughput import SHARED, machine, make_corpus, tokenmill_command

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = SHARED / "tokenizers/gpt2/tokenizer.json"
LAYOUTS = [
    "JSON Lines", "JSON Lines, zstd", "JSON Lines, gzip", "Parquet", "Arrow (save_to_disk)", "one JSON array",
    "one JSON array, compact", "text, separated", "a tree of files", "JSON Lines, small files", "Parquet, polars",
    "Arrow, polars",
]  # fmt: skip


def layouts(corpus: Path, work: Path, chosen: Sequence[str]) -> dict[str, Path]:
    """The corpus's texts written in each chosen layout."""
    texts = [orjson.loads(line)["text"] for line in corpus.open("rb")]
    suffixes = [
        ".jsonl", ".jsonl.zst", ".jsonl.gz", ".parquet", ".arrow", ".json", "-compact.json", ".txt", "-tree", "-small",
        "-polars.parquet", "-polars.arrow",
    ]  # fmt: skip
    paths = {name: work / f"corpus{suffix}" for name, suffix in zip(LAYOUTS, suffixes, strict=True) if name in chosen}
    lines = b"".join(orjson.dumps({"text": text}) + b"\n" for text in texts)
    paths["JSON Lines"].write_bytes(lines)
    if "JSON Lines, zstd" in paths:
        paths["JSON Lines, zstd"].write_bytes(zstandard.ZstdCompressor(level=3).compress(lines))
    if "JSON Lines, gzip" in paths:  # level 6, gzip's own default (zlib: 45 s for the code corpus)
        paths["JSON Lines, gzip"].write_bytes(gzip.compress(lines, compresslevel=6, mtime=0))
    if "Parquet" in paths:
        pq.write_table(pa.table({"text": texts}), paths["Parquet"], row_group_size=5000)
    if "Parquet, polars" in paths:  # as polars writes it: large strings, its own row groups
        pl.DataFrame({"text": texts}).write_parquet(paths["Parquet, polars"])
    if "Arrow, polars" in paths:  # DataFrame.write_ipc: an Arrow file of string views
        pl.DataFrame({"text": texts}).write_ipc(paths["Arrow, polars"])
    if "Arrow (save_to_disk)" in paths:
        with (
            pa.OSFile(str(paths["Arrow (save_to_disk)"]), "wb") as sink,
            pa.ipc.new_stream(sink, pa.schema([("text", pa.string())])) as arrow,
        ):
            arrow.write_table(pa.table({"text": texts}), max_chunksize=1000)
    for name, option in [("one JSON array", orjson.OPT_INDENT_2), ("one JSON array, compact", 0)]:
        if name in paths:  # indented as Alpaca's, or on one line as json.dump writes it
            paths[name].write_bytes(orjson.dumps([{"text": text} for text in texts], option=option))
    if "text, separated" in paths:  # a separator line ends each document (none of these corpora's texts holds one)
        paths["text, separated"].write_text("".join(f"{text}\n<|endoftext|>\n" for text in texts))
    if "JSON Lines, small files" in paths:  # files of about 128 KB, a thousand a directory (a crawl's parts)
        parts, part, held = [], [], 0
        for line in lines.splitlines(keepends=True):
            part.append(line)
            held += len(line)
            if held >= 128 << 10:
                parts.append(b"".join(part))
                part, held = [], 0
        for i, data in enumerate([*parts, b"".join(part)] if part else parts):
            (paths["JSON Lines, small files"] / f"{i // 1000:04d}").mkdir(parents=True, exist_ok=True)
            (paths["JSON Lines, small files"] / f"{i // 1000:04d}" / f"part-{i:06d}.jsonl").write_bytes(data)
    if "a tree of files" in paths:  # a document a file, a thousand files a directory (as a checkout's source)
        for i, text in enumerate(texts):
            (paths["a tree of files"] / f"{i // 1000:04d}").mkdir(parents=True, exist_ok=True)
            (paths["a tree of files"] / f"{i // 1000:04d}" / f"{i:07d}.txt").write_text(text, encoding="utf-8")
    return paths


def run(mill, corpus: Path, work: Path) -> tuple[float, int, int]:
    """(wall seconds, largest process's peak RSS, tokens) of a default run on the file."""
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    os.sync()  # the run before it written out: no run pays for another's writeback
    config = work / "tokenmill.yaml"
    config.write_text(json.dumps({
        "name": "inputs-bench",
        "input": {"paths": [str(corpus)]} | ({"separator": "<|endoftext|>"} if corpus.suffix == ".txt" else {}),
        "tokenizer": {"path": str(TOKENIZER)}, "split": {"train": 1.0},
        "pack": {"mode": "none"}, "output": {"path": str(out)},
    }))  # fmt: skip
    command = [*tokenmill_command(code=REPO), "run", str(config)]
    watched = Watched(command, mill.env, psutil.virtual_memory().total - RESERVE, work / "run.log", mill.server, REPO)
    if watched.returncode != 0:
        raise SystemExit(f"tokenmill failed on {corpus.name}:\n{watched.log[-3000:]}")
    tokens = json.loads((out / "manifest.json").read_text())["splits"]["train"]["tokens"]
    return watched.wall, watched.peak_process, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, help="a JSONL file of {text} records (default: enwiki_slice)")
    parser.add_argument("--repeat", type=int, default=1, help="enwiki_slice written this many times")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--layouts", help=f"some of: {'; '.join(LAYOUTS)} (a ';' between; JSON Lines always)")
    args = parser.parse_args()
    chosen = ["JSON Lines", *args.layouts.split(";")] if args.layouts else LAYOUTS
    if unknown := set(chosen) - set(LAYOUTS):
        raise SystemExit(f"no such layout: {', '.join(sorted(unknown))}")
    work = Path(tempfile.mkdtemp(prefix="tokenmill-inputs-bench-"))
    corpus = args.corpus or work / "enwiki.jsonl"
    if args.corpus is None:
        make_corpus(SHARED / "corpora/enwiki_slice/enwiki_slice.jsonl.gz", args.repeat, corpus)
    paths = layouts(corpus, work, chosen)
    size = paths["JSON Lines"].stat().st_size
    print(f"{size / 1e9:.2f} GB of JSON Lines; {args.rounds} rounds of {', '.join(paths)}", flush=True)
    measured: dict[str, list[tuple[float, int, int]]] = {name: [] for name in paths}
    limits: list[float] = []  # the parse+encode limit, MB/s, measured in each round (the host's speed drifts)
    with checkout("tokenmill", REPO, work / "prefect-home") as mill:
        run(mill, paths["JSON Lines"], work)  # a warm-up: the server's first run, the page cache
        names = list(paths)
        for round_ in range(args.rounds):
            limit = limits_now(paths["JSON Lines"], str(TOKENIZER), 300, os.cpu_count() or 1, size)
            limits.append(limit["parse+encode limit"])
            print(json.dumps({"round": round_, "parse_encode_limit_mb_s": round(limits[-1])}), flush=True)
            for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                measured[name].append(run(mill, paths[name], work))
                wall, peak, tokens = measured[name][-1]
                print(json.dumps({"layout": name, "round": round_, "wall_s": round(wall, 2), "tokens": tokens}))
    shutil.rmtree(work, ignore_errors=True)
    if len({tokens for runs in measured.values() for *_, tokens in runs}) != 1:
        raise SystemExit("the layouts gave different numbers of tokens")
    base, limit = statistics.median(wall for wall, *_ in measured["JSON Lines"]), statistics.median(limits)
    print("\n| layout | median wall s (range) | / JSON Lines | MB/s: / limit | largest process, GB |")
    print("|---|--:|--:|--:|--:|")
    for name, runs in measured.items():
        walls, peaks = [wall for wall, *_ in runs], [peak for _, peak, _ in runs]
        wall, rate = statistics.median(walls), size / 1e6 / statistics.median(walls)
        print(
            f"| {name} | {wall:.1f} ({min(walls):.1f}-{max(walls):.1f}) | {wall / base:.2f} | "
            f"{rate:.0f}: {rate / limit:.2f} | {min(peaks) / 1e9:.2f}-{max(peaks) / 1e9:.2f} |"
        )
    print(f"\nthe parse+encode limit: {limit:.0f} MB/s (the median of {len(limits)}, one a round)\n{machine()}")


if __name__ == "__main__":
    if not SHARED.is_dir():  # the benchmarks' corpora and tokenizers; the tests read tests/data
        raise SystemExit(f"bench/inputs.py reads the tokenizers of {SHARED}, which is missing")
    main()
