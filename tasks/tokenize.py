"""tokenize[shards]: each shard to Megatron `.bin/.idx` per split, plus rejects and counts, then (when there is
something to pack) its pack, then validate's check of its files against its counts, chained on the cluster; the
run's encoder choice, made once before any shard (verified on a sample across shards); and, after the shards, the
line numbers of rejects in pieces whose first line was not counted."""

import time

import pandas as pd
from prefect import get_run_logger, task

from tasks import UNCACHED
from tasks.shards import GROUP_TASK, Stage, group_label, on_a_worker, run_on_dask, shard_id
from tokenmill import layout, pack, packers, stats, tokenize
from tokenmill.config import TokenmillConfig
from tokenmill.encoders import EncoderChoice
from tokenmill.stats import StatsColumns, stats_rows
from tokenmill.tokenizer_info import TokenizerInfo
from tokenmill.validate import check_written


@task(name="choose_encoder", **UNCACHED)
def choose_run_encoder(config: TokenmillConfig, shards: list[dict], tokenizer: TokenizerInfo) -> EncoderChoice:
    """Made on a worker, whose encoders are loaded (tokenmill.tokenize.preload_encoder), ahead of the sample
    stage's shards (every shard waits for the choice). It is sent only the shards it reads: the whole plan was
    an 11 MB task at 98,176 shards, which Dask warned about on the terminal."""
    started = time.perf_counter()
    shards = tokenize.verification_shards(shards)
    choice = on_a_worker(tokenize.choose_run_encoder, config, shards, tokenizer, priority=1)
    get_run_logger().info(
        "encoder: %s %s: %s (%.1f s)", choice.backend, choice.version, choice.reason, time.perf_counter() - started
    )
    return choice


class Kept:
    """What a group keeps of its shards' tokenize, pack and check results until it ends (`run_on_dask`'s `keep`,
    called with each shard's): their stats rows as columns (`StatsColumns`, about 0.2 KB a shard; a tuple per row
    and a tuple per shard were 0.9 KB a shard), what the checks found wrong, and the group's totals."""

    def __init__(self):
        self.rows = StatsColumns()
        self.shards = self.reused = self.bytes_in = self.fresh_bytes = 0
        self.fresh_seconds = 0.0
        self.redone: list[tuple[int, str]] = []  # (shard id, what changed in its committed files)
        self.files_rejected: list[tuple[int, str]] = []  # (shard id, a whole file quarantined and why)
        self.problems: list[tuple[int, str]] = []  # (shard id, what validate's check found wrong in its files)
        self.unnumbered: list[int] = []  # shards whose rejects are not yet numbered by their line in the file

    def __call__(self, results: tuple) -> None:
        *made, problems = results
        tokenized = made[0]
        self.rows.add(stats_rows(tokenized, made[1] if len(made) > 1 else stats.skipped(tokenized)))
        self.redone += [(tokenized["shard_id"], r["redone"]) for r in made if r.get("redone")]
        self.problems += [(tokenized["shard_id"], p) for p in problems]
        shard = tokenized["shard_id"]
        if tokenized.get("unnumbered_rejects"):
            self.unnumbered.append(shard)
        self.files_rejected += [
            (shard, f"{why} ({layout.rejects_file(shard)})") for why in tokenized.get("files_rejected", [])
        ]
        self.shards += 1
        self.bytes_in += tokenized["bytes_in"]
        if tokenized["reused"]:
            self.reused += 1
        else:
            self.fresh_bytes += tokenized["bytes_in"]
            self.fresh_seconds += tokenized["seconds"]


@task(name="tokenize", **GROUP_TASK)
def tokenize_shards(
    config: TokenmillConfig, items: list[dict], tokenizer: TokenizerInfo, encoder: EncoderChoice | None
) -> tuple[pd.DataFrame, dict]:
    """The group's stats table (a row per shard and split) and its totals: the flow keeps no per-shard objects.
    Each shard's files are checked as its last step, while they are fresh (`check_written`): validate gets what
    was found."""
    stages = [Stage("tokenize", tokenize.tokenize_shard, (tokenizer, encoder))]
    if packers.writes_files(config):
        stages.append(Stage("pack", pack.pack_shard, (tokenizer,)))
    stages.append(Stage("check", check_written, (tokenizer,), whole_chain=True))
    kept = Kept()
    run_on_dask(config, items, stages, keep=kept)
    table = kept.rows.table()
    totals = {
        "shards": group_label([shard_id(i) for i in items]),
        "reused": kept.reused,
        "documents": int(table.groupby("shard_id").documents_in.first().sum()),
        "rejected": int(table.groupby("shard_id").rejected.first().sum()),
        "tokens": int(table.tokens.sum()),
        "packed_rows": int(table.packed_rows.sum()),
        "bytes_in": kept.bytes_in,
        "tokenize_mb_per_s": round(kept.fresh_bytes / 1e6 / kept.fresh_seconds, 2) if kept.fresh_seconds else None,
        # shards whose committed files had changed since (see tokenmill.commits), each with what changed
        "redone": [reason for _, reason in sorted(kept.redone)],
        "files_rejected": [why for _, why in sorted(kept.files_rejected)],
        "problems": [problem for _, problem in sorted(kept.problems)],  # for validate
        "unnumbered": sorted(kept.unnumbered),  # for number_rejects
    }
    return table, totals


@task(name="number_rejects", **UNCACHED)
def number_rejects(config: TokenmillConfig, shards: list[dict], unnumbered: list[int]) -> None:
    """The rejects of pieces whose first line the partition did not count, numbered by their line in the file
    once every piece before them is tokenized (`tokenize.number_rejects`)."""
    tokenize.number_rejects(config, shards, unnumbered)
    get_run_logger().info("numbered the rejects of %d shards by their line in the file", len(unnumbered))
