"""tokenizer_report: fertility of the dataset's tokenizer (and baselines) on the held-out sample."""

import numpy as np
from prefect import task

from tasks import UNCACHED
from tasks.shards import on_a_worker
from tokenmill.config import TokenmillConfig
from tokenmill.stages import fertility
from tokenmill.tokenizers.encoders import EncoderChoice
from tokenmill.tokenizers.tokenizer_info import TokenizerInfo


@task(name="tokenizer_report", **UNCACHED)
def tokenizer_report(
    config: TokenmillConfig, tokenizer: TokenizerInfo, shard_ids: np.ndarray, encoder: EncoderChoice | None = None
) -> str:
    """Write report/fertility.{json,md} from the held-out files of `shard_ids` (on a worker, whose encoders are
    loaded); return the markdown (a few KB) for the flow's artifact. The shards go as an array of ids: the
    sample stage's results, a dict per shard, went with the task through Dask's scheduler (in the flow's
    process), held there until the report ended."""
    bounds = "Its memory is bounded by fertility.holdout_size and tokenizer.reference_piece_bytes"
    report = on_a_worker(fertility.tokenizer_report, config, tokenizer, shard_ids, encoder, bounded_by=bounds)
    return fertility.markdown(report)
