"""What a run leaves for the next one: its config (so a rerun needs only the output path) and the commit markers a
targeted rerun removes to redo chosen shards."""

from __future__ import annotations

import orjson

from tokenmill.config import TokenmillConfig
from tokenmill.core.layout import RUN_CONFIG, marker
from tokenmill.core.plan import Plan
from tokenmill.core.signing import key_path, signed, write_signed
from tokenmill.io.storage import JSON_OPTIONS, Store
from tokenmill.stages import STAGES

SHARD_STAGES = tuple(name for name, stage in STAGES.items() if stage.rerun)  # sample and shuffle feed others
# What a rerun never takes from the output location, whose writers must not choose where the shards' code runs
# (`dask`: a scheduler's address, SLURM jobs and the shell lines they run first), which endpoints get the
# credentials of the rerun's environment, or which of its variables is sent to the hub as a token.
NOT_STORED = (
    "dask",
    "input.storage",
    "sources.*.input.storage",
    "output.storage",
    "output.publish.storage",
    "tokenizer.hub.token_env",
)


def save_run_config(config: TokenmillConfig) -> None:
    """Record the run's full config in its output (secrets masked), signed with this user's key (`signing`), if it
    is not recorded so already: a run that finds nothing to do writes nothing."""
    store = config.output.store()
    recorded = orjson.dumps(config.model_dump(mode="json"), option=JSON_OPTIONS | orjson.OPT_APPEND_NEWLINE)
    if (
        not store.exists(RUN_CONFIG)
        or (data := store.read_bytes(RUN_CONFIG)) != recorded
        or not signed(store, RUN_CONFIG, data)
    ):
        write_signed(store, RUN_CONFIG, recorded)


def load_run_config(output: str, given: TokenmillConfig | None = None) -> tuple[TokenmillConfig, list[str]]:
    """The config a rerun of the run at `output` runs with, and the sections it took from what that run stored
    there (RUN_CONFIG).

    Given a config, that one (its output.path `output`), once checked to define the dataset stored there (else a
    ValueError naming the sections that differ): nothing is taken from the output location. Else the stored
    config, but for what a rerun never takes from there (NOT_STORED), left at its defaults: a LocalCluster (or
    $TOKENMILL_DASK_ADDRESS), the environment's S3 endpoint and credentials, the hub token in HF_TOKEN."""
    store = Store(output, given.output.storage.fsspec_options() if given else {})
    if not store.exists(RUN_CONFIG):
        raise FileNotFoundError(f"{output}: no {RUN_CONFIG}; is this the output of a tokenmill run?")
    text = store.read_bytes(RUN_CONFIG)
    if given is None and not signed(store, RUN_CONFIG, text):
        raise ValueError(
            f"{store.url_of(RUN_CONFIG)} is not signed with your tokenmill key ({key_path()}): someone who can write "
            f"{output} may have put it there, and a rerun would read what it names. Nothing was run. Give the run's "
            f"config: tokenmill rerun {output} --config CONFIG (a run of it signs what it stores)"
        )
    data = orjson.loads(text)
    stored = _as_rerun(data, output)
    if given is None:
        return stored, [key for key, value in data.items() if isinstance(value, dict | list)]
    theirs, ours = stored.dataset_config(), _as_rerun(given.model_dump(mode="json"), output).dataset_config()
    if differ := [key for key in dict.fromkeys([*theirs, *ours]) if theirs.get(key) != ours.get(key)]:
        raise ValueError(
            f"{output}: the config given defines another dataset than the run there: {', '.join(differ)} "
            f"differ from {RUN_CONFIG}. A rerun redoes that run's shards; to build the new one, run the config."
        )
    return TokenmillConfig.model_validate(
        given.model_dump() | {"output": given.output.model_dump() | {"path": output}}
    ), []


def _as_rerun(data: dict, output: str) -> TokenmillConfig:
    """A recorded config (JSON, changed in place) as a rerun of `output` takes it: NOT_STORED left at defaults."""
    for path in NOT_STORED:
        _remove(data, path.split("."))
    data["output"]["path"] = output
    return TokenmillConfig.model_validate(data)


def _remove(data: dict | list | None, path: list[str]) -> None:
    """Remove the key at `path` (`*`: in every item of a list) from the recorded config, in place."""
    head, *rest = path
    if data is None:
        return
    if head == "*":
        for item in data:
            _remove(item, rest)
    elif not rest:
        data.pop(head, None)
    else:
        _remove(data.get(head), rest)


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


def taken_from(output: str, stored: list[str]) -> str:
    """Where a rerun's config came from, for its log (`stored`: load_run_config's sections)."""
    if not stored:
        return f"from the config given (it defines the dataset in {output}/{RUN_CONFIG})"
    return f"from {output}/{RUN_CONFIG}: {', '.join(stored)}; not from there: the cluster, S3 endpoints and credentials"
