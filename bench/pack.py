"""Packing throughput and best-fit-decreasing at scale, on real document lengths.

Encodes enwiki_slice with GPT-2 once (EOD after each document), then prints:
1. utilization at `--seq-len` for each pack mode beside the padded one-document-per-row layout (whole slice);
2. packing throughput (Mtokens/s, one process) of each mode over the slice repeated `--repeat` times: its rows
   packed and written as the pack stage writes them (`write_packed`, to a temporary directory);
3. the bin assignment of `bfd` (`best_fit_decreasing`) for `--documents` documents whose lengths are
   drawn from the slice's, and the whole `pack_bfd` (rows written) for as many as fit in memory.

    python bench/pack.py                          # seq_len 2048, 4 x the slice, 10M documents
    python bench/pack.py --seq-len 4096 --documents 1000000
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from tokenmill.config import PackConfig
from tokenmill.core.packers import best_fit_decreasing, document_pieces, pack, pack_bfd, padded_layout_rows
from tokenmill.formats.packed import SUFFIXES, write_packed

SHARED = Path(__file__).resolve().parents[2] / "shared"


def encode_slice(source: Path, tokenizer_path: Path) -> tuple[np.ndarray, np.ndarray]:
    from tokenizers import Tokenizer

    with gzip.open(source, "rt", encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    eod = tokenizer.token_to_id("<|endoftext|>")
    docs = [e.ids + [eod] for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
    return np.concatenate(docs).astype(np.uint16), np.array([len(d) for d in docs], dtype=np.int64)


def pack_and_write(paths: dict[str, Path], tokens: np.ndarray, lengths: np.ndarray, config: PackConfig) -> None:
    with ExitStack() as stack:
        files = {key: stack.enter_context(open(path, "wb")) for key, path in paths.items()}
        write_packed(files, pack(tokens, lengths, config, pad_id=50256))


def timed(fn, *args, **kwargs):
    started = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", default=str(SHARED / "corpora/enwiki_slice/enwiki_slice.jsonl.gz"))
    parser.add_argument("--tokenizer", default=str(SHARED / "tokenizers/gpt2/tokenizer.json"))
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=4, help="copies of the slice in the throughput stream")
    parser.add_argument("--documents", type=int, default=10_000_000, help="documents for the bfd assignment")
    parser.add_argument("--stride", type=int, default=256, help="window overlap")
    args = parser.parse_args()
    seq_len = args.seq_len

    (tokens, lengths), seconds = timed(encode_slice, Path(args.source), Path(args.tokenizer))
    print(f"enwiki_slice: {len(lengths):,} documents, {len(tokens):,} GPT-2 tokens (encoded in {seconds:.0f} s)")
    print(f"machine: {os.cpu_count()} cores, numpy {np.__version__}\n")

    modes = {
        "concat": PackConfig(mode="concat", seq_len=seq_len),
        "concat, extra_token": PackConfig(mode="concat", seq_len=seq_len, extra_token=True),
        "bfd": PackConfig(mode="bfd", seq_len=seq_len),
        f"window, stride {args.stride}": PackConfig(mode="window", seq_len=seq_len, stride=args.stride),
    }
    padded_rows = padded_layout_rows(lengths, seq_len)
    print(f"| layout at seq_len {seq_len} | sequences | utilization |")
    print("|---|---|---|")
    print(f"| padded, one document per sequence | {padded_rows:,} | {len(tokens) / (padded_rows * seq_len):.2%} |")
    for name, config in modes.items():
        packed = pack(tokens, lengths, config, pad_id=50256)
        print(f"| {name} | {len(packed.rows):,} | {packed.real_tokens / packed.rows.size:.2%} |")

    stream = np.tile(tokens, args.repeat)
    stream_lengths = np.tile(lengths, args.repeat)
    print(f"\nthroughput over {len(stream) / 1e6:.1f} M tokens ({args.repeat} x the slice), one process:\n")
    print("| mode | seconds | Mtokens/s |")
    print("|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        paths = {key: Path(tmp) / f"rows{suffix}" for key, suffix in SUFFIXES.items()}
        for name, config in modes.items():
            _, seconds = timed(pack_and_write, paths, stream, stream_lengths, config)
            print(f"| {name} | {seconds:.2f} | {len(stream) / 1e6 / seconds:.1f} |")
    del stream, stream_lengths

    many = np.random.default_rng(0).choice(lengths, size=args.documents)
    _, piece_len = document_pieces(many, seq_len)
    (_, _, n_bins), seconds = timed(best_fit_decreasing, piece_len, seq_len)
    utilization = many.sum() / (n_bins * seq_len)
    print(f"\nbfd bin assignment, {args.documents:,} documents ({many.sum() / 1e9:.2f} B tokens, {len(piece_len):,}")
    print(f"pieces) drawn from the slice's lengths: {seconds:.1f} s, {n_bins:,} rows, {utilization:.2%}")
    fit = min(args.documents, 1_000_000)
    subset = many[:fit]
    fake_tokens = np.zeros(int(subset.sum()), dtype=np.uint16)
    packed, seconds = timed(pack_bfd, fake_tokens, subset, seq_len, 50256)
    print(f"pack_bfd with rows written, {fit:,} of them ({len(fake_tokens) / 1e6:.0f} M tokens): {seconds:.1f} s, "
          f"{len(fake_tokens) / 1e6 / seconds:.1f} Mtokens/s")  # fmt: skip


if __name__ == "__main__":
    if not SHARED.is_dir():  # the benchmarks' corpora and tokenizers; the tests read tests/data
        raise SystemExit(f"bench/pack.py reads the corpora and tokenizers of {SHARED}, which is missing")
    main()
