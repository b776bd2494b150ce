"""Tokenization throughput: the raw encoder ceiling against tokenmill's tokenize stage and whole flow.

Prints, on the same documents in one run: the HF `tokenizers` encoder alone in one process (texts already
in memory; the ceiling is that rate times the worker count), tokenmill's tokenize stage alone (the library
over every shard, one process per worker, no Prefect), and `tokenmill run` from start to exit (Prefect
server already running, LocalCluster start-up included). MB/s are of input JSONL bytes.

    python bench/tokenize.py                       # enwiki_slice, GPT-2, 2 workers
    python bench/tokenize.py --repeat 20 --workers 2 --shard-size 64MB
"""

from __future__ import annotations

import sys

# This file shares its name with the stdlib's `tokenize`: keep bench/ off the import path.
sys.path[:] = [p for p in sys.path if not p.endswith("/bench")]

import argparse  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


def make_corpus(source: Path, repeat: int, target: Path) -> int:
    """Write `source` `repeat` times over as one plain JSONL with unique ids; return its size."""
    lines = gzip.open(source, "rt", encoding="utf-8").read().splitlines()
    with open(target, "w", encoding="utf-8") as f:
        for r in range(repeat):
            for line in lines:
                doc = json.loads(line)
                doc["id"] = f"{doc['id']}#{r}"
                f.write(json.dumps(doc, ensure_ascii=False) + "\n")
    return target.stat().st_size


def raw_encoder(corpus: Path, tokenizer: str) -> tuple[float, int]:
    from tokenizers import Tokenizer

    texts = [json.loads(line)["text"] for line in open(corpus, encoding="utf-8")]
    tok = Tokenizer.from_file(tokenizer)
    started = time.perf_counter()
    tokens = 0
    for i in range(0, len(texts), 1000):
        tokens += sum(len(e.ids) for e in tok.encode_batch_fast(texts[i : i + 1000], add_special_tokens=False))
    return time.perf_counter() - started, tokens


def _tokenize_one(args):
    from tokenmill.tokenize import tokenize_shard

    config, shard, info = args
    return tokenize_shard(config, shard, info)


def tokenize_stage(config, workers: int) -> tuple[float, int]:
    from tokenmill.partition import plan_shards
    from tokenmill.tokenizer import install_pretrained

    plan = plan_shards(config)
    info = install_pretrained(config)
    started = time.perf_counter()
    with ProcessPoolExecutor(workers) as pool:
        results = list(pool.map(_tokenize_one, [(config, s, info) for s in plan["shards"]]))
    tokens = sum(c["tokens"] for r in results for c in r["splits"].values())
    return time.perf_counter() - started, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", default=str(SHARED / "corpora/enwiki_slice/enwiki_slice.jsonl.gz"))
    parser.add_argument("--tokenizer", default=str(SHARED / "tokenizers/gpt2/tokenizer.json"))
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--shard-size", default="16MB")
    args = parser.parse_args()
    os.environ["RAYON_NUM_THREADS"] = "1"  # one core per process, as in the flow's workers

    from tokenmill.config import TokenmillConfig

    with tempfile.TemporaryDirectory(prefix="tokenmill-bench-") as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        size = make_corpus(Path(args.source), args.repeat, corpus)
        settings = {
            "name": "bench",
            "input": {"paths": [str(corpus)], "id_field": "id"},
            "partition": {"shard_size": args.shard_size},
            "tokenizer": {"path": args.tokenizer},
            "pack": {"mode": "none"},
            "output": {"path": f"{tmp}/stage"},
            "dask": {"n_workers": args.workers},
        }
        config = TokenmillConfig.model_validate(settings)
        print(
            f"corpus: {size / 1e6:.1f} MB of JSONL ({args.repeat} x {Path(args.source).name}), {args.workers} workers"
        )

        rows = []
        seconds, tokens = raw_encoder(corpus, args.tokenizer)
        ceiling = size / 1e6 / seconds * args.workers
        rows.append(("HF tokenizers, 1 process, texts in memory", seconds, tokens))
        rows.append(("tokenmill tokenize stage (library, no Prefect)", *tokenize_stage(config, args.workers)))

        config_file = Path(tmp) / "flow.yaml"
        config_file.write_text(json.dumps(settings | {"output": {"path": f"{tmp}/flow"}}))
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "tokenmill", "run", str(config_file)], check=True, capture_output=True)
        rows.append(("tokenmill run (whole flow, process start to exit)", time.perf_counter() - started, tokens))

        print(f"\nceiling = {args.workers} x single-process encoder rate = {ceiling:.1f} MB/s\n")
        print(f"| {'what':<52} | seconds | MB/s | Mtokens/s | of ceiling |")
        print(f"|{'-' * 54}|---------|------|-----------|------------|")
        for name, seconds, tokens in rows:
            rate = size / 1e6 / seconds
            mtok = tokens / 1e6 / seconds
            print(f"| {name:<52} | {seconds:7.1f} | {rate:4.1f} | {mtok:9.2f} | {rate / ceiling:10.0%} |")


if __name__ == "__main__":
    main()
