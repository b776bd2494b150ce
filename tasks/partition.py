"""partition: the shard plan, `plan.json` in the output: kept while the input is as it recorded it (reruns and
retries see the same shards), rebuilt on the unchanged shards when the input changed."""

from prefect import get_run_logger, task

from tasks import UNCACHED
from tokenmill.config import TokenmillConfig
from tokenmill.core.plan import Plan
from tokenmill.stages.partition import PlanAhead, load_or_plan


@task(name="partition", **UNCACHED)
def partition(config: TokenmillConfig, cluster_threads: int, ahead: PlanAhead | None = None) -> Plan:
    """The plan (the one made `ahead`, where it is for this config)."""
    plan, change = load_or_plan(config, cluster_threads, ahead)
    logger = get_run_logger()
    if change is None:
        logger.info("the input is as plan.json recorded it: reusing its %d shards", len(plan.shards))
    elif change:
        logger.info(
            "the input changed since the last plan: %d files added, %d changed, %d removed; %d shards kept and %d "
            "renumbered (their committed output is reused), %d new",
            change["files_added"], change["files_changed"], change["files_removed"],
            change["shards_kept"], change["shards_renumbered"], change["shards_new"],
        )  # fmt: skip
    return plan
