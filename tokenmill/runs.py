"""What a run leaves for the next one: its config (so a rerun needs only the output path, and its cluster) and the
commit markers a targeted rerun removes to redo chosen shards."""

from __future__ import annotations

from tokenmill.commits import marker
from tokenmill.config import DaskConfig, TokenmillConfig
from tokenmill.plan import Plan
from tokenmill.storage import Store

RUN_CONFIG = "_work/config.json"
MASKED = "**********"  # how pydantic writes a SecretStr
SHARD_STAGES = ("tokenize", "pack")  # the per-shard stages a rerun redoes (sample and shuffle feed others)
# What a rerun never takes from the output location: whoever can write there must not choose where the shards' code
# runs (`dask`: a scheduler's address, SLURM jobs and the shell lines they run first).
NOT_STORED = ("dask",)


def save_run_config(config: TokenmillConfig) -> None:
    """Record the run's full config in its output (secrets masked: reruns take them from the environment), if it
    is not recorded already: a run that finds nothing to do writes nothing."""
    store, recorded = config.output.store(), config.model_dump(mode="json")
    if not store.exists(RUN_CONFIG) or store.read_json(RUN_CONFIG) != recorded:
        store.write_json(RUN_CONFIG, recorded)


def load_run_config(output: str, dask: DaskConfig | None = None) -> tuple[TokenmillConfig, list[str]]:
    """The earlier run's config, read back from its output, but for the sections a rerun never takes from there
    (NOT_STORED), which are the caller's: `dask` (None: the defaults, a LocalCluster or $TOKENMILL_DASK_ADDRESS).
    Also the sections it took from the output."""
    store = Store(output)
    if not store.exists(RUN_CONFIG):
        raise FileNotFoundError(f"{output}: no {RUN_CONFIG}; is this the output of a tokenmill run?")
    data = _without_masked_secrets(store.read_json(RUN_CONFIG))
    data["output"]["path"] = output
    stored = [key for key in data if key not in NOT_STORED and isinstance(data[key], dict | list)]
    data = {k: v for k, v in data.items() if k not in NOT_STORED} | {"dask": (dask or DaskConfig()).model_dump()}
    return TokenmillConfig.model_validate(data), stored


def _without_masked_secrets(data):
    """The recorded config with its masked secrets removed: a rerun takes them from the environment."""
    if isinstance(data, dict):
        return {k: _without_masked_secrets(v) for k, v in data.items() if v != MASKED}
    return data


def forget_shards(config: TokenmillConfig, shard_ids: list[int]) -> int:
    """Remove the commit markers of these shards so the next run redoes them; returns how many went."""
    store = config.output.store()
    plan = Plan.read(store)
    known = range(plan.shuffled_shards) if plan.shuffled_shards else [s.shard_id for s in plan.shards]
    if unknown := sorted(set(shard_ids) - set(known)):
        raise ValueError(
            f"{config.output.path}: no shards {unknown}; the plan has {len(known)} shards, "
            f"ids {known[0]} to {known[-1]}"
        )
    removed = 0
    for stage in SHARD_STAGES:
        for shard_id in shard_ids:
            if store.exists(marker(stage, shard_id)):
                store.remove(marker(stage, shard_id))
                removed += 1
    return removed
