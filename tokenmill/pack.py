"""The pack stage for one shard: each split's Megatron documents packed into `seq_len` rows.

Output per split: `packed/<split>/shard-NNNNN.{tokens,cu_seqlens,row_offsets}.npy` (see
`formats/packed.py`), and stats: rows, real tokens, pad tokens.
"""

from __future__ import annotations

import time
from contextlib import ExitStack

from tokenmill import layout
from tokenmill.commits import commit, committed
from tokenmill.config import TokenmillConfig
from tokenmill.formats.megatron import MegatronReader
from tokenmill.formats.packed import SUFFIXES, write_packed
from tokenmill.packing import pack_concat
from tokenmill.storage import Store
from tokenmill.tokenize import stage_key as tokenize_key
from tokenmill.tokenizer import TokenizerInfo

STAGE = "pack"


def stage_key(config: TokenmillConfig, tokenizer: TokenizerInfo) -> str:
    return f"{tokenize_key(config, tokenizer)}-{config.section_hash('pack')}"


def pack_shard(config: TokenmillConfig, tokenized: dict, tokenizer: TokenizerInfo) -> dict:
    """Pack one tokenized shard (`tokenized` is the tokenize stage's result for it)."""
    store, shard_id = Store(config.output.path), tokenized["shard_id"]
    key = stage_key(config, tokenizer)
    if (done := committed(store, STAGE, shard_id, key)) is not None:
        return done | {"reused": True}
    started = time.perf_counter()
    pad_id = tokenizer.eod_id if config.pack.pad_id is None else config.pack.pad_id
    splits = {}
    for split, counts in tokenized["splits"].items():
        if config.pack.mode == "none" or counts["documents"] == 0:
            splits[split] = {"rows": 0, "real_tokens": 0, "pad_tokens": 0}
            continue
        source = layout.megatron_prefix(split, shard_id)
        with store.local_copies(source + ".bin", source + ".idx") as (bin_path, idx_path):
            reader = MegatronReader(source, bin_path=bin_path, idx_path=idx_path)
            packed = pack_concat(reader.tokens, reader.index.lengths, config.pack.seq_len, pad_id)
            del reader
        target = layout.packed_prefix(split, shard_id)
        with ExitStack() as stack:
            paths = {k: stack.enter_context(store.writing(target + suffix)) for k, suffix in SUFFIXES.items()}
            write_packed(paths, packed)
        splits[split] = {
            "rows": len(packed.rows),
            "real_tokens": packed.real_tokens,
            "pad_tokens": packed.pad_tokens,
        }
    result = {"shard_id": shard_id, "splits": splits, "seconds": round(time.perf_counter() - started, 3)}
    return commit(store, STAGE, shard_id, key, result) | {"reused": False}
