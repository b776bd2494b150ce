"""Training on a sample of real corpora: bpe round-trips, training is deterministic across processes and
cached, unigram and wordpiece train, special tokens come first, bad settings fail with the key named."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from tokenizers import Tokenizer

from tokenmill.config import TokenmillConfig, TrainConfig
from tokenmill.core import layout
from tokenmill.core import samples as sample_files
from tokenmill.stages.train_tokenizer import special_tokens, train_from_texts, train_on_sample

from .conftest import REPO
from .test_sampling import inputs, make_config, run_sample  # noqa: F401 (inputs: a fixture)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, inputs):  # noqa: F811 (the fixture imported above)
    """bpe trained on a 1 MB sample of multilingual + enwiki_slice, with BOS and PAD and an extra token."""
    config = make_config(
        tmp_path_factory.mktemp("train"), inputs, special_tokens=["<|user|>"], vocab_size=2000
    ).model_copy(deep=True)
    config.tokenizer.bos, config.tokenizer.pad = "<|begin_of_text|>", "<|pad|>"
    samples = run_sample(config)
    info = train_on_sample(config, samples)
    return config, samples, info


def test_bpe_round_trips_every_held_out_document(trained):
    config, samples, info = trained
    tok = Tokenizer.from_file(f"{config.output.path}/{layout.TOKENIZER}")
    held = [r["text"] for r in sample_files.holdout_records(config, samples)]
    scripts = {r["source"] for r in sample_files.holdout_records(config, samples)}
    assert len(held) > 50 and len(scripts) >= 3
    encodings = tok.encode_batch(held, add_special_tokens=False)
    assert tok.decode_batch([e.ids for e in encodings], skip_special_tokens=False) == held
    assert info.vocab_size == 2000 and info.trained


def test_special_tokens_get_the_first_ids(trained):
    config, _, info = trained
    tok = Tokenizer.from_file(f"{config.output.path}/{layout.TOKENIZER}")
    assert special_tokens(config.tokenizer) == ["<|endoftext|>", "<|begin_of_text|>", "<|pad|>", "<|user|>"]
    assert (info.eod_id, info.bos_id, info.pad_id, tok.token_to_id("<|user|>")) == (0, 1, 2, 3)
    # a special token in the text stays one token
    assert tok.encode("a<|user|>b", add_special_tokens=False).ids[1] == 3


def test_training_is_cached_by_sample_and_config(trained):
    config, samples, info = trained
    path = f"{config.output.path}/{layout.TOKENIZER}"
    before = os.stat(path).st_mtime_ns
    started = time.perf_counter()
    assert train_on_sample(config, samples) == info
    assert time.perf_counter() - started < 1.0 and os.stat(path).st_mtime_ns == before
    changed = config.model_copy(deep=True)
    changed.tokenizer.train.vocab_size = 1500
    assert train_on_sample(changed, samples).vocab_size == 1500


TRAIN_IN_A_FRESH_PROCESS = """
import hashlib, sys
from tokenmill.config import TrainConfig
from tokenmill.stages.train_tokenizer import train_from_texts
texts = open(sys.argv[1], encoding="utf-8").read().split("\\x1e")
tok = train_from_texts(texts, TrainConfig(algorithm=sys.argv[2], vocab_size=1500), ["<|endoftext|>"])
print(hashlib.sha256(tok.to_str().encode()).hexdigest())
"""


@pytest.mark.parametrize("algorithm", ["bpe", "wordpiece"])
def test_training_is_deterministic_across_processes(trained, tmp_path, algorithm):
    # Rust HashMaps are seeded per process, so only separate processes can show nondeterminism.
    config, samples, _ = trained
    texts = tmp_path / "texts"
    texts.write_text("\x1e".join(list(sample_files.training_texts(config, samples))[:400]), encoding="utf-8")
    digests = {
        subprocess.run([sys.executable, "-c", TRAIN_IN_A_FRESH_PROCESS, str(texts), algorithm], cwd=REPO,
                       capture_output=True, text=True, check=True).stdout.strip()
        for _ in range(2)
    }  # fmt: skip
    assert len(digests) == 1


@pytest.mark.parametrize("algorithm, unk", [("unigram", "<unk>"), ("wordpiece", "[UNK]")])
def test_unigram_and_wordpiece_train_and_cover_held_out_text(trained, algorithm, unk):
    config, samples, _ = trained
    texts = [t for t in sample_files.training_texts(config, samples) if len(t) < 5000][:300]  # unigram is slow
    train = TrainConfig(algorithm=algorithm, vocab_size=1500, normalization="nfkc")
    tok = train_from_texts(texts, train, ["<|endoftext|>", unk])
    assert tok.get_vocab_size() == 1500 and tok.token_to_id("<|endoftext|>") == 0 and tok.token_to_id(unk) == 1
    held = [r["text"] for r in sample_files.holdout_records(config, samples) if r["source"] == "wikipedia-en"]
    ids = [i for e in tok.encode_batch(held, add_special_tokens=False) for i in e.ids]
    assert len(ids) > 1000 and ids.count(1) / len(ids) < 0.01
    assert tok.normalizer.normalize_str("ﬁ") == "fi"  # nfkc


def test_bad_training_settings_name_the_key():
    with pytest.raises(ValueError, match="vocab_size 200 is too small for a byte-level BPE"):
        train_from_texts(["some text"], TrainConfig(vocab_size=200), ["<|endoftext|>"])
    with pytest.raises(ValueError, match="sample is empty"):
        train_from_texts([], TrainConfig(algorithm="wordpiece", vocab_size=300), ["[UNK]"])
    with pytest.raises(ValueError, match="tokenizer.eod: auto means a pretrained"):
        TokenmillConfig.model_validate({"name": "x", "input": {"paths": ["x"]}, "output": {"path": "x"},
                                        "tokenizer": {"train": {}, "eod": "auto"}})  # fmt: skip
    with pytest.raises(ValueError, match="prepend_bos needs tokenizer.bos"):
        TokenmillConfig.model_validate({"name": "x", "input": {"paths": ["x"]}, "output": {"path": "x"},
                                        "tokenizer": {"path": "x", "prepend_bos": True}})  # fmt: skip
