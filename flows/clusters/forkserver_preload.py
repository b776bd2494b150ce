"""Imported by the LocalCluster's forkserver before it forks any worker (`flows.clusters.local`): what every
worker needs (`WORKER_MODULES`), and the run's pretrained tokenizer, whose config FORKSERVER_TOKENIZER holds,
read as the run will install it and its encoders loaded (`tokenmill.tokenizers.encoders.preload_tokenizer`), so that
every worker starts with them. Each worker loaded them itself, 0.5 s of CPU, while the run's encoder was being
chosen; now it is done once, while the flow's process imports Prefect. And the workers' log filter
(`local_process.ClosedScheduler`)."""

import contextlib
import logging
import os

from flows.clusters.local import FORKSERVER_TOKENIZER
from flows.startup import warm_up, without_collector


def preload() -> None:
    warm_up()
    if FORKSERVER_TOKENIZER not in os.environ:
        return
    from tokenmill.config import TokenizerConfig
    from tokenmill.tokenizers.encoders import preload_tokenizer
    from tokenmill.tokenizers.pretrained import load_pretrained

    config = TokenizerConfig.model_validate_json(os.environ[FORKSERVER_TOKENIZER])
    # Whatever is wrong with the tokenizer, the run's install says it, naming the file; the workers then have
    # nothing preloaded, as with a tokenizer trained by the run.
    with contextlib.suppress(Exception):
        pretrained = load_pretrained(config.path, config.hub, config.tiktoken)
        preload_tokenizer(pretrained.data, config.encoder, pretrained.parsed)  # parsed once, for hf too


with without_collector():
    preload()
    from flows.clusters.local_process import ClosedScheduler

logging.getLogger("distributed.worker").addFilter(ClosedScheduler())  # every worker forks with it
