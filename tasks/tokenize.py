"""tokenize[shards]: each shard to Megatron `.bin/.idx` per split, plus rejects and counts, then (when there is
something to pack) its pack, chained on the cluster; and the run's encoder choice, made once before any shard
(verified on a sample across shards)."""

import time
from typing import NamedTuple

import pandas as pd
from prefect import get_run_logger, task

from tasks import UNCACHED
from tasks.shards import GROUP_TASK, Stage, group_label, on_a_worker, run_on_dask, shard_id
from tokenmill import pack, tokenize
from tokenmill.config import TokenmillConfig
from tokenmill.encoders import EncoderChoice
from tokenmill.tokenizer import TokenizerInfo
from tokenmill.validate import stats_rows, table_of


@task(name="choose_encoder", **UNCACHED)
def choose_encoder(config: TokenmillConfig, shards: list[dict], tokenizer: TokenizerInfo) -> EncoderChoice:
    """Made on a worker, whose encoders are loaded (tokenmill.tokenize.preload_encoder), ahead of the sample
    stage's shards (every shard waits for the choice)."""
    started = time.perf_counter()
    choice = on_a_worker(tokenize.choose_run_encoder, config, shards, tokenizer, priority=1)
    get_run_logger().info(
        "encoder: %s %s: %s (%.1f s)", choice.backend, choice.version, choice.reason, time.perf_counter() - started
    )
    return choice


class Kept(NamedTuple):
    """What a group keeps of a shard's tokenize and pack results (a few KB) until it ends."""

    rows: list[tuple]  # its rows of the stats table
    reused: bool
    bytes_in: int
    seconds: float
    redone: tuple[str, ...]


def kept(results: tuple) -> Kept:
    tokenized = results[0]
    rows = stats_rows(tokenized, results[1] if len(results) > 1 else pack.skipped(tokenized))
    redone = tuple(r["redone"] for r in results if r.get("redone"))
    return Kept(rows, tokenized["reused"], tokenized["bytes_in"], tokenized["seconds"], redone)


@task(name="tokenize", **GROUP_TASK)
def tokenize_shards(
    config: TokenmillConfig, items: list[dict], tokenizer: TokenizerInfo, encoder: EncoderChoice | None
) -> tuple[pd.DataFrame, dict]:
    """The group's stats table (a row per shard and split) and its totals: the flow keeps no per-shard objects."""
    stages = [Stage("tokenize", tokenize.tokenize_shard, (tokenizer, encoder))]
    if pack.writes_files(config):
        stages.append(Stage("pack", pack.pack_shard, (tokenizer,)))
    results = run_on_dask(config, items, stages, keep=kept)
    table = table_of([row for r in results for row in r.rows])
    fresh = [r for r in results if not r.reused]
    fresh_bytes, fresh_seconds = sum(r.bytes_in for r in fresh), sum(r.seconds for r in fresh)
    totals = {
        "shards": group_label([shard_id(i) for i in items]),
        "reused": len(results) - len(fresh),
        "documents": int(table.groupby("shard_id").documents_in.first().sum()),
        "rejected": int(table.groupby("shard_id").rejected.first().sum()),
        "tokens": int(table.tokens.sum()),
        "packed_rows": int(table.packed_rows.sum()),
        "bytes_in": sum(r.bytes_in for r in results),
        "tokenize_mb_per_s": round(fresh_bytes / 1e6 / fresh_seconds, 2) if fresh_seconds else None,
        # shards whose committed files had changed since (see tokenmill.commits), each with what changed
        "redone": [reason for r in results for reason in r.redone],
    }
    return table, totals
