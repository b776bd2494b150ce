"""The fertility report: a tokenizer trained on a sample that is 95% English and 5% code is worse on code
than one trained on a 50/50 sample, and the report (per source, beside a baseline) shows it."""

from __future__ import annotations

import gzip
import json

import pytest

from tokenmill.config import TokenmillConfig
from tokenmill.core import layout
from tokenmill.stages import fertility, sampling
from tokenmill.stages.partition import plan_shards
from tokenmill.stages.tokenize import choose_run_encoder
from tokenmill.stages.train_tokenizer import install_pretrained, train_on_sample

from .conftest import CORPORA, TOKENIZERS, read_jsonl

CODE = "cpython-3.11.7"
GPT2 = str(TOKENIZERS / "gpt2" / "tokenizer.json")


def write_corpus(path, english_bytes: int, code_bytes: int) -> None:
    """English Wikipedia then CPython source, each up to its share of bytes, as one JSONL file."""
    docs = []
    for source, budget in (("enwiki_slice", english_bytes), ("code", code_bytes)):
        taken = 0
        for doc in read_jsonl(next((CORPORA / source).glob("*.jsonl.gz"))):
            if taken >= budget:
                break
            docs.append({"id": doc["id"], "text": doc["text"], "source": doc["source"]})
            taken += len(doc["text"].encode())
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(d) + "\n" for d in docs)


def report_for(tmp_path, name: str, english_bytes: int, code_bytes: int) -> tuple[dict, str]:
    write_corpus(tmp_path / f"{name}.jsonl.gz", english_bytes, code_bytes)
    config = TokenmillConfig.model_validate({
        "name": name,
        "input": {"paths": [str(tmp_path / f"{name}.jsonl.gz")], "id_field": "id"},
        "tokenizer": {"train": {"vocab_size": 4000, "sample_size": "1500KB"}},
        "fertility": {"holdout_size": "1500KB", "group_by": ["source"], "baselines": [GPT2]},
        "output": {"path": str(tmp_path / name)},
    })  # fmt: skip
    plan = plan_shards(config)
    f, g = sampling.fractions(config, plan)
    samples = [sampling.sample_shard(sampling.Sampling.of(config, f, g), shard) for shard in plan.shards]
    report = fertility.tokenizer_report(config, train_on_sample(config, samples), samples)
    return report, (tmp_path / name / layout.FERTILITY_REPORT[0]).read_text()


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fertility")
    return {
        "95/5": report_for(tmp, "mostly-english", 3_800_000, 200_000),
        "50/50": report_for(tmp, "balanced", 2_000_000, 2_000_000),
    }


def code_metric(report: dict, metric: str, tokenizer: str = fertility.DATASET) -> float:
    return report["groups"]["source"][CODE]["tokenizers"][tokenizer][metric]


def test_code_costs_more_tokens_when_the_sample_is_mostly_english(reports):
    skewed, balanced = reports["95/5"][0], reports["50/50"][0]
    assert skewed["groups"]["source"][CODE]["documents"] >= 3
    assert code_metric(skewed, "tokens_per_word") > 1.2 * code_metric(balanced, "tokens_per_word")
    assert code_metric(skewed, "bytes_per_token") < code_metric(balanced, "bytes_per_token")
    # and English is not what differs: both tokenizers serve it about equally
    english = [
        r["groups"]["source"]["wikipedia-en"]["tokenizers"]["dataset"]["tokens_per_word"] for r, _ in reports.values()
    ]
    assert abs(english[0] - english[1]) / english[1] < 0.25


def test_the_report_flags_the_imbalance(reports):
    (skewed, skewed_md), (balanced, _) = reports["95/5"], reports["50/50"]
    assert any(note.startswith(f"source {CODE}:") for note in skewed["flagged"])
    assert not any(note.startswith(f"source {CODE}:") for note in balanced["flagged"])
    assert "Served worst by the dataset's tokenizer" in skewed_md and f"source {CODE}" in skewed_md


def test_the_report_counts_and_compares_with_the_baseline(reports):
    report, md = reports["95/5"]
    overall = report["overall"]
    held = sum(entry["documents"] for entry in report["groups"]["source"].values())
    assert overall["documents"] == held > 0
    assert report["tokenizers"][GPT2]["vocab_size"] == 50257 and report["tokenizers"]["dataset"]["vocab_size"] == 4000
    for name in (fertility.DATASET, GPT2):
        m = overall["tokenizers"][name]
        assert m["tokens_per_word"] == round(m["tokens"] / overall["words"], 4)
        assert m["bytes_per_token"] == round(overall["bytes"] / m["tokens"], 4)
    assert "| gpt2/tokenizer.json | 50,257 |" in md and "## By source" in md


def test_the_runs_encoder_counts_exactly_what_hf_counts(tmp_path):
    # The flow counts the dataset's tokens with the encoder it chose (gigatoken here), verified against hf.
    write_corpus(tmp_path / "mixed.jsonl.gz", 1_000_000, 500_000)  # a dozen source files: some held out
    config = TokenmillConfig.model_validate({
        "name": "mixed",
        "input": {"paths": [str(tmp_path / "mixed.jsonl.gz")], "id_field": "id"},
        "tokenizer": {"path": GPT2},
        "fertility": {"holdout_size": "400KB", "group_by": ["source"]},
        "output": {"path": str(tmp_path / "out")},
    })  # fmt: skip
    plan = plan_shards(config)
    f, g = sampling.fractions(config, plan)
    samples = [sampling.sample_shard(sampling.Sampling.of(config, f, g), shard) for shard in plan.shards]
    info = install_pretrained(config)
    choice = choose_run_encoder(config, plan.shards, info, log=lambda _: None)
    assert choice.backend != "hf"
    by_encoder = fertility.tokenizer_report(config, info, samples, choice)
    by_hf = fertility.tokenizer_report(config, info, samples)
    assert by_encoder == by_hf and by_hf["groups"]["source"][CODE]["documents"] > 0
