"""Where every file of a dataset lives, relative to `output.path`; the one place that knows the names."""

from __future__ import annotations

import re

PLAN = "plan.json"
TOKENIZER = "tokenizer/tokenizer.json"
STATS = "stats.json"
MANIFEST = "manifest.json"
PRIVATE = ("_commits/", "_work/")  # bookkeeping, not part of the published dataset


def shard_name(shard_id: int) -> str:
    return f"shard-{shard_id:05d}"


def megatron_prefix(split: str, shard_id: int) -> str:
    return f"megatron/{split}/{shard_name(shard_id)}"


def packed_prefix(split: str, shard_id: int) -> str:
    return f"packed/{split}/{shard_name(shard_id)}"


def rejects_file(shard_id: int) -> str:
    return f"rejects/{shard_name(shard_id)}.jsonl"


def sample_file(shard_id: int) -> str:
    return f"_work/sample/{shard_name(shard_id)}.jsonl"


_SHARD_FILE = re.compile(
    r"^(?P<family>megatron|packed)/(?P<split>[^/]+)/shard-(?P<shard>\d+)\.(?P<ext>bin|idx|tokens\.npy|cu_seqlens\.npy|row_offsets\.npy)$"
)
_KINDS = {
    "bin": "megatron-bin",
    "idx": "megatron-idx",
    "tokens.npy": "packed-tokens",
    "cu_seqlens.npy": "packed-cu-seqlens",
    "row_offsets.npy": "packed-row-offsets",
}


def describe(rel: str) -> dict:
    """The manifest's view of a file: its kind, and its split and shard where it has them."""
    if m := _SHARD_FILE.match(rel):
        return {"kind": _KINDS[m["ext"]], "split": m["split"], "shard": int(m["shard"])}
    if m := re.match(r"^rejects/shard-(\d+)\.jsonl$", rel):
        return {"kind": "rejects", "split": None, "shard": int(m[1])}
    kind = {PLAN: "plan", TOKENIZER: "tokenizer", STATS: "stats"}.get(rel, "other")
    return {"kind": kind, "split": None, "shard": None}
