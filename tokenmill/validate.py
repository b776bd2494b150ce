"""The validate stage: nothing is published unless every count reconciles and every file is sound.

Two layers: a pandera schema over the per-shard stats table (one row per shard and split) with the
cross-row checks (documents in = documents out + rejected per shard, every planned shard exactly
once, packed tokens = tokenized tokens), then the files themselves (headers, sizes, EOD, padding).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pandera.pandas as pa

from tokenmill import layout
from tokenmill.config import TokenmillConfig
from tokenmill.formats.megatron import CorruptIndex, MegatronReader, token_dtype
from tokenmill.formats.packed import SUFFIXES, PackedReader
from tokenmill.storage import Store
from tokenmill.tokenizer import TokenizerInfo

COLUMNS = ["shard_id", "split", "documents_in", "rejected", "documents", "tokens", "max_token_id",
           "packed_rows", "packed_real_tokens", "packed_pad_tokens"]  # fmt: skip


class ValidationFailed(Exception):
    """The dataset is not sound; the message is the readable report."""


def stats_table(tokenized: list[dict], packed: list[dict]) -> pd.DataFrame:
    """One row per shard and split, from the tokenize and pack stages' results."""
    packing = {(p["shard_id"], split): s for p in packed for split, s in p["splits"].items()}
    rows = []
    for t in tokenized:
        for split, c in t["splits"].items():
            p = packing.get((t["shard_id"], split), {"rows": -1, "real_tokens": -1, "pad_tokens": -1})
            rows.append(
                [
                    t["shard_id"],
                    split,
                    t["documents_in"],
                    t["rejected"],
                    c["documents"],
                    c["tokens"],
                    c["max_token_id"],
                    p["rows"],
                    p["real_tokens"],
                    p["pad_tokens"],
                ]  # fmt: skip
            )
    return pd.DataFrame(rows, columns=COLUMNS).sort_values(["shard_id", "split"], ignore_index=True)


def stats_schema(n_shards: int, splits: list[str], vocab_size: int, packing: bool) -> pa.DataFrameSchema:
    def per_shard_reconciles(df: pd.DataFrame) -> pd.Series:
        g = df.groupby("shard_id")
        balance = (
            g["documents_in"].transform("first") - g["documents"].transform("sum") - g["rejected"].transform("first")
        )
        return balance == 0

    def every_shard_and_split_once(df: pd.DataFrame) -> bool:
        expected = {(s, sp) for s in range(n_shards) for sp in splits}
        return len(df) == len(expected) and set(zip(df.shard_id, df.split, strict=True)) == expected

    def packed_tokens_match(df: pd.DataFrame) -> pd.Series:
        return df.packed_real_tokens == (df.tokens if packing else 0)

    nonneg = pa.Check.ge(0)
    return pa.DataFrameSchema(
        {
            "shard_id": pa.Column(int, pa.Check.in_range(0, max(n_shards - 1, 0))),
            "split": pa.Column(str, pa.Check.isin(splits)),
            "documents_in": pa.Column(int, nonneg),
            "rejected": pa.Column(int, nonneg),
            "documents": pa.Column(int, nonneg),
            "tokens": pa.Column(int, pa.Check.ge(0)),
            "max_token_id": pa.Column(int, pa.Check.lt(vocab_size, error=f"token id >= vocab size {vocab_size}")),
            "packed_rows": pa.Column(int, nonneg),
            "packed_real_tokens": pa.Column(int, nonneg),
            "packed_pad_tokens": pa.Column(int, nonneg),
        },
        checks=[
            pa.Check(per_shard_reconciles, error="documents_in != documents out + rejected"),
            pa.Check(every_shard_and_split_once, error="a planned shard is missing or duplicated"),
            pa.Check(packed_tokens_match, error="packed real tokens != tokenized tokens"),
        ],
        strict=True,
        ordered=True,
    )


def _check_megatron(store: Store, row, dtype: np.dtype, eod_id: int | None) -> list[str]:
    prefix = layout.megatron_prefix(row.split, row.shard_id)
    files = [prefix + ".bin", prefix + ".idx"]
    if row.documents == 0:
        return [f"{prefix}.bin: exists but stats say its split has no documents"] if store.exists(files[0]) else []
    if missing := [f for f in files if not store.exists(f)]:
        return [f"{m}: missing" for m in missing]
    with store.local_copies(*files) as (bin_path, idx_path):
        try:
            reader = MegatronReader(prefix, bin_path=bin_path, idx_path=idx_path)
        except CorruptIndex as e:
            return [str(e).replace(str(idx_path), prefix + ".idx")]
        index = reader.index
        if index.dtype != dtype:
            return [f"{prefix}.idx: dtype {index.dtype}, expected {dtype}"]
        if len(index) != row.documents:
            return [f"{prefix}.idx: {len(index)} sequences, stats say {row.documents} documents"]
        if int(index.lengths.sum(dtype=np.int64)) != row.tokens or len(reader.tokens) != row.tokens:
            return [f"{prefix}.bin: {len(reader.tokens)} tokens, index says {index.lengths.sum()}, stats {row.tokens}"]
        if not np.array_equal(index.document_indices, np.arange(len(index) + 1)):
            return [f"{prefix}.idx: document indices are not 0..{len(index)}"]
        if not np.array_equal(index.pointers[1:], np.cumsum(index.lengths[:-1], dtype=np.int64) * dtype.itemsize):
            return [f"{prefix}.idx: pointers disagree with lengths"]
        if eod_id is not None:
            last = reader.tokens[index.pointers // dtype.itemsize + index.lengths - 1]
            if bad := int((last != eod_id).sum()):
                return [f"{prefix}.bin: {bad} documents do not end with EOD id {eod_id}"]
    return []


def _check_packed(store: Store, row, seq_len: int, pad_id: int) -> list[str]:
    prefix = layout.packed_prefix(row.split, row.shard_id)
    files = [prefix + s for s in SUFFIXES.values()]
    if row.packed_rows == 0:
        return []
    if missing := [f for f in files if not store.exists(f)]:
        return [f"{m}: missing" for m in missing]
    with store.local_copies(*files) as paths:
        packed = PackedReader(prefix, paths=paths)
        rows, offsets = packed.rows, np.asarray(packed.row_offsets)
        cu = np.asarray(packed.cu_seqlens, dtype=np.int64)
        if rows.shape != (row.packed_rows, seq_len):
            return [f"{prefix}.tokens.npy: shape {rows.shape}, expected ({row.packed_rows}, {seq_len})"]
        if len(offsets) != len(rows) + 1 or offsets[0] != 0 or offsets[-1] != len(cu):
            return [f"{prefix}.row_offsets.npy: does not index {prefix}.cu_seqlens.npy"]
        # Within a row boundaries start at 0 and strictly increase up to at most seq_len.
        rising = np.diff(cu) > 0
        rising[offsets[1:-1] - 1] = True  # the step from one row's end to the next row's 0
        if np.any(cu[offsets[:-1]] != 0) or not rising.all() or cu.max(initial=0) > seq_len:
            return [f"{prefix}.cu_seqlens.npy: boundaries do not rise from 0 to at most {seq_len} in every row"]
        real = cu[offsets[1:] - 1]
        if int(real.sum()) != row.packed_real_tokens or rows.size - int(real.sum()) != row.packed_pad_tokens:
            return [f"{prefix}.cu_seqlens.npy: {real.sum()} real tokens, stats say {row.packed_real_tokens}"]
        is_pad = np.arange(seq_len)[None, :] >= real[:, None]
        if not np.all(np.asarray(rows)[is_pad] == pad_id):
            return [f"{prefix}.tokens.npy: tokens other than pad id {pad_id} after the real tokens"]
    return []


def validate(
    config: TokenmillConfig, plan: dict, tokenizer: TokenizerInfo, tokenized: list[dict], packed: list[dict]
) -> pd.DataFrame:
    """Check stats and files; write `stats.json` and return the table, or raise ValidationFailed."""
    table = stats_table(tokenized, packed)
    packing = config.pack.mode != "none"
    schema = stats_schema(len(plan["shards"]), list(config.split), tokenizer.vocab_size, packing)
    try:
        schema.validate(table, lazy=True)
    except pa.errors.SchemaErrors as e:
        raise ValidationFailed(f"stats table failed validation:\n{_failure_report(e, table)}") from None
    store = Store(config.output.path)
    dtype = token_dtype(tokenizer.vocab_size)
    eod_id = tokenizer.eod_id if config.tokenizer.append_eod else None
    pad_id = tokenizer.eod_id if config.pack.pad_id is None else config.pack.pad_id
    problems = []
    for row in table.itertuples():
        problems += _check_megatron(store, row, dtype, eod_id)
        if packing:
            problems += _check_packed(store, row, config.pack.seq_len, pad_id)
    if problems:
        raise ValidationFailed("dataset files failed validation:\n" + "\n".join(f"  - {p}" for p in problems))
    store.write_json(layout.STATS, table.to_dict(orient="records"))
    return table


def _failure_report(error: pa.errors.SchemaErrors, table: pd.DataFrame) -> str:
    """One line per failed check, naming the shards and splits (not pandera's cell-by-cell dump)."""
    lines = []
    for check, cases in error.failure_cases.groupby("check", sort=False):
        rows = sorted({int(i) for i in cases["index"].dropna()})
        where = ", ".join(f"shard {table.shard_id[i]:05d}/{table.split[i]}" for i in rows[:10])
        if len(rows) > 10:
            where += f" and {len(rows) - 10} more"
        lines.append(f"  - {check}" + (f": {where}" if where else ""))
    return "\n".join(lines)
