"""corpus_to_tokens: the main flow, the DAG of docs/architecture.md.

pretrained_tokenizer (then its encoders loaded on every worker)  ║  partition   (side by side)
partition ─► [scatter[shards] ─► gather[shards]]        (partition.shuffle: the global document shuffle)
          ─► (sample[shards] ─► train_tokenizer | the pretrained tokenizer) ─► already_published ─► (done)
          ─► [sample[shards]] ─► tokenizer_report (beside tokenize)
          ─► tokenize[shards] (each shard's pack and check chained to it) ─► (number_lines)
          ─► split_indexes ─► validate ─► publish
                  (mix, beside validate) ─┘

A run over the input and config that an already published version was made from stops at already_published.

Shard stages are Prefect task runs over groups of shards whose shards run as Dask futures (tasks/shards.py).
Every task runs in this flow's process; the shard work runs on the Dask cluster that `config.dask` names.
"""

# No `from __future__ import annotations`: `tokenmill serve` hands its runs this flow pickled by value, whose
# parameters are validated against their annotations, which must then be the classes, not their names
import functools
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace

import pandas as pd
import prefect.flows
from distributed import default_client
from prefect import Flow, get_run_logger
from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_table_artifact,
)
from prefect.futures import PrefectFuture
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.utilities.annotations import quote
from prefect.utilities.callables import ParameterSchema, parameter_schema
from pydantic import ByteSize
from pydantic.json_schema import SkipJsonSchema

from flows.cluster import (
    checking_worker,
    dask_client,
    drawing_worker,
    kind,
    largest_process,
    on_every_worker,
    prepare_cluster,
    workers_now,
)
from flows.server import retry_refused_connections
from flows.summary import published_summary, restarts_said, unchanged_summary
from tasks.mix import resolve_mix
from tasks.partition import partition
from tasks.publish import already_published, publish
from tasks.sample import holdout_shards, sample_shards
from tasks.shards import StageRun, map_shards, on_a_worker, stage_groups
from tasks.shuffle_documents import gather_shards, scatter_shards
from tasks.split_indexes import split_indexes
from tasks.tokenize import TokenizeTotals, choose_run_encoder, number_lines, tokenize_shards
from tasks.tokenizer_report import tokenizer_report
from tasks.train_tokenizer import pretrained_tokenizer, train_tokenizer
from tasks.validate import validate
from tokenmill.commands.runs import save_run_config
from tokenmill.config import TokenmillConfig
from tokenmill.core.plan import Plan, Shards, shard_ids
from tokenmill.stages.partition import PlanAhead
from tokenmill.stages.report import plots as report_plots
from tokenmill.stages.sampling import fractions as sample_fractions
from tokenmill.stages.shuffle_documents import check_counts, shuffled_shards
from tokenmill.stages.tokenize import preload_encoder
from tokenmill.tokenizers.encoders import empty_encoder_caches
from tokenmill.tokenizers.tokenizer_info import TokenizerInfo

# Before any flow run is created (the CLI's, a deployment's): that first call, too, waits out a server restart.
retry_refused_connections()

# Group task runs at once: each waits in a thread while its shards run on the cluster. The thread pool is the
# throttle (a group still queued is not yet a task run).
GROUP_THREADS = 64


def shuffle(config: TokenmillConfig, plan: Plan, groups: int) -> tuple[Shards, float]:
    """The global document shuffle: the shards tokenize reads instead of the input shards."""
    started = time.perf_counter()
    sources, n_outputs = plan.shards, plan.shuffled_shards
    scattered = map_shards(scatter_shards, config, sources, n_outputs, groups=groups)
    source_ids = quote(shard_ids(sources).tolist())
    gathered = map_shards(gather_shards, config, list(range(n_outputs)), source_ids, plan.key, groups=groups)
    check_counts(scattered, gathered)
    return Shards(shuffled_shards(config, plan.key, gathered)), time.perf_counter() - started


def tokenize_stage(
    config: TokenmillConfig, shards: Shards, tokenizer: TokenizerInfo, groups: int, holdout: StageRun | None
) -> tuple[pd.DataFrame, TokenizeTotals, PrefectFuture | None]:
    """The run's encoder chosen (on a worker), then the tokenize stage (`tokenize_shards`, each shard's pack and
    check chained to its tokenize on the cluster), waited for: the stats table, a row per shard and split, the run's
    totals (with what the checks found wrong), and a table artifact with a row per group. Beside it, on a worker,
    the tokenizer report, once the held-out sample is written (`holdout`, where the run trains no tokenizer)."""
    encoder = choose_run_encoder(config, quote(shards), tokenizer)  # once per run; the shards get the choice
    started = time.perf_counter()
    tokenizing = StageRun(tokenize_shards, config, shards, tokenizer, encoder, groups=groups)
    report = None
    if config.writes_fertility_report():  # the held-out files, which the shard ids name, written first
        if holdout is not None:
            holdout.wait()
        report = tokenizer_report.submit(config, tokenizer, quote(shard_ids(shards)), encoder)
    groups_done = tokenizing.wait()
    totals = sum((totals for *_, totals in groups_done), TokenizeTotals(seconds=time.perf_counter() - started))
    description = f"tokenize: {len(shards)} shards, {totals.reused} reused"
    create_table_artifact([row for _, row, _ in groups_done], key="tokenize-shards", description=description)
    table = pd.concat([table for table, *_ in groups_done], ignore_index=True)
    return table.sort_values(["shard_id", "split"], ignore_index=True), totals, report


class QuickFlow(Flow):
    """A flow that costs every `tokenmill run`'s start less, and is the same to Prefect.

    Its run records its parameters as Prefect would, without importing FastAPI for it: Prefect writes them with
    FastAPI's `jsonable_encoder`, and importing FastAPI (its whole app) was 0.1 s of every run's start, its only use in
    the command's process. The config is written as that encoder writes it (pydantic's JSON, by alias), a plan being
    made as the placeholder Prefect writes for what it cannot encode; anything else goes Prefect's way.

    Its parameters' JSON schema is made when something reads `parameters`, not as the flow is declared: for
    TokenmillConfig that is 0.2 s of pydantic's time as the command's process imports this module, and a run never
    reads it (a deployment, `tokenmill serve`'s or `prefect deploy`'s, makes its own from the function)."""

    def __init__(self, *args, **kwargs) -> None:
        made = prefect.flows.parameter_schema  # what Flow.__init__ calls to set `parameters`
        prefect.flows.parameter_schema = lambda fn: None
        try:
            super().__init__(*args, **kwargs)
        finally:
            prefect.flows.parameter_schema = made

    @property
    def parameters(self) -> ParameterSchema:
        if self._parameters is None:
            self._parameters = parameter_schema(self.fn)
        return self._parameters

    @parameters.setter
    def parameters(self, schema: ParameterSchema | None) -> None:
        self._parameters = schema

    def serialize_parameters(self, parameters: dict) -> dict:
        def written(name, value):
            if isinstance(value, TokenmillConfig):
                return value.model_dump(mode="json", by_alias=True)
            if isinstance(value, PlanAhead):
                return f"<{type(value).__name__}>"
            if value is None or isinstance(value, bool | int | float | str):
                return value
            return super(QuickFlow, self).serialize_parameters({name: value})[name]

        return {name: written(name, value) for name, value in parameters.items()}


@functools.partial(
    QuickFlow,
    name="corpus-to-tokens",
    flow_run_name="{config.name}",  # the UI's run lists show which dataset each run builds
    validate_parameters=True,
    task_runner=ThreadPoolTaskRunner(max_workers=GROUP_THREADS),
)
def corpus_to_tokens(
    config: TokenmillConfig, rebuild: bool = False, plan_ahead: SkipJsonSchema[PlanAhead | None] = None
) -> dict:
    """Tokenize, pack, validate and publish a corpus as one dataset (docs/configuration.md), with the
    shard work on the Dask cluster that `config.dask` names (a LocalCluster when it names none). A run over the
    input and config of a version already published ends at once, unless `rebuild` (rerun-shards sets it).
    `plan_ahead`: the plan `tokenmill run` started making as it began (not a deployment's parameter)."""
    with dask_client(config.dask, config.tokenizer) as (client, release_workers):
        prepare_cluster(client)
        link = client.dashboard_link
        get_run_logger().info("Dask dashboard: %s", link)
        create_link_artifact(link, link_text="Dask dashboard", key="dask-dashboard", description="Watch the shards")
        return build_dataset(config, cluster_threads(client, config), rebuild, release_workers, plan_ahead)


def cluster_threads(client, config: TokenmillConfig) -> int:
    """The threads the shards will have, for `shard_size: auto`: those the cluster has, or those a cluster
    started for the run will have at its size (an adaptive one's maximum; SLURM jobs may still be queued)."""
    return max(sum(client.nthreads().values()), kind(config.dask).threads(config.dask))


def start_sample(config: TokenmillConfig, plan: Plan, stage_task=sample_shards) -> StageRun:
    """The sample stage, started: it reads a bounded few MB over all shards, so one task run (each costs ~0.1 s
    of CPU here and in the Prefect server), its shards still Dask tasks with their own retries. `holdout_shards`
    when only the tokenizer report needs it (it keeps no result per shard)."""
    return StageRun(stage_task, config, plan.shards, *sample_fractions(config, plan), groups=1)


def build_dataset(
    config: TokenmillConfig,
    cluster_threads: int,
    rebuild: bool,
    release_workers: Callable[[], str | None],
    plan_ahead: PlanAhead | None = None,
) -> dict:
    """The DAG (docs/architecture.md). `release_workers` once the cluster's work is done, before publish copies (in this
    process): SLURM jobs then go back to the queue."""
    logger = get_run_logger()
    started, started_at = time.perf_counter(), time.time()
    save_run_config(config)
    training = config.tokenizer.train is not None
    groups = stage_groups(config, cluster_threads)
    # A pretrained tokenizer is installed while the input is partitioned, and the workers load its encoders as
    # soon as it is (the partition goes on meanwhile, then the encoder choice needs them).
    installing = None if training else pretrained_tokenizer.submit(config)
    if installing is not None:
        installing.add_done_callback(functools.partial(preload_installed, config))
    plan = partition(config, cluster_threads, quote(plan_ahead))
    tokenizer = None if installing is None else installing.result()
    shards = plan.shards
    size = ByteSize(plan.shard_size).human_readable(decimal=True)  # 200.0KB, 746.0MB, 1.0GB
    logger.info("planned %d shards of %s over %d files", len(shards), size, len(plan.files))
    shuffle_seconds = None
    if config.partition.shuffle:
        shards, shuffle_seconds = shuffle(config, plan, groups)
        plan = replace(plan, shards=shards)
        logger.info("shuffled all documents into %d shards in %.1f s", len(shards), shuffle_seconds)

    # Prefect walks a task's arguments for futures, twice a call: 15 s for a 100,000-shard plan, or for a result
    # per shard (the samples). quote() skips it.
    quoted_plan = quote(plan)

    if training:
        tokenizer = train_tokenizer(config, quote(start_sample(config, plan).results()))
        on_every_worker(default_client(), preload_encoder, config, tokenizer)  # while the encoder is chosen
    logger.info("tokenizer: vocab %d, EOD id %d, BOS id %s", tokenizer.vocab_size, tokenizer.eod_id, tokenizer.bos_id)
    if not rebuild and (done := already_published(config, quoted_plan, tokenizer)) is not None:
        return unchanged_summary(config, done, time.perf_counter() - started)
    # Without a tokenizer to train, the report's held-out sample is drawn on the cluster while the encoder is chosen.
    holdout = start_sample(config, plan, holdout_shards) if config.writes_fertility_report() and not training else None
    table, totals, report = tokenize_stage(config, shards, tokenizer, groups, holdout)
    on_every_worker(default_client(), empty_encoder_caches)  # before validate's reference check, which needs none
    if totals.reused:
        logger.info("reused %d of %d committed tokenize shards", totals.reused, len(shards))
    for reason in totals.redone:  # files damaged after their commit
        logger.warning(reason)
    for why in totals.files_rejected:
        logger.warning("quarantined: %s", why)
    # Documents and rejects in pieces whose first line the partition did not count, numbered while validate runs
    # (which reads neither their lines nor the markers), done before publish lists their files.
    numbering = number_lines.submit(config, quote(shards), list(totals.unnumbered)) if totals.unnumbered else None

    split_indexes(config, tokenizer, table)  # the packed rows' shuffle index, litdata's and MDS's index.json
    # A mixture's mix, from the stats the shards committed, while validate checks them (on the cluster): a run
    # that fails validation publishes nothing, whatever the mix wrote into the build.
    mixing = resolve_mix.submit(config, quoted_plan, tokenizer, quote(table)) if config.mixture else None
    drawing = draw_plots_meanwhile(config, table, mixing)
    checker = checking_worker(workers_now(default_client()))  # it imported pandera as the run started
    stats = validate(config, quoted_plan, tokenizer, table, list(totals.problems), checker)
    mix = None if mixing is None else mixing.result()
    if numbering is not None:
        numbering.result()  # its failure, said as itself
    if report is not None:
        create_markdown_artifact(report.result(), key="fertility-report", description="Tokenizer fertility")
    plots = drawing.result()  # drawn on a worker: before the workers go
    largest, restarted = largest_process(default_client(), since=started_at)
    if restarted:
        logger.warning(restarts_said(restarted))
    if released := release_workers():
        logger.info("released the cluster's workers before publish: %s", released)
    run = {
        "bytes_in": totals.bytes_in,
        "shards_made": len(shards) - totals.reused,
        # of the input tokenized in this run: a rerun's reused shards took none of the stage's time
        "tokenize_mb_per_s": round(totals.bytes_made / 1e6 / totals.seconds, 2) if totals.bytes_made else None,
        "tokenize_seconds": round(totals.seconds, 2),
        "shuffle_seconds": None if shuffle_seconds is None else round(shuffle_seconds, 2),
        "flow_seconds": round(time.perf_counter() - started, 2),
        "largest_process_mb": round(largest / 1e6),
        "workers_restarted_for_memory": len(restarted),
    }
    after = [numbering] if numbering is not None else None  # the UI's graph then draws number_lines -> publish
    published = publish(config, quoted_plan, tokenizer, stats, run, quote(plots), mix, wait_for=after)
    return published_summary(config, len(shards), totals, run, published)


def preload_installed(config: TokenmillConfig, installed) -> None:
    """Load an installed tokenizer's encoders on every worker, not awaited (a failed install fails the run where
    the flow asks for its result). `wait()` first: a done future's state, until waited for, is read from the
    server, which can still say Pending (a run's first task: the preload was skipped)."""
    installed.wait()
    if not installed.state.is_completed():
        return
    try:
        client = default_client()
    except ValueError:  # the run already ended (its input failed to partition, say) and closed its client
        return
    on_every_worker(client, preload_encoder, config, installed.result())


def draw_plots_meanwhile(config: TokenmillConfig, table: pd.DataFrame, mixing: PrefectFuture | None) -> Future:
    """The report's plots (a mixture's too, once `mixing` has resolved it), drawn on a worker while validate's
    checks run (the flow only waits then): 0.2 s of matplotlib that publish, which nothing overlaps, used to
    spend, and its import (0.7 s) that this process, on a login node say, no longer pays. The worker is the one that
    imported matplotlib as the run started (`flows.cluster.drawing_worker`), unless Dask moves them. Reading and drawing
    only: a run that fails validation publishes nothing. Ahead of validate's shards, which publish waits for too."""

    def draw() -> dict[str, bytes]:
        mix = None if mixing is None else mixing.result()
        drawer = drawing_worker(workers_now(default_client()))  # it imported matplotlib as the run started
        store, seq_len = config.output.store(), config.pack.seq_len
        return on_a_worker(report_plots, store, table, seq_len, mix, priority=1, preferred=drawer)

    pool = ThreadPoolExecutor(1, thread_name_prefix="tokenmill-plots")
    drawing = pool.submit(draw)
    pool.shutdown(wait=False)  # its thread ends with the drawing
    return drawing
