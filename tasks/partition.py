"""partition: the shard plan, `plan.json` in the output (reused by reruns of the same config)."""

from prefect import get_run_logger, task

from tokenmill.config import TokenmillConfig
from tokenmill.partition import load_or_plan


@task(name="partition")
def partition(config: TokenmillConfig, cluster_threads: int) -> dict:
    plan, reused = load_or_plan(config, cluster_threads)
    if reused:
        get_run_logger().info("reusing plan.json: %d shards", len(plan["shards"]))
    return plan
