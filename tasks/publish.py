"""publish: the build's `manifest.json`, the report, then the versioned copy with its manifest last and
the LATEST pointer after it; or, when this version is already published, only LATEST."""

import pandas as pd
from prefect import task

from tasks import UNCACHED
from tokenmill.config import TokenmillConfig
from tokenmill.core.plan import Plan
from tokenmill.stages import publish as library
from tokenmill.stages import report
from tokenmill.stages.mix import write_megatron_args
from tokenmill.tokenizers.tokenizer_info import TokenizerInfo


@task(name="already_published", **UNCACHED)
def already_published(config: TokenmillConfig, plan: Plan, tokenizer: TokenizerInfo) -> dict | None:
    """This version's manifest and LATEST pointed at it, if the version is published complete; else None."""
    if (manifest := library.already_published(config, plan, tokenizer)) is None:
        return None
    return {"manifest": manifest, "published": library.point_latest_at(config, manifest)}


@task(name="publish", **UNCACHED)
def publish(
    config: TokenmillConfig,
    plan: Plan,
    tokenizer: TokenizerInfo,
    table: pd.DataFrame,
    run: dict,
    plots: dict,
    mix: dict | None = None,
) -> dict:
    """`plots`: the report's (`report.plots`), drawn while validate ran; `mix`: a mixture's, resolved."""
    with library.Files() as files:  # the dataset's files, spooled until the version is published
        manifest = library.publish(config, plan, tokenizer, table, files, mix)  # the manifest less its list of files
        markdown = report.write_report(config.output.store(), manifest, plots, run)
        version = library.version_store(config, manifest["version"]).url
        args = [] if config.mixture else write_megatron_args(config, table, version)  # a mixture's are its mix's
        extra = [*report.files(plots), *args]  # beside the data, not in the manifest: about the run, or the place
        published = library.publish_version(config, manifest, files, extra_files=extra)
    return {"manifest": manifest, "published": published, "report": markdown}
