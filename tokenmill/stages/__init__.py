"""Every stage of the DAG (docs/architecture.md), declared once: its name, the library module that does its work,
and, for a shard stage, the function the cluster runs per shard, the context it is given and what it commits.

Read by the task layer (`tasks/shards.Stage.of` runs a shard stage from its record), the commits (`commits.STAGES`:
the stages with a marker per shard; `MOVABLE`), the workers' start-up (`flows/startup.py` imports the modules of
the work the cluster runs, `PRELOADED`), reruns (`runs.SHARD_STAGES`: what a rerun of chosen shards redoes) and
the layering test (the stage modules stand side by side, none importing another). A leaf: it imports nothing of
tokenmill, and finds a stage's work and context by name when asked.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    name: str  # the Prefect task's and the Dask keys' (`<name>-shard`), and the markers' folder `_commits/<name>/`
    module: str  # the library module of its work (`tokenmill.<module>`)
    work: str | None = None  # a shard stage: `work(context, item, *args)`, run on the cluster per shard
    context: str | None = None  # the frozen dataclass whose `of(config, ...)` makes what `work` uses of the run
    whole_chain: bool = False  # its work takes the results of every earlier stage of the shard's chain
    commits: bool = False  # a marker per shard, written last (`tokenmill.core.commits`)
    movable: bool = False  # its marker lists every file it wrote: a shard's output can take another id
    rerun: bool = False  # `tokenmill rerun --shard` redoes it for the chosen shards
    preloaded: bool = False  # each worker imports its module as it starts (its work runs on the cluster each run)

    def function(self) -> Callable:
        return getattr(importlib.import_module(f"tokenmill.stages.{self.module}"), self.work)

    def context_of(self, *made_from) -> object:
        """The stage's context, made once per run from `made_from` (its class's `of`)."""
        return getattr(importlib.import_module(f"tokenmill.stages.{self.module}"), self.context).of(*made_from)


STAGES = {
    stage.name: stage
    for stage in (
        Stage("partition", "partition"),
        Stage("scatter", "shuffle_documents", "scatter_shard", "Shuffling", commits=True, preloaded=True),
        Stage("gather", "shuffle_documents", "gather_shard", "Shuffling", commits=True, preloaded=True),
        Stage("sample", "sampling", "sample_shard", "Sampling", commits=True, preloaded=True),
        Stage("train_tokenizer", "train_tokenizer"),
        Stage(
            "tokenize",
            "tokenize",
            "tokenize_shard",
            "Tokenizing",
            commits=True,
            movable=True,
            rerun=True,
            preloaded=True,
        ),  # fmt: skip
        # pack and check run chained to each shard's tokenize on the cluster, in its group task (tasks/tokenize.py)
        Stage("pack", "pack", "pack_shard", "Packing", commits=True, movable=True, rerun=True, preloaded=True),
        Stage("check", "validate", "check_written", "Checking", whole_chain=True, preloaded=True),
        Stage("tokenizer_report", "fertility", preloaded=True),
        Stage("split_indexes", "pack"),
        Stage("reference", "validate", "check_reference", "Referencing", preloaded=True),
        Stage("validate", "validate"),
        Stage("mix", "mix"),
        Stage("plots", "report"),  # drawn on one worker: not worth every worker's import
        Stage("publish", "publish"),
    )
}
STAGE_MODULES = tuple(dict.fromkeys(f"tokenmill.stages.{stage.module}" for stage in STAGES.values()))
PRELOADED = tuple(dict.fromkeys(f"tokenmill.stages.{stage.module}" for stage in STAGES.values() if stage.preloaded))
COMMITTING = tuple(name for name, stage in STAGES.items() if stage.commits)  # in the order they run
