"""corpus_to_tokens: the main flow, DESIGN.md's DAG.

partition ─► [scatter[shard] ─► gather[shard]]          (partition.shuffle: the global document shuffle)
          ─► (sample[shard] ─► train_tokenizer | pretrained_tokenizer) ─► tokenizer_report (beside tokenize)
          ─► tokenize[shard] ─► pack[shard] ─► shuffle_index ─► validate ─► publish
"""

from __future__ import annotations

import time

from distributed import fire_and_forget
from prefect import flow, get_run_logger, unmapped
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact
from prefect.context import get_run_context
from prefect.futures import PrefectFuture

from flows.cluster import QuickExit, warm_up
from flows.runtime import task_runner_for
from tasks.pack import pack_shard
from tasks.partition import partition
from tasks.publish import publish
from tasks.sample import sample_shard
from tasks.shuffle_documents import gather_shard, scatter_shard
from tasks.shuffle_index import shuffle_index
from tasks.tokenize import choose_encoder, tokenize_shard
from tasks.tokenizer_report import tokenizer_report
from tasks.train_tokenizer import pretrained_tokenizer, train_tokenizer
from tasks.validate import validate
from tokenmill.config import TokenmillConfig
from tokenmill.pack import skipped, writes_files, writes_packed
from tokenmill.runs import save_run_config
from tokenmill.sampling import fractions as sample_fractions
from tokenmill.shuffle_documents import check_counts, shuffled_shards


def shuffle(config: TokenmillConfig, plan: dict) -> tuple[list[dict], float]:
    """The global document shuffle: the shards tokenize reads instead of the input shards."""
    started = time.perf_counter()
    sources, n_outputs = plan["shards"], plan["shuffled_shards"]
    source_ids, targets = [s["shard_id"] for s in sources], list(range(n_outputs))
    scattered = map_shards("scatter", scatter_shard, sources, source_ids, config, n_outputs=n_outputs)
    gathered = map_shards("gather", gather_shard, targets, targets, config, n_sources=len(sources))
    check_counts(scattered, gathered)
    return shuffled_shards(config, gathered), time.perf_counter() - started


def batches(items: list, size: int) -> list[list]:
    return [items[start : start + size] for start in range(0, len(items), size)]


def tokenize_and_pack(
    config: TokenmillConfig, shards: list[dict], tokenizer, encoder=None
) -> tuple[list[dict], list[dict]]:
    """tokenize[shard] then pack[shard], each shard's pack starting as soon as its tokenize ends (no pack
    tasks when there is nothing to pack); shards go in batches of `dask.shards_per_batch` so that no flow run
    holds more mapped tasks than Prefect handles well."""
    tokenized, packed = [], []
    packs = writes_files(config)
    for batch in batches(shards, config.dask.shards_per_batch):
        ids = [s["shard_id"] for s in batch]
        tokenize_futures = tokenize_shard.map(unmapped(config), batch, unmapped(tokenizer), unmapped(encoder))
        pack_futures = pack_shard.map(unmapped(config), tokenize_futures, unmapped(tokenizer)) if packs else []
        tokenized += results_of("tokenize", tokenize_futures, ids)
        if packs:
            packed += results_of("pack", pack_futures, ids)
    stage_artifact("tokenize", tokenized)
    if not packs:
        return tokenized, [skipped(r) for r in tokenized]
    stage_artifact("pack", packed)
    return tokenized, packed


def map_shards(stage: str, task, items: list, ids: list[int], config: TokenmillConfig, **shared) -> list[dict]:
    """`task` mapped over `items` (one per shard), in batches of `dask.shards_per_batch`; raises naming
    every shard that failed."""
    results = []
    for batch, batch_ids in zip(
        batches(items, config.dask.shards_per_batch), batches(ids, config.dask.shards_per_batch), strict=True
    ):
        kwargs = {name: unmapped(value) for name, value in shared.items()}
        results += results_of(stage, task.map(unmapped(config), batch, **kwargs), batch_ids)
    stage_artifact(stage, results)
    return results


def prepare_cluster() -> None:
    """Log the Dask dashboard's address (and leave it as a link artifact on the run), make the workers quick
    to exit (`QuickExit`), and have every worker import the shard tasks and encoders now, while this process
    partitions and chooses the encoder: a fresh worker spends about 2 s importing them when its first shard
    arrives."""
    client = getattr(get_run_context().task_runner, "client", None)
    if client is None:
        return
    client.register_plugin(QuickExit())
    for worker in client.scheduler_info()["workers"]:  # not awaited: the flow has other work meanwhile
        fire_and_forget(client.submit(warm_up, workers=[worker], pure=False))
    link = client.dashboard_link
    get_run_logger().info("Dask dashboard: %s", link)
    create_link_artifact(link, link_text="Dask dashboard", key="dask-dashboard", description="Watch the shards")


class ShardsFailed(RuntimeError):
    """Some shards did not complete; their committed siblings are reused when the run is retried."""


def results_of(stage: str, futures: list[PrefectFuture], shard_ids: list[int]) -> list[dict]:
    """Wait for every shard of a stage; raise naming each shard that failed (a flow must not end
    Completed with failed shards, which Prefect allows when their states are not returned)."""
    for future in futures:
        future.wait()
    failed = {sid: f.state for sid, f in zip(shard_ids, futures, strict=True) if not f.state.is_completed()}
    if failed:
        lines = [f"  shard {sid:05d}: {state.name}: {state.message}" for sid, state in sorted(failed.items())]
        raise ShardsFailed(f"{stage}: {len(failed)} of {len(futures)} shards failed\n" + "\n".join(lines))
    return [f.result() for f in futures]


def stage_artifact(stage: str, results: list[dict]) -> None:
    """A table artifact per stage in the Prefect UI: one row per shard, its counts and speed."""
    rows = []
    for r in results:
        row = {k: v for k, v in r.items() if isinstance(v, int | float | str | bool)}
        splits = r.get("splits", {}).values()
        if any("tokens" in s for s in splits):
            row["tokens"] = sum(s["tokens"] for s in splits)
        if r.get("bytes_in") and r.get("seconds"):
            row["mb_per_s"] = round(r["bytes_in"] / 1e6 / r["seconds"], 2)
        rows.append(row)
    reused = sum(bool(r.get("reused")) for r in results)
    create_table_artifact(
        rows, key=f"{stage}-shards", description=f"{stage}: {len(results)} shards done, {reused} reused"
    )


@flow(name="corpus-to-tokens", validate_parameters=True)
def corpus_to_tokens(config: TokenmillConfig) -> dict:
    """Tokenize, pack, validate and publish a corpus as one dataset (see the README for the config).

    The DAG runs in the `build-dataset` subflow on the Dask cluster that `config.dask` names, so a
    deployment's runs (which import this flow afresh) choose their cluster by parameter, as the CLI's do.
    """
    return build_dataset.with_options(task_runner=task_runner_for(config.dask))(config)


@flow(name="build-dataset", flow_run_name="{config.name}")
def build_dataset(config: TokenmillConfig) -> dict:
    """The DAG of DESIGN.md, on the task runner it was given."""
    logger = get_run_logger()
    started = time.perf_counter()
    prepare_cluster()
    save_run_config(config)
    plan = partition(config)
    shards = plan["shards"]
    shard_ids = [s["shard_id"] for s in shards]
    logger.info("planned %d shards over %d input files", len(shards), len(plan["files"]))
    shuffle_seconds = None
    if config.partition.shuffle:
        shards, shuffle_seconds = shuffle(config, plan)
        shard_ids = [s["shard_id"] for s in shards]
        plan = {**plan, "shards": shards}
        logger.info("shuffled all documents into %d shards in %.1f s", len(shards), shuffle_seconds)

    samples = []
    if config.tokenizer.train is not None or config.fertility.enabled:
        train_fraction, holdout_fraction = sample_fractions(config, plan)
        samples = map_shards("sample", sample_shard, shards, shard_ids, config,
                             train_fraction=train_fraction, holdout_fraction=holdout_fraction)  # fmt: skip
    if config.tokenizer.train is not None:
        tokenizer = train_tokenizer(config, samples)
    else:
        tokenizer = pretrained_tokenizer(config)
    logger.info("tokenizer: vocab %d, EOD id %d, BOS id %s", tokenizer.vocab_size, tokenizer.eod_id, tokenizer.bos_id)
    # The report needs only the tokenizer and the held-out sample: it runs while the shards are tokenized.
    report = tokenizer_report.submit(config, tokenizer, samples) if config.fertility.enabled else None

    encoder = choose_encoder(config, shards, tokenizer)  # once per run; shards get the small choice
    tokenize_started = time.perf_counter()
    tokenized, packed = tokenize_and_pack(config, shards, tokenizer, encoder)
    tokenize_seconds = time.perf_counter() - tokenize_started
    reused = sum(r["reused"] for r in tokenized)
    if reused:
        logger.info("reused %d of %d committed tokenize shards", reused, len(tokenized))

    if writes_packed(config):
        shuffle_index(config, packed)
    stats = validate(config, plan, tokenizer, tokenized, packed)
    if report is not None:
        create_markdown_artifact(report.result(), key="tokenizer-report", description="Tokenizer fertility")
    bytes_in = sum(r["bytes_in"] for r in tokenized)
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
        "shards_reused": reused,
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
