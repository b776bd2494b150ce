"""publish: the build's `manifest.json`, the report, then the versioned copy with its manifest last and
the LATEST pointer after it."""

import pandas as pd
from prefect import task

from tokenmill import publish as library
from tokenmill import report
from tokenmill.config import TokenmillConfig
from tokenmill.tokenizer import TokenizerInfo


@task(name="publish")
def publish(config: TokenmillConfig, tokenizer: TokenizerInfo, table: pd.DataFrame, run: dict) -> dict:
    manifest = library.publish(config, tokenizer, table)
    markdown = report.write_report(config.output.store(), manifest, table, run)
    published = library.publish_version(config, manifest, extra_files=report.FILES)
    return {"manifest": manifest, "published": published, "report": markdown}
