"""tokenize[shards]: each shard to Megatron `.bin/.idx` per split, plus rejects and counts, then (when there is
something to pack) its pack, then validate's check of its files against its counts, chained on the cluster; the
run's encoder choice, made once before any shard (verified on a sample across shards); and, after the shards, the
line numbers of documents and rejects in pieces whose first line was not counted."""

from __future__ import annotations

import time
from dataclasses import dataclass, fields

import pandas as pd
from prefect import get_run_logger, task

from tasks import UNCACHED
from tasks.shards import GROUP_TASK, Stage, group_label, on_a_worker, run_on_dask, shard_id
from tokenmill.config import TokenmillConfig
from tokenmill.core import layout, packers, stats
from tokenmill.core.stats import Packed, StatsColumns, Tokenized, stats_rows
from tokenmill.stages import tokenize
from tokenmill.tokenizers.encoders import EncoderChoice
from tokenmill.tokenizers.tokenizer_info import TokenizerInfo


@task(name="choose_encoder", **UNCACHED)
def choose_run_encoder(config: TokenmillConfig, shards: list[dict], tokenizer: TokenizerInfo) -> EncoderChoice:
    """Made on a worker, whose encoders are loaded (tokenmill.stages.tokenize.preload_encoder), ahead of the sample
    stage's shards (every shard waits for the choice). It is sent only the shards it reads: the whole plan was
    an 11 MB task at 98,176 shards, which Dask warned about on the terminal."""
    started = time.perf_counter()
    shards = tokenize.verification_shards(shards)
    bounds = "Its memory is bounded by tokenizer.verify_bytes and tokenizer.reference_piece_bytes"
    choice = on_a_worker(tokenize.choose_run_encoder, config, shards, tokenizer, priority=1, bounded_by=bounds)
    get_run_logger().info(
        "encoder: %s %s: %s (%.1f s)", choice.backend, choice.version, choice.reason, time.perf_counter() - started
    )
    return choice


@dataclass(frozen=True)
class TokenizeTotals:
    """The tokenize stage's totals, of a group of shards or summed over the stage: what the flow logs and reports
    and hands on, beside the stats table."""

    bytes_in: int = 0
    bytes_made: int = 0  # of the shards tokenized in this run (not reused)
    reused: int = 0  # shards whose committed output was reused
    redone: tuple[str, ...] = ()  # shards whose committed files had changed since (tokenmill.core.commits), and what
    files_rejected: tuple[str, ...] = ()  # input files quarantined whole (input.on_invalid: quarantine), and why
    problems: tuple[str, ...] = ()  # what each shard's check found wrong in its files, for validate
    unnumbered: tuple[int, ...] = ()  # shards whose documents and rejects are yet to be numbered by line (number_lines)
    seconds: float = 0.0  # the stage's wall time, as the flow measured it (0 in a group's)

    def __add__(self, other: TokenizeTotals) -> TokenizeTotals:
        return TokenizeTotals(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


class Kept:
    """What a group keeps of its shards' tokenize, pack and check results until it ends (`run_on_dask`'s `keep`,
    called with each shard's): their stats rows as columns (`StatsColumns`, about 0.2 KB a shard; a tuple per row
    and a tuple per shard were 0.9 KB a shard), what the checks found wrong, and the group's totals."""

    def __init__(self):
        self.rows = StatsColumns()
        self.reused = self.bytes_in = self.fresh_bytes = 0
        self.fresh_seconds = 0.0
        self.redone: list[tuple[int, str]] = []  # (shard id, what changed in its committed files)
        self.files_rejected: list[tuple[int, str]] = []  # (shard id, a whole file quarantined and why)
        self.problems: list[tuple[int, str]] = []  # (shard id, what validate's check found wrong in its files)
        self.unnumbered: list[int] = []  # shards whose lines are not yet numbered by their line in the file

    def __call__(self, results: tuple[Tokenized, *tuple[Packed, ...], list[str]]) -> None:
        *made, problems = results
        tokenized, shard = made[0], made[0].shard_id
        self.rows.add(stats_rows(tokenized, made[1] if len(made) > 1 else stats.skipped(tokenized)))
        self.redone += [(shard, r.redone) for r in made if r.redone]
        self.problems += [(shard, p) for p in problems]
        if tokenized.unnumbered_rejects or tokenized.unnumbered_lines:
            self.unnumbered.append(shard)
        self.files_rejected += [(shard, f"{why} ({layout.rejects_file(shard)})") for why in tokenized.files_rejected]
        self.bytes_in += tokenized.bytes_in
        if tokenized.reused:
            self.reused += 1
        else:
            self.fresh_bytes += tokenized.bytes_in
            self.fresh_seconds += tokenized.seconds

    def totals(self) -> TokenizeTotals:
        return TokenizeTotals(
            self.bytes_in, self.fresh_bytes, self.reused, *(tuple(said for _, said in sorted(found)) for found in
            (self.redone, self.files_rejected, self.problems)), tuple(sorted(self.unnumbered)),
        )  # fmt: skip


@task(name="tokenize", **GROUP_TASK)
def tokenize_shards(
    config: TokenmillConfig, items: list[dict], tokenizer: TokenizerInfo, encoder: EncoderChoice | None
) -> tuple[pd.DataFrame, dict, TokenizeTotals]:
    """The group's stats table (a row per shard and split), its row of the stage's table artifact and its totals:
    the flow keeps no per-shard objects. Each shard's files are checked as its last step, while they are fresh
    (`check_written`): validate gets what was found."""
    stages = [Stage.of("tokenize", config, tokenizer, encoder)]
    if packers.writes_files(config):
        stages.append(Stage.of("pack", config, tokenizer))
    stages.append(Stage.of("check", config, tokenizer))
    kept = Kept()
    run_on_dask(items, stages, keep=kept)
    table = kept.rows.table()
    row = {
        "shards": group_label([shard_id(i) for i in items]),
        "reused": kept.reused,
        "documents": int(table.groupby("shard_id").documents_in.first().sum()),
        "rejected": int(table.groupby("shard_id").rejected.first().sum()),
        "tokens": int(table.tokens.sum()),
        "packed_rows": int(table.packed_rows.sum()),
        "bytes_in": kept.bytes_in,
        "tokenize_mb_per_s": round(kept.fresh_bytes / 1e6 / kept.fresh_seconds, 2) if kept.fresh_seconds else None,
    }
    return table, row, kept.totals()


@task(name="number_lines", **UNCACHED)
def number_lines(config: TokenmillConfig, shards: list[dict], unnumbered: list[int]) -> None:
    """The documents and rejects of pieces whose first line the partition did not count, numbered by their line in
    the file once every piece before them is tokenized (`tokenize.number_lines`)."""
    tokenize.number_lines(config, shards, unnumbered)
    get_run_logger().info("numbered the documents and rejects of %d shards by their line in the file", len(unnumbered))
