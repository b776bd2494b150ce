"""partition: the shard plan, written to `plan.json` in the output."""

from prefect import task

from tokenmill import layout
from tokenmill.config import TokenmillConfig
from tokenmill.partition import plan_shards
from tokenmill.storage import Store


@task(name="partition")
def partition(config: TokenmillConfig) -> dict:
    plan = plan_shards(config)
    store = Store(config.output.path)
    if not store.exists(layout.PLAN) or store.read_json(layout.PLAN) != plan:
        store.write_json(layout.PLAN, plan)
    return plan
