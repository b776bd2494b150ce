"""corpus_to_tokens: the main flow, DESIGN.md's DAG.

partition ─► [scatter[shards] ─► gather[shards]]        (partition.shuffle: the global document shuffle)
          ─► (sample[shards] ─► train_tokenizer | pretrained_tokenizer) ─► tokenizer_report (beside tokenize)
          ─► tokenize[shards] ─► pack[shards] ─► shuffle_index ─► validate ─► publish

Shard stages are Prefect task runs over groups of shards whose shards run as Dask futures (tasks/shards.py);
every task runs in this flow's process, the shard work on the Dask cluster `config.dask` names.
"""

from __future__ import annotations

import time

import pandas as pd
from prefect import flow, get_run_logger
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact
from prefect.futures import PrefectFuture
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.utilities.annotations import opaque, quote

from flows.cluster import dask_client, prepare_cluster
from tasks.pack import pack_shards
from tasks.partition import partition
from tasks.publish import publish
from tasks.sample import sample_shards
from tasks.shards import ShardsFailed, group_label, group_size, in_groups, shard_id
from tasks.shuffle_documents import gather_shards, scatter_shards
from tasks.shuffle_index import shuffle_index
from tasks.tokenize import choose_encoder, tokenize_shards
from tasks.tokenizer_report import tokenizer_report
from tasks.train_tokenizer import pretrained_tokenizer, train_tokenizer
from tasks.validate import validate
from tokenmill.config import TokenmillConfig
from tokenmill.pack import skipped, writes_files, writes_packed
from tokenmill.runs import save_run_config
from tokenmill.sampling import fractions as sample_fractions
from tokenmill.shuffle_documents import check_counts, shuffled_shards
from tokenmill.validate import stats_table

GROUPS_IN_FLIGHT = 32  # group task runs at once (each waits on its shards' Dask futures in a thread)


def shuffle(config: TokenmillConfig, plan: dict) -> tuple[list[dict], float]:
    """The global document shuffle: the shards tokenize reads instead of the input shards."""
    started = time.perf_counter()
    sources, n_outputs = plan["shards"], plan["shuffled_shards"]
    scattered = map_stage(scatter_shards, config, sources, n_outputs)
    gathered = map_stage(gather_shards, config, list(range(n_outputs)), len(sources))
    check_counts(scattered, gathered)
    return shuffled_shards(config, gathered), time.perf_counter() - started


def map_stage(stage_task, config: TokenmillConfig, items: list, *shared) -> list:
    """A shard stage over every item, group by group; the results in item order, or ShardsFailed naming
    every shard that failed."""
    groups = in_groups(items, group_size(len(items)))
    futures = [stage_task.submit(config, group, *shared) for group in groups]
    outcomes = [outcome(future, group) for future, group in zip(futures, groups, strict=True)]
    if failures := {sid: error for _, failed in outcomes for sid, error in failed.items()}:
        raise ShardsFailed(stage_task.name, failures, len(items))
    return [r for results, _ in outcomes for r in results]


def outcome(future: PrefectFuture, group: quote) -> tuple[list | None, dict[int, str]]:
    """A group's results, or why each of its shards failed (a flow must not end Completed with failed
    shards, which Prefect allows when their states are not returned)."""
    future.wait()
    state = future.state
    if state.is_completed():
        return future.result(), {}
    error = state.result(raise_on_failure=False)
    if isinstance(error, ShardsFailed):
        return None, error.failures
    return None, {shard_id(item): f"{state.name}: {state.message}" for item in group.unwrap()}


def tokenize_and_pack(config: TokenmillConfig, shards: list[dict], tokenizer, encoder) -> tuple[pd.DataFrame, dict]:
    """tokenize[shards] then pack[shards], each group's pack starting as soon as its tokenize ends (no pack
    tasks when there is nothing to pack), at most GROUPS_IN_FLIGHT groups at once. Returns the stats table (a
    row per shard and split, built group by group: the flow keeps no per-shard objects) and the totals."""
    packs = writes_files(config)
    tables, rows, failures = [], [], {"tokenize": {}, "pack": {}}
    totals = {"bytes_in": 0, "reused": 0}
    pending: list[tuple[quote, PrefectFuture, PrefectFuture | None]] = []

    def collect(group: quote, tokenize_future: PrefectFuture, pack_future: PrefectFuture | None) -> None:
        tokenized, failed = outcome(tokenize_future, group)
        failures["tokenize"] |= failed
        if tokenized is None:
            return
        packed, failed = outcome(pack_future, group) if pack_future else ([skipped(r) for r in tokenized], {})
        failures["pack"] |= failed
        if packed is None:
            return
        tables.append(stats_table(tokenized, packed))
        rows.append(group_row(tokenized, packed))
        totals["bytes_in"] += sum(r["bytes_in"] for r in tokenized)
        totals["reused"] += sum(r["reused"] for r in tokenized)

    for group in in_groups(shards, group_size(len(shards))):
        if len(pending) >= GROUPS_IN_FLIGHT:
            collect(*pending.pop(0))
        tokenize_future = tokenize_shards.submit(config, group, tokenizer, encoder)
        pack_future = pack_shards.submit(config, opaque(tokenize_future), tokenizer) if packs else None
        pending.append((group, tokenize_future, pack_future))
    for futures in pending:
        collect(*futures)
    for stage, failed in failures.items():
        if failed:
            raise ShardsFailed(stage, failed, len(shards))
    shards_artifact("tokenize and pack", rows)
    return pd.concat(tables, ignore_index=True).sort_values(["shard_id", "split"], ignore_index=True), totals


def group_row(tokenized: list[dict], packed: list[dict]) -> dict:
    """A row of the stage's table artifact: one group of shards (one shard, with few shards)."""
    seconds = sum(r.get("seconds", 0) for r in tokenized if not r["reused"])
    bytes_in = sum(r["bytes_in"] for r in tokenized)
    return {
        "shards": group_label([r["shard_id"] for r in tokenized]),
        "reused": sum(r["reused"] for r in tokenized),
        "documents": sum(r["documents_in"] for r in tokenized),
        "rejected": sum(r["rejected"] for r in tokenized),
        "tokens": sum(s["tokens"] for r in tokenized for s in r["splits"].values()),
        "packed_rows": sum(s["rows"] for r in packed for s in r["splits"].values()),
        "tokenize_mb_per_s": round(bytes_in / 1e6 / seconds, 2) if seconds else None,
    }


def shards_artifact(stage: str, rows: list[dict]) -> None:
    """A table artifact in the Prefect UI: one row per group of shards, its counts and speed."""
    reused = sum(r["reused"] for r in rows)
    key, description = stage.replace(" ", "-") + "-shards", f"{stage}: {len(rows)} groups, {reused} shards reused"
    create_table_artifact(rows, key=key, description=description)


@flow(
    name="corpus-to-tokens",
    validate_parameters=True,
    task_runner=ThreadPoolTaskRunner(max_workers=2 * GROUPS_IN_FLIGHT),  # a tokenize and a pack task per group
)
def corpus_to_tokens(config: TokenmillConfig) -> dict:
    """Tokenize, pack, validate and publish a corpus as one dataset (see the README for the config), with the
    shard work on the Dask cluster that `config.dask` names (a LocalCluster when it names none)."""
    with dask_client(config.dask) as client:
        prepare_cluster(client)
        link = client.dashboard_link
        get_run_logger().info("Dask dashboard: %s", link)
        create_link_artifact(link, link_text="Dask dashboard", key="dask-dashboard", description="Watch the shards")
        return build_dataset(config)


def build_dataset(config: TokenmillConfig) -> dict:
    """The DAG of DESIGN.md."""
    logger = get_run_logger()
    started = time.perf_counter()
    save_run_config(config)
    plan = partition(config)
    shards = plan["shards"]
    logger.info("planned %d shards over %d input files", len(shards), len(plan["files"]))
    shuffle_seconds = None
    if config.partition.shuffle:
        shards, shuffle_seconds = shuffle(config, plan)
        plan = {**plan, "shards": shards}
        logger.info("shuffled all documents into %d shards in %.1f s", len(shards), shuffle_seconds)

    samples = []
    if config.tokenizer.train is not None or config.fertility.enabled:
        samples = map_stage(sample_shards, config, shards, *sample_fractions(config, plan))
    if config.tokenizer.train is not None:
        tokenizer = train_tokenizer(config, samples)
    else:
        tokenizer = pretrained_tokenizer(config)
    logger.info("tokenizer: vocab %d, EOD id %d, BOS id %s", tokenizer.vocab_size, tokenizer.eod_id, tokenizer.bos_id)
    # The report needs only the tokenizer and the held-out sample: it runs while the shards are tokenized.
    report = tokenizer_report.submit(config, tokenizer, samples) if config.fertility.enabled else None

    encoder = choose_encoder(config, shards, tokenizer)  # once per run; shards get the small choice
    tokenize_started = time.perf_counter()
    table, totals = tokenize_and_pack(config, shards, tokenizer, encoder)
    tokenize_seconds = time.perf_counter() - tokenize_started
    if totals["reused"]:
        logger.info("reused %d of %d committed tokenize shards", totals["reused"], len(shards))

    if writes_packed(config):
        shuffle_index(config, table)
    stats = validate(config, plan, tokenizer, table)
    if report is not None:
        create_markdown_artifact(report.result(), key="tokenizer-report", description="Tokenizer fertility")
    bytes_in = totals["bytes_in"]
    run = {
        "bytes_in": bytes_in,
        "tokenize_mb_per_s": round(bytes_in / 1e6 / tokenize_seconds, 2),
        "tokenize_seconds": round(tokenize_seconds, 2),
        "shuffle_seconds": None if shuffle_seconds is None else round(shuffle_seconds, 2),
        "flow_seconds": round(time.perf_counter() - started, 2),
    }
    published = publish(config, tokenizer, stats, run)
    manifest = published["manifest"]
    summary = {
        "output": config.output.path,
        "published": published["published"],
        "shards": len(shards),
        "shards_reused": totals["reused"],
        **manifest["counts"],
        "splits": manifest["splits"],
        "packing": manifest["packing"],
        **run,
    }
    logger.info(
        "published %s (%d files copied, %d already there): %d documents in, %d tokenized, %d rejected, "
        "%d tokens, %d shards in %.1f s",
        published["published"]["url"], published["published"]["copied"], published["published"]["skipped"],
        summary["documents_in"], summary["documents_out"], summary["documents_rejected"], summary["tokens"],
        len(shards), summary["flow_seconds"],
    )  # fmt: skip
    create_markdown_artifact(published["report"], key="tokenmill-summary", description="Run summary")
    return summary
