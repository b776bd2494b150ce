"""train_tokenizer: train on the sample (cached by sample hash + config), or install the pretrained one;
either way the EOD/BOS/PAD tokens are resolved here, before any shard runs."""

from prefect import task

from tasks import UNCACHED
from tokenmill.config import TokenmillConfig
from tokenmill.core.samples import Sampled
from tokenmill.stages import train_tokenizer as tokenizer
from tokenmill.tokenizers.tokenizer_info import TokenizerInfo


@task(name="train_tokenizer", **UNCACHED)
def train_tokenizer(config: TokenmillConfig, samples: list[Sampled]) -> TokenizerInfo:
    return tokenizer.train_on_sample(config, samples)


@task(name="pretrained_tokenizer", **UNCACHED)
def pretrained_tokenizer(config: TokenmillConfig) -> TokenizerInfo:
    return tokenizer.install_pretrained(config)
