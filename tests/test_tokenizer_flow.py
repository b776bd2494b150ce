"""The tokenizer stage in the real flow: Llama-3's tiktoken rank file, its own EOS (the default's) and BOS, BOS
prepended, the fertility report published with the dataset; a missing EOD stops the run before any shard."""

from __future__ import annotations

import hashlib
import json

import pytest

from tokenmill.formats.megatron import MegatronReader
from tokenmill.tokenizers.tiktoken_convert import PRESETS, parse_ranks

from .conftest import EXAMPLES, maintainers_file, read_jsonl

tiktoken = pytest.importorskip("tiktoken")


def test_llama3_rank_file_with_bos_gives_tiktoken_ids_for_every_document(run_cli, tmp_path):
    """tokenizer.eod left at <|endoftext|>, which Llama-3 lacks: its own EOS, <|end_of_text|>."""
    llama3 = maintainers_file("tokenizers/llama3/tokenizer.model")  # Meta's license keeps it out of the repository
    out = tmp_path / "llama3"
    run_cli("run", "examples/gpt2.yaml", "--set", f"output.path={out}", "--set", f"tokenizer.path={llama3}",
            "--set", "tokenizer.bos=auto", "--set", "tokenizer.prepend_bos=true",
            "--set", "split={train: 1.0}", "--set", "fertility.group_by=[source]")  # fmt: skip
    data = llama3.read_bytes()
    preset = PRESETS[hashlib.sha256(data).hexdigest()]
    reference = tiktoken.Encoding("llama3", pat_str=preset.pattern, mergeable_ranks=parse_ranks(data, "llama3"),
                                  special_tokens=preset.special_tokens)  # fmt: skip
    docs = [d for path in sorted((EXAMPLES / "data").glob("*.jsonl*")) for d in read_jsonl(path)]
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["tokenizer"]["bos_id"], manifest["tokenizer"]["eod_id"]) == (128000, 128001)
    assert manifest["tokenizer"]["vocab_size"] == 128256 and manifest["dtype"] == "int32"
    prefixes = sorted(out / e["path"][: -len(".bin")] for e in manifest["files"] if e["kind"] == "megatron-bin")
    got = [reader[i].tolist() for p in prefixes for reader in [MegatronReader(p)] for i in range(len(reader))]
    expected = [[128000, *ids, 128001] for ids in reference.encode_ordinary_batch([d["text"] for d in docs])]
    assert got == expected
    kinds = {e["path"]: e["kind"] for e in manifest["files"]}
    assert kinds["report/fertility.md"] == kinds["report/fertility.json"] == "fertility-report"
    report = json.loads((out / "report" / "fertility.json").read_text())
    assert report["tokenizers"]["dataset"]["vocab_size"] == 128256 and report["groups"]["source"]


def test_a_missing_eod_token_stops_the_run_before_any_shard(run_cli, tmp_path):
    out = tmp_path / "no-eod"
    result = run_cli("run", "examples/gpt2.yaml", "--set", f"output.path={out}", "--set", "tokenizer.eod=<|eot|>",
                     check=False)  # fmt: skip
    assert result.returncode != 0
    assert "tokenizer.eod '<|eot|>' is not in the vocabulary" in result.stdout + result.stderr
    assert not (out / "megatron").exists() and not (out / "manifest.json").exists()
