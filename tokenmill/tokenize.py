"""The tokenize stage for one shard: read documents, assign each to its split, encode, write Megatron files.

Output per split: `megatron/<split>/shard-NNNNN.bin/.idx` (one sequence per document, EOD included),
written only for splits that received documents; `rejects/shard-NNNNN.jsonl` for records that are
not documents. The commit marker written last holds the shard's counts.
"""

from __future__ import annotations

import time
from contextlib import ExitStack

import numpy as np
import orjson

from tokenmill import __version__, layout
from tokenmill.commits import commit, committed
from tokenmill.config import TokenmillConfig
from tokenmill.formats.megatron import BinWriter, token_dtype, write_index
from tokenmill.hashing import assign_splits
from tokenmill.partition import shard_pieces
from tokenmill.readers import read_documents
from tokenmill.storage import Store
from tokenmill.tokenizer import TokenizerInfo, encode, load_tokenizer

STAGE = "tokenize"


def stage_key(config: TokenmillConfig, tokenizer: TokenizerInfo) -> str:
    return f"{config.section_hash('input', 'partition', 'split', 'tokenizer')}-{tokenizer.sha256[:16]}-{__version__}"


def tokenize_shard(config: TokenmillConfig, shard: dict, tokenizer: TokenizerInfo) -> dict:
    """Tokenize one shard of the plan (or return its committed result)."""
    store, shard_id = Store(config.output.path), shard["shard_id"]
    key = stage_key(config, tokenizer)
    if (done := committed(store, STAGE, shard_id, key)) is not None:
        return done | {"reused": True}

    started = time.perf_counter()
    tok = load_tokenizer(store.url_of(layout.TOKENIZER), tokenizer.sha256)
    eod_id = tokenizer.eod_id if config.tokenizer.append_eod else None
    bos_id = tokenizer.bos_id if config.tokenizer.prepend_bos else None
    dtype = token_dtype(tokenizer.vocab_size)
    splits = list(config.split)
    counts = {s: {"documents": 0, "tokens": 0, "max_token_id": -1} for s in splits}
    documents_in = bytes_in = 0
    rejects: list[bytes] = []
    with ExitStack() as stack:
        writers: dict[str, tuple[BinWriter, object]] = {}
        for batch, batch_rejects in read_documents(shard_pieces(shard), config.input.read_options()):
            documents_in += len(batch) + len(batch_rejects)
            bytes_in += batch.nbytes
            rejects.extend(orjson.dumps(r.to_dict()) + b"\n" for r in batch_rejects)
            if not len(batch):
                continue
            flat, lengths = encode(tok, batch.texts, eod_id, bos_id)
            doc_split = assign_splits(batch.ids, config.split)
            token_split = np.repeat(doc_split, lengths)
            for index, split in enumerate(splits):
                chosen = doc_split == index
                if not chosen.any():
                    continue
                if split not in writers:
                    tmp = stack.enter_context(store.writing(layout.megatron_prefix(split, shard_id) + ".bin"))
                    writers[split] = (BinWriter(stack.enter_context(open(tmp, "wb")), dtype), tmp)
                split_tokens = flat[token_split == index]
                writers[split][0].add(split_tokens, lengths[chosen])
                c = counts[split]
                c["documents"] += int(chosen.sum())
                c["tokens"] += len(split_tokens)
                c["max_token_id"] = max(c["max_token_id"], int(split_tokens.max()))
        bin_writers = {split: w for split, (w, _) in writers.items()}
    # The .bin files are committed; now their indexes, then the rejects, then the marker.
    for split, writer in bin_writers.items():
        with store.writing(layout.megatron_prefix(split, shard_id) + ".idx") as tmp:
            write_index(tmp, writer.all_lengths(), dtype)
    if rejects:
        store.write_bytes(layout.rejects_file(shard_id), b"".join(rejects))
    else:
        store.remove(layout.rejects_file(shard_id))
    result = {
        "shard_id": shard_id,
        "documents_in": documents_in,
        "rejected": len(rejects),
        "bytes_in": bytes_in,
        "splits": counts,
        "seconds": round(time.perf_counter() - started, 3),
    }
    return commit(store, STAGE, shard_id, key, result) | {"reused": False}
