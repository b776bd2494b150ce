"""The limits of a tokenmill run on this machine, measured side by side with the run itself.

For each corpus (enwiki_slice written `--repeats` times as one plain JSONL with unique ids: x20 is 1.2 GB,
x200 12 GB, x500 30 GB), in one benchmark run:

- **encoder alone**: gigatoken, one process, one thread (`RAYON_NUM_THREADS=1`, `parallel=False`), the texts
  of the file's first `--prefix-mb` already in memory as Python strings, batches of 2,000. Its rate is in MB of
  the *file* those texts came from per second, so it compares directly with a run's MB/s of input. Timed on its
  second pass, as the ceiling: gigatoken remembers the ids of each piece of text it splits off, and on a file
  that repeats one source, nearly every piece is one it has seen. Its first pass over the file's first 50 MB, at
  most one copy of the source (unseen text, repeating only as natural text does), is reported beside it.
- **parser alone**: pyarrow's JSON reader over the same prefix as tokenmill calls it (blocks of whole lines of
  8 MB, one thread, the text column as strings), the blocks already in memory.
- **the limits they imply** on the machine's cores: the encoder ceiling `cores x encoder`, and the parse+encode
  limit `cores / (1/parser + 1/encoder)`: what the cores could do if a run did nothing but parse and encode.
- gigatoken's own JSONL reader and encoder together (`encode_files`, the JSON parsed in Rust; what Megatron's
  fast path runs), one thread, on the same prefix;
- for where the time goes, the same prefix through tokenmill's own pieces, one process, one thread: its reader
  (`read_documents`: the parse and the checks of every record) and its encoder as the tokenize stage calls it
  (the gigatoken backend on the reader's batches, with the exactness guard);
- **tokenmill**: `tokenmill run` (bench/megatron.py's: the default config but `pack.mode: none`, a LocalCluster
  of one worker per core, the Prefect server started before): the whole run's MB/s, the tokenize stage's (the
  file over the seconds from the encoder's choice to the last shard), and the largest process's and the process
  tree's peak RSS; with `--pack-mode concat`, the default config as it is (the packed rows written too). With
  `--baseline DIR`, tokenmill from that checkout (e.g. the commit before a change) runs too, on the same file
  and between the same limits; with `--rounds N`, each runs N times, alternated (the baseline first in the
  first round), and a row reports the run of median wall time and every run's. With `--cold`, the file's pages
  are dropped from the page cache before each run (`posix_fadvise(DONTNEED)`: no root needed), as a corpus that
  no process has read lately is: the run reads it from disk.

The limits are measured just before and just after a corpus's runs (the host's speed drifts); the ratios are
to their mean.

    .venv/bin/python bench/limits.py --repeats 20,200,500 --work /tmp/limits
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import megatron  # beside this file
import psutil
import throughput

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
BATCH = 2000  # texts per encoder call (the encoder alone)
UNSEEN_MB = 50  # at most: within the first copy of the source (enwiki_slice: 60 MB)


def _prefix(corpus: Path, limit: int) -> bytes:
    """The file's whole lines within its first `limit` bytes."""
    with open(corpus, "rb") as f:
        data = f.read(limit)
    return data[: data.rfind(b"\n") + 1]


def _seconds(work) -> float:
    """The seconds of `work()`'s second call: the first pays one-time costs (a fresh process's allocator takes its
    pages from the system; pyarrow's first parse ran at a third of its rate), which a worker pays once per run."""
    work()
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def _measure(corpus: str, tokenizer: str, limit: int, copy: int) -> dict[str, float]:
    """MB of file per second, each on one core in this (fresh) process: the encoder alone, the parser alone,
    tokenmill's reader and its encoder as the tokenize stage calls it."""
    import gigatoken
    import orjson
    import pyarrow
    import pyarrow.json as pj

    from tokenmill.io.readers import BATCH_BYTES, Piece, ReadOptions, read_documents
    from tokenmill.tokenizers.encoders import GigatokenEncoder, build_encoder, choose_encoder
    from tokenmill.tokenizers.pretrained import load_pretrained

    data = _prefix(Path(corpus), limit)
    size = len(data)
    rates = {}

    texts = [orjson.loads(line)["text"] for line in data.splitlines()]
    # Any tokenizer a run takes (a rank file converted, a vocabulary lacking bytes given them), as gigatoken loads it
    tokenizer_json = load_pretrained(tokenizer).data
    raw = GigatokenEncoder(tokenizer_json).tokenizer

    def encode(texts: list[str]) -> None:
        for i in range(0, len(texts), BATCH):
            raw.encode_batch(texts[i : i + BATCH], parallel=False)

    # gigatoken remembers the ids of every piece of text it has split off (its pretoken cache): on text it has
    # not seen, it is slower. Its first pass over the file's first UNSEEN_MB, within its first `copy` bytes (one
    # copy of the source, whose pieces repeat only as natural text does), says how much, before the ceiling's.
    unseen = data[: data.rfind(b"\n", 0, min(UNSEEN_MB * 1_000_000, copy)) + 1]
    raw.encode_batch(["warm-up"], parallel=False)
    started = time.perf_counter()
    encode(texts[: unseen.count(b"\n")])
    rates["encoder, unseen text"] = len(unseen) / (time.perf_counter() - started) / 1e6
    rates["encoder"] = size / _seconds(lambda: encode(texts)) / 1e6
    texts.clear()

    blocks, start = [], 0
    while start < size:
        stop = data.find(b"\n", min(start + BATCH_BYTES, size - 1)) + 1 or size
        blocks.append(data[start:stop])
        start = stop
    schema = pyarrow.schema([("text", pyarrow.string())])

    def parse() -> None:
        for block in blocks:
            pj.read_json(
                pyarrow.BufferReader(block),
                read_options=pj.ReadOptions(use_threads=False, block_size=len(block) + 1),
                parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
            )

    rates["parser"] = size / _seconds(parse) / 1e6
    blocks.clear()

    with tempfile.NamedTemporaryFile(suffix=".jsonl") as prefix:  # gigatoken's reader takes whole files only
        prefix.write(data)
        prefix.flush()
        source = gigatoken.JsonlFileSource([prefix.name], field="text")
        rates["gigatoken reader+encoder"] = size / _seconds(lambda: raw.encode_files(source, parallel=False)) / 1e6

    piece, options = Piece(corpus, 0, size, 1), ReadOptions(text_field="text")
    batches = []

    def read() -> None:
        batches[:] = [batch for batch, _ in read_documents([piece], options, columnar=True)]

    rates["tokenmill reader"] = size / _seconds(read) / 1e6

    sample = batches[0].text_values()[:200].to_pylist()
    choice, _ = choose_encoder(tokenizer_json, "auto", sample)
    encoder = build_encoder(tokenizer_json, choice)

    def encode_batches() -> None:
        for batch in batches:
            encoder.encode_batch(batch.text_values())

    rates["tokenmill encoder"] = size / _seconds(encode_batches) / 1e6
    return rates


def limits(corpus: Path, tokenizer: str, prefix_mb: float, copy: int) -> dict[str, float]:
    """`_measure` in a fresh single-threaded process."""
    os.environ["RAYON_NUM_THREADS"] = "1"
    try:
        with ProcessPoolExecutor(1) as pool:
            return pool.submit(_measure, str(corpus), tokenizer, int(prefix_mb * 1e6), copy).result()
    finally:
        os.environ.pop("RAYON_NUM_THREADS")


def with_implied(rates: dict[str, float], cores: int) -> dict[str, float]:
    return rates | {
        "encoder ceiling": cores * rates["encoder"],
        "parse+encode limit": cores / (1 / rates["parser"] + 1 / rates["encoder"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", default=str(SHARED / "corpora/enwiki_slice/enwiki_slice.jsonl.gz"))
    parser.add_argument("--tokenizer", default=str(SHARED / "tokenizers/gpt2/tokenizer.json"))
    parser.add_argument("--repeats", default="20,200", help="enwiki_slice copies per corpus, comma-separated")
    parser.add_argument("--prefix-mb", type=float, default=300, help="the file's prefix the limits are timed on")
    parser.add_argument("--memory-cap", type=float, default=20.0, help="GB: the watchdog kills a run's tree past it")
    parser.add_argument("--work", default=None, help="directory for the corpora and outputs (default: a temp dir)")
    parser.add_argument("--baseline", default=None, help="a checkout of tokenmill to run too, before this one")
    parser.add_argument("--cold", action="store_true", help="drop the corpus from the page cache before each run")
    parser.add_argument("--pack-mode", default="none", help="the runs' pack.mode (concat: the default config as is)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of tokenmill (and the baseline, alternated)")
    args = parser.parse_args()
    cores = os.cpu_count() or 1

    if args.work:
        Path(args.work).mkdir(parents=True, exist_ok=True)
    cpu = platform.processor() or platform.machine()
    cap = int(args.memory_cap * 1e9)
    print(f"{cores} cores {cpu}, {psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}")
    rows = []
    tmp = tempfile.TemporaryDirectory(prefix="tokenmill-limits-", dir=args.work)
    with tmp, contextlib.ExitStack() as servers:  # the servers stop before their PREFECT_HOMEs go
        work = Path(tmp.name)
        codes = {False: ("tokenmill", REPO)} | ({True: ("baseline", Path(args.baseline))} if args.baseline else {})
        checkouts = {b: servers.enter_context(megatron.checkout(*c, work / f"prefect-{b}")) for b, c in codes.items()}
        for repeat in [int(r) for r in args.repeats.split(",")]:
            corpus = work / "corpus.jsonl"
            size = throughput.make_corpus(Path(args.source), repeat, corpus)
            before = limits(corpus, args.tokenizer, args.prefix_mb, size // repeat)
            runs: dict[bool, list[dict]] = {False: [], True: []}  # baseline? -> its runs
            for round_ in range(args.rounds):
                for baseline_now in (True, False) if round_ % 2 == 0 else (False, True):  # alternated
                    if baseline_now not in checkouts:
                        continue
                    if args.cold:
                        out_of_page_cache(corpus)
                    out = work / ("baseline" if baseline_now else "tokenmill")
                    runs[baseline_now].append(megatron.run_tokenmill(args, checkouts[baseline_now], corpus, out, cap))
                    shutil.rmtree(out, ignore_errors=True)
            run, baseline = median_run(runs[False]), median_run(runs[True])
            after = limits(corpus, args.tokenizer, args.prefix_mb, size // repeat)
            mean = with_implied({k: (before[k] + after[k]) / 2 for k in before}, cores)
            stage_s = run["phases"].get("tokenize")
            row = {
                "corpus_gb": round(size / 1e9, 2),
                "input": "cold" if args.cold else "cached",
                "pack_mode": args.pack_mode,
                "repeat": repeat,
                "before": {k: round(v) for k, v in before.items()},
                "after": {k: round(v) for k, v in after.items()},
                "limits": {k: round(v) for k, v in mean.items()},
                "run_s": run["wall_s"],
                "runs_s": [r["wall_s"] for r in runs[False]],
                "run_mb_s": round(size / 1e6 / run["wall_s"]),
                "tokenize_stage_s": stage_s,
                "tokenize_stage_mb_s": round(size / 1e6 / stage_s) if stage_s else None,
                "peak_process_gb": run["peak_process_gb"],
                "peak_tree_gb": run["peak_tree_gb"],
                "tokens": run["tokens"],
                "exit": run["exit"],
                "phases": run["phases"],
            }
            if baseline is not None:
                row["baseline"] = {
                    "run_s": baseline["wall_s"],
                    "runs_s": [r["wall_s"] for r in runs[True]],
                    "run_mb_s": round(size / 1e6 / baseline["wall_s"]),
                    "tokenize_stage_s": baseline["phases"].get("tokenize"),
                    "peak_process_gb": baseline["peak_process_gb"],
                    "tokens": baseline["tokens"],
                    "phases": baseline["phases"],
                }
            rows.append(row)
            print(json.dumps(row), flush=True)
            corpus.unlink()
    print_table(rows)


def median_run(runs: list[dict]) -> dict | None:
    """The run of median wall time (the faster of the middle two), None for none."""
    return sorted(runs, key=lambda r: r["wall_s"])[(len(runs) - 1) // 2] if runs else None


def out_of_page_cache(path: Path) -> None:
    """Drop the file's pages from the page cache (written back first: dirty pages stay)."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def print_table(rows: list[dict]) -> None:
    print("\nMB of input per second; per core for the pieces alone, the run's for tokenmill. Limits: the mean of")
    print("before and after the runs. Ratios: tokenmill's whole run to the encoder ceiling, its tokenize stage to")
    print("the parse+encode limit.\n")
    print("| corpus | encoder, unseen text | encoder | parser | gigatoken reader+encoder | tokenmill reader "
          "| tokenmill encoder | encoder ceiling | parse+encode limit | tokenmill run | tokenize stage | run / ceiling "
          "| stage / limit | largest process | tree |")  # fmt: skip
    print("|--:|" + "--:|" * 14)
    for r in rows:
        lim = r["limits"]
        run_ratio = r["run_mb_s"] / lim["encoder ceiling"]
        stage = r["tokenize_stage_mb_s"]
        stage_ratio = f"{stage / lim['parse+encode limit']:.2f}" if stage else "-"
        print(
            f"| {r['corpus_gb']:.1f} GB{' (cold)' if r['input'] == 'cold' else ''} "
            f"| {lim['encoder, unseen text']} | {lim['encoder']} | {lim['parser']} "
            f"| {lim['gigatoken reader+encoder']} "
            f"| {lim['tokenmill reader']} "
            f"| {lim['tokenmill encoder']} | {lim['encoder ceiling']} | {lim['parse+encode limit']} "
            f"| {r['run_mb_s']} ({r['run_s']:.1f} s) | {stage or '-'} ({r['tokenize_stage_s']} s) | {run_ratio:.2f} "
            f"| {stage_ratio} | {r['peak_process_gb']:.2f} GB | {r['peak_tree_gb']:.2f} GB |"
        )


if __name__ == "__main__":
    if not SHARED.is_dir():  # the benchmarks' corpora and tokenizers; the tests read tests/data
        raise SystemExit(f"bench/limits.py reads the corpora and tokenizers of {SHARED}, which is missing")
    main()
