"""tokenizer_report: fertility of the dataset's tokenizer (and baselines) on the held-out sample."""

from prefect import task

from tasks import UNCACHED
from tasks.shards import on_a_worker
from tokenmill import fertility
from tokenmill.config import TokenmillConfig
from tokenmill.encoders import EncoderChoice
from tokenmill.tokenizer import TokenizerInfo


@task(name="tokenizer_report", **UNCACHED)
def tokenizer_report(
    config: TokenmillConfig, tokenizer: TokenizerInfo, samples: list[dict], encoder: EncoderChoice | None = None
) -> str:
    """Write report/fertility.{json,md} (on a worker, whose encoders are loaded); return the markdown (a few KB)
    for the flow's artifact."""
    return fertility.markdown(on_a_worker(fertility.tokenizer_report, config, tokenizer, samples, encoder))
