"""mix: a mixture's sources resolved into the mix a trainer draws, from the validated tokens, and the files that
say it: Megatron's data-args files for the version being published, and the packed loader's mix
(tokenmill.stages.mix)."""

import pandas as pd
from prefect import task

from tasks import UNCACHED
from tokenmill.config import TokenmillConfig
from tokenmill.core.plan import Plan
from tokenmill.stages import mix as library
from tokenmill.stages.publish import dataset_version, version_store
from tokenmill.tokenizers.tokenizer_info import TokenizerInfo


@task(name="mix", **UNCACHED)
def resolve_mix(config: TokenmillConfig, plan: Plan, tokenizer: TokenizerInfo, table: pd.DataFrame) -> dict:
    resolved = library.resolve(config, table)
    published = version_store(config, dataset_version(config, plan, tokenizer)).url
    library.write_mix(config, table, resolved, published)
    return resolved  # shown in the run's summary artifact (publish)
