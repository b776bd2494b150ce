"""Tokenization throughput: every installed encoder's single-core ceiling against a per-document HF
multiprocessing baseline, tokenmill's tokenize stage and the whole flow, on the same documents in one run.

Rows, all in MB/s of input text (the JSONL's bytes) and Mtokens/s (GPT-2 ids, EOD included for the stage):

- each installed encoder alone in one process, texts already in memory (hf and tiktoken on the first
  `--encoder-mb` of the corpus: at 3-15 MB/s the whole of it would take minutes; gigatoken on all of it);
- `preprocess_data.py`-style baseline: a `multiprocessing.Pool` of `--workers` processes, each line parsed
  and encoded per document with HF (on the same prefix);
- tokenmill's tokenize stage alone: the library over every shard, one process per worker, no Prefect;
- `tokenmill run` from process start to exit (Prefect server already running, LocalCluster start-up included).

The ceiling is `--workers` x the fastest single-core encoder rate. The host's speed drifts, so each whole-flow
run is compared with a ceiling measured just before it (the fastest encoder on the first `--ceiling-mb`), and
its row shows the median of those ratios. Peak RSS is the largest of the worker processes (`ru_maxrss`).

    python bench/throughput.py                                   # enwiki_slice once, GPT-2, 2 workers
    python bench/throughput.py --repeat 20 --shard-size 64MB --runs 5   # the issue's 1.2 GB setup
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import Pool
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


def tokenmill_command(python: str = sys.executable, code: Path | None = None) -> list[str]:
    """`tokenmill` as installed beside `python`; a checkout from before the command moved out of the library (it
    has `tokenmill/__main__.py`) as `python -m tokenmill`, since the installed command names the new module."""
    if code is not None and (Path(code) / "tokenmill" / "__main__.py").exists():
        return [python, "-m", "tokenmill"]
    return [str(Path(python).with_name("tokenmill"))]


def timed_run(config: Path, env: dict) -> tuple[float, str]:
    """`tokenmill run CONFIG` from the repository, to its exit: its wall time in seconds and what it printed. A run
    that fails ends the benchmark with its output."""
    began = time.perf_counter()
    done = subprocess.run([*tokenmill_command(), "run", str(config)], env=env, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - began
    if done.returncode:
        raise SystemExit(f"tokenmill run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return wall, done.stdout


def machine() -> str:
    """The machine a benchmark ran on, for the caption of its table."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"machine: {platform.machine()}, {os.cpu_count()} cores, {memory:.0f} GiB, {platform.python_version()}"


def make_corpus(source: Path, repeat: int, target: Path) -> int:
    """Write `source` (JSONL, gzipped or not) `repeat` times over as one plain JSONL with unique ids; its size."""
    docs = [orjson.loads(line) for line in (gzip.open if source.suffix == ".gz" else open)(source, "rb")]
    with open(target, "wb") as f:
        for r in range(repeat):
            f.write(b"".join(orjson.dumps({**d, "id": f"{d['id']}#{r}"}) + b"\n" for d in docs))
    return target.stat().st_size


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def read_texts(corpus: Path, limit: int | None) -> tuple[list[str], int]:
    texts, size = [], 0
    with open(corpus, "rb") as f:
        for line in f:
            texts.append(orjson.loads(line)["text"])
            size += len(line)
            if limit is not None and size >= limit:
                break
    return texts, size


def _raw_encoder(args) -> tuple[str, float, int, int, float]:
    """One encoder alone over texts in memory (run in a fresh process, so its peak RSS is its own)."""
    backend, corpus, tokenizer, limit = args
    from tokenmill.tokenizers.encoders import new_backend

    texts, size = read_texts(corpus, limit)
    encoder = new_backend(backend, Path(tokenizer).read_bytes())
    started, tokens = time.perf_counter(), 0
    for i in range(0, len(texts), 2000):
        tokens += len(encoder.encode_batch(texts[i : i + 2000])[0])
    return backend, time.perf_counter() - started, size, tokens, peak_rss_mb()


_tok = None


def _per_document_init(tokenizer: str) -> None:
    global _tok
    from tokenizers import Tokenizer

    _tok = Tokenizer.from_file(tokenizer)


def _per_document(line: bytes) -> int:
    """What preprocess_data.py's Encoder.encode does per line: parse, encode, append EOD."""
    return len(_tok.encode(json.loads(line)["text"], add_special_tokens=False).ids) + 1


def per_document_baseline(corpus: Path, tokenizer: str, limit: int, workers: int) -> tuple[float, int, int]:
    with open(corpus, "rb") as f:
        lines, size = [], 0
        for line in f:
            lines.append(line)
            size += len(line)
            if size >= limit:
                break
    started = time.perf_counter()
    with Pool(workers, initializer=_per_document_init, initargs=(tokenizer,)) as pool:
        tokens = sum(pool.imap(_per_document, lines, chunksize=25))
    return time.perf_counter() - started, size, tokens


def _tokenize_one(args) -> tuple:
    from tokenmill.stages.tokenize import Tokenizing, tokenize_shard

    config, shard, info, choice = args
    return tokenize_shard(Tokenizing.of(config, info, choice), shard), peak_rss_mb()


def tokenize_stage(config, workers: int) -> tuple[float, int, float, str]:
    from tokenmill.stages.partition import plan_shards
    from tokenmill.stages.tokenize import choose_run_encoder
    from tokenmill.stages.train_tokenizer import install_pretrained

    plan = plan_shards(config)
    info = install_pretrained(config)
    choice = choose_run_encoder(config, plan.shards, info, log=lambda _: None)
    started = time.perf_counter()
    with ProcessPoolExecutor(workers) as pool:
        results = list(pool.map(_tokenize_one, [(config, s, info, choice) for s in plan.shards]))
    seconds = time.perf_counter() - started
    tokens = sum(c["tokens"] for r, _ in results for c in r.splits.values())
    return seconds, tokens, max(rss for _, rss in results), f"{choice.backend} {choice.version}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", default=str(SHARED / "corpora/enwiki_slice/enwiki_slice.jsonl.gz"))
    parser.add_argument("--tokenizer", default=str(SHARED / "tokenizers/gpt2/tokenizer.json"))
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--shard-size", default="64MB")
    parser.add_argument("--encoder-mb", type=float, default=60, help="prefix for the slow encoders and baseline")
    parser.add_argument("--runs", type=int, default=1, help="whole-flow runs (from scratch); the median is shown")
    parser.add_argument("--ceiling-mb", type=float, default=300, help="prefix for each run's own ceiling")
    args = parser.parse_args()
    os.environ["RAYON_NUM_THREADS"] = "1"  # one core per process, as in the flow's workers

    from tokenmill.config import TokenmillConfig
    from tokenmill.tokenizers.encoders import BACKENDS, new_backend

    with tempfile.TemporaryDirectory(prefix="tokenmill-bench-") as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        size = make_corpus(Path(args.source), args.repeat, corpus)
        settings = {
            "name": "bench",
            "input": {"paths": [str(corpus)], "id_field": "id"},
            "partition": {"shard_size": args.shard_size},
            "tokenizer": {"path": args.tokenizer},
            "fertility": {"enabled": False},
            "pack": {"mode": "none"},
            "output": {"path": f"{tmp}/stage"},
            "dask": {"n_workers": args.workers},
        }
        config = TokenmillConfig.model_validate(settings)
        cpu = platform.processor() or platform.machine()
        print(f"corpus: {size / 1e6:.1f} MB of JSONL ({args.repeat} x {Path(args.source).name}), "
              f"{args.workers} workers; {os.cpu_count()} cores {cpu}, Python {platform.python_version()}")  # fmt: skip

        rows = []  # (what, seconds, bytes, tokens, peak RSS MB per worker)
        limit = int(args.encoder_mb * 1e6)
        tokenizer_json = Path(args.tokenizer).read_bytes()
        for backend in BACKENDS:
            try:
                new_backend(backend, tokenizer_json)
            except Exception as e:  # not installed, or cannot represent this tokenizer
                print(f"  {backend}: skipped ({type(e).__name__}: {e})")
                continue
            whole = None if backend == "gigatoken" else limit
            with ProcessPoolExecutor(1) as pool:
                name, seconds, nbytes, tokens, rss = pool.submit(
                    _raw_encoder, (backend, corpus, args.tokenizer, whole)
                ).result()
            rows.append((f"{name} encoder alone, 1 process, texts in memory", seconds, nbytes, tokens, rss))
        best = max(nbytes / seconds for _, seconds, nbytes, _, _ in rows)
        fastest = next(name.split()[0] for name, seconds, nbytes, _, _ in rows if nbytes / seconds == best)
        ceiling = args.workers * best / 1e6

        seconds, nbytes, tokens = per_document_baseline(corpus, args.tokenizer, limit, args.workers)
        rows.append((f"hf per document, Pool({args.workers}) (preprocess_data.py)", seconds, nbytes, tokens, None))
        seconds, tokens, rss, backend = tokenize_stage(config, args.workers)
        rows.append((f"tokenmill tokenize stage ({backend}, no Prefect)", seconds, size, tokens, rss))

        config_file = Path(tmp) / "flow.yaml"
        config_file.write_text(json.dumps(settings | {"output": {"path": f"{tmp}/flow"}}))
        times, ratios = [], []
        env = {k: v for k, v in os.environ.items() if k != "RAYON_NUM_THREADS"}
        for _ in range(args.runs):  # each from scratch, after its own ceiling: the host's speed drifts
            with ProcessPoolExecutor(1) as pool:
                prefix = int(args.ceiling_mb * 1e6)
                _, seconds, nbytes, _, _ = pool.submit(_raw_encoder, (fastest, corpus, args.tokenizer, prefix)).result()
            ceiling_now = args.workers * nbytes / seconds / 1e6
            shutil.rmtree(f"{tmp}/flow", ignore_errors=True)
            started = time.perf_counter()
            subprocess.run(  # as a user runs it: not with this process's one-thread RAYON_NUM_THREADS
                [*tokenmill_command(), "run", str(config_file)],
                check=True,
                capture_output=True,
                env=env,
            )
            times.append(time.perf_counter() - started)
            ratios.append(size / 1e6 / times[-1] / ceiling_now)
            print(f"whole flow: {times[-1]:.1f} s = {ratios[-1]:.1%} of the {ceiling_now:.0f} MB/s ceiling just before")
        median = f", median of {args.runs}" if args.runs > 1 else ""
        what = f"tokenmill run (whole flow, process start to exit{median})"
        rows.append((what, statistics.median(times), size, tokens, None, statistics.median(ratios)))

        print(f"\nceiling = {args.workers} x fastest single-core encoder = {ceiling:.0f} MB/s\n")
        print(f"| {'what':<58} | MB in | seconds |   MB/s | Mtokens/s | of ceiling | peak RSS/worker |")
        print(f"|{'-' * 60}|------:|--------:|-------:|----------:|-----------:|----------------:|")
        for name, seconds, nbytes, tokens, rss, *ratio in rows:
            rate, mtok = nbytes / 1e6 / seconds, tokens / 1e6 / seconds
            memory = f"{rss:,.0f} MB" if rss else "-"
            print(f"| {name:<58} | {nbytes / 1e6:5.0f} | {seconds:7.1f} | {rate:6.1f} | {mtok:9.2f} "
                  f"| {ratio[0] if ratio else rate / ceiling:10.1%} | {memory:>15} |")  # fmt: skip


if __name__ == "__main__":
    if not SHARED.is_dir():  # the benchmarks' corpora and tokenizers; the tests read tests/data
        raise SystemExit(f"bench/throughput.py reads the corpora and tokenizers of {SHARED}, which is missing")
    main()
