"""Pretrained sources load offline from tests/data/tokenizers and give the ids the reference gives: HF
`tokenizers` for tokenizer.json files and directories, `tiktoken` for rank files (converted to tokenizer.json).
EOD/BOS are the configured tokens or the tokenizer's own, and a missing one is an error naming the key."""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import time

import numpy as np
import pytest
from tokenizers import Tokenizer

from tokenmill.config import HubConfig, TiktokenConfig, TokenizerConfig
from tokenmill.tokenizers.encoders import new_backend
from tokenmill.tokenizers.pretrained import TokenizerSourceError, load_pretrained
from tokenmill.tokenizers.tiktoken_convert import PRESETS, parse_ranks
from tokenmill.tokenizers.tokenizer_info import describe_tokenizer, encode

from .conftest import CORPORA, TOKENIZERS, maintainers_file, read_jsonl

tiktoken = pytest.importorskip("tiktoken")


@pytest.fixture(scope="module")
def texts() -> list[str]:
    """Documents in many scripts, code, DNA, web text, and the odd whitespace and digit runs."""
    picked = []
    for pattern in ("multilingual/*.jsonl.gz", "code/*.jsonl.gz", "web_trafilatura_pages/*.jsonl.gz",
                    "enwiki_slice/*.jsonl.gz", "dna/*.jsonl.gz"):  # fmt: skip
        for path in sorted(CORPORA.glob(pattern)):
            picked += [d["text"][:4000] for d in read_jsonl(path)[:40]]
    return picked + ["", " ", "  two  spaces\n\n\n tabs\t\tand 1234567 digits 3.14159 ’curly’ \r\n"]


def tokenizer_of(source, **options) -> tuple[Tokenizer, object]:
    pretrained = load_pretrained(str(source), **options) if options else _converted(str(source))
    return Tokenizer.from_str(pretrained.data.decode()), pretrained


@functools.cache
def _converted(source: str):
    """Converting a large rank file takes seconds: once per test session per file."""
    return load_pretrained(source)


def ids(tok: Tokenizer, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in tok.encode_batch_fast(texts, add_special_tokens=False)]


@pytest.mark.parametrize("name", ["gpt2", "gpt-neox-20b", "deepseek-v3", "phi3-mini"])
def test_tokenizer_json_file_gives_the_reference_ids(name, texts):
    reference = Tokenizer.from_file(str(TOKENIZERS / name / "tokenizer.json"))
    tok, _ = tokenizer_of(TOKENIZERS / name / "tokenizer.json")
    assert ids(tok, texts) == ids(reference, texts)


@pytest.mark.parametrize(
    "rank_file",
    [
        "llama3/tokenizer.model",
        "tiktoken/cl100k_base.tiktoken",
        "tiktoken/o200k_base.tiktoken",
        "tiktoken/r50k_base.tiktoken",
    ],  # fmt: skip
)
def test_tiktoken_rank_file_converts_to_the_same_ids(rank_file, texts):
    llama3 = rank_file.startswith("llama3")  # Meta's license keeps it out of the repository
    path = maintainers_file("tokenizers/llama3/tokenizer.model") if llama3 else TOKENIZERS / rank_file
    data = path.read_bytes()
    tok, pretrained = tokenizer_of(path)
    preset = PRESETS[hashlib.sha256(data).hexdigest()]
    reference = tiktoken.Encoding(preset.name, pat_str=preset.pattern, mergeable_ranks=parse_ranks(data, rank_file),
                                  special_tokens=preset.special_tokens)  # fmt: skip
    assert ids(tok, texts) == reference.encode_ordinary_batch(texts)
    for token, token_id in preset.special_tokens.items():  # whole, never split, at tiktoken's id
        assert tok.encode(f"x{token}y", add_special_tokens=False).ids == reference.encode(
            f"x{token}y", allowed_special="all"
        )
        assert tok.token_to_id(token) == token_id
    info = describe_tokenizer(pretrained.data, TokenizerConfig(path="x", eod="auto"), False, pretrained.eos)
    assert info.vocab_size == reference.n_vocab  # the largest id + 1, even with gaps (cl100k)
    assert info.eod_id == reference.eot_token if preset.name != "llama3" else info.eod_id == 128001
    assert tok.decode(ids(tok, texts[:1])[0]) == texts[0]


@pytest.mark.parametrize("name", ["r50k_base", "cl100k_base", "o200k_base"])
def test_a_rank_files_tokenizer_loads_into_gigatoken_with_tiktokens_ids(name, texts):
    """gigatoken knows a split pattern by its text: the converted r50k and cl100k patterns, as Oniguruma must read
    them, it refused (runs of them were left to hf, at a few MB/s), and is given them as it spells them."""
    path = TOKENIZERS / "tiktoken" / f"{name}.tiktoken"
    data = path.read_bytes()
    _, pretrained = tokenizer_of(path)
    preset = PRESETS[hashlib.sha256(data).hexdigest()]
    reference = tiktoken.Encoding(preset.name, pat_str=preset.pattern, mergeable_ranks=parse_ranks(data, name),
                                  special_tokens=preset.special_tokens)  # fmt: skip
    flat, lengths = new_backend("gigatoken", pretrained.data).encode_batch(texts)
    assert [ids.tolist() for ids in np.split(flat, np.cumsum(lengths)[:-1])] == reference.encode_ordinary_batch(texts)


def test_a_rank_files_conversion_is_kept_in_the_users_cache(tmp_path, monkeypatch):
    """Converting a large rank file takes seconds, in the flow's process and in the forkserver of every run: the
    tokenizer.json is kept (0600) by the file, the pattern and special tokens; a cache file that another user could
    have written is not taken."""
    from tokenmill.tokenizers import pretrained as module

    monkeypatch.setenv("TOKENMILL_CACHE_DIR", str(tmp_path / "cache"))
    conversions, convert = [], module.rank_file_to_tokenizer_json
    monkeypatch.setattr(module, "rank_file_to_tokenizer_json", lambda *a: conversions.append(a) or convert(*a))
    path = str(TOKENIZERS / "tiktoken" / "r50k_base.tiktoken")
    first = load_pretrained(path)
    (kept,) = (tmp_path / "cache" / "tiktoken-tokenizers").iterdir()
    assert kept.stat().st_mode & 0o777 == 0o600 and kept.read_bytes() == first.data
    assert load_pretrained(path) == first and len(conversions) == 1
    other = TiktokenConfig(pattern=r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
                           special_tokens={"<|endoftext|>": 50256})  # fmt: skip
    assert load_pretrained(path, tiktoken=other).data != first.data and len(conversions) == 2
    kept.chmod(0o666)
    assert load_pretrained(path) == first and len(conversions) == 3


def test_llama3_own_eos_and_bos(tmp_path):
    llama3 = maintainers_file("tokenizers/llama3/tokenizer.model")
    _, pretrained = tokenizer_of(llama3)
    assert load_pretrained(str(llama3)).data == pretrained.data  # deterministic
    info = describe_tokenizer(pretrained.data, TokenizerConfig(path="x", eod="auto", bos="auto"), False,
                              pretrained.eos, pretrained.bos)  # fmt: skip
    assert (pretrained.eos, pretrained.bos, info.eod_id, info.bos_id) == ("<|end_of_text|>", "<|begin_of_text|>",
                                                                          128001, 128000)  # fmt: skip
    # The default EOD, which Llama-3's vocabulary lacks, is its own; a token named in the config is that token or
    # an error (so is the default where the tokenizer names no EOS of its own: test_unknown_rank_file...)
    assert describe_tokenizer(pretrained.data, TokenizerConfig(path="x"), False, pretrained.eos).eod_id == 128001
    with pytest.raises(ValueError, match=r"tokenizer.eod '<\|eot\|>' is not in the vocabulary.*'<\|end_of_text\|>'"):
        describe_tokenizer(pretrained.data, TokenizerConfig(path="x", eod="<|eot|>"), False, pretrained.eos,
                           source="llama3")  # fmt: skip


def test_unknown_rank_file_needs_a_pattern(tmp_path):
    lines = (TOKENIZERS / "tiktoken" / "r50k_base.tiktoken").read_bytes().splitlines()[:300]
    path = tmp_path / "small.tiktoken"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(TokenizerSourceError, match="does not know.*tokenizer.tiktoken.pattern"):
        load_pretrained(str(path))
    pattern = PRESETS["306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"].pattern
    options = TiktokenConfig(pattern=pattern, special_tokens={"<|eot|>": 300})
    tok, _ = tokenizer_of(path, tiktoken=options)
    reference = tiktoken.Encoding("small", pat_str=pattern, mergeable_ranks=parse_ranks(path.read_bytes(), "x"),
                                  special_tokens={"<|eot|>": 300})  # fmt: skip
    text = "the other thing that is in there <|eot|>"
    assert tok.encode(text, add_special_tokens=False).ids == reference.encode(text, allowed_special="all")
    small = load_pretrained(str(path), tiktoken=options)
    assert small.eos is None
    with pytest.raises(ValueError, match=r"tokenizer.eod '<\|endoftext\|>' is not in the vocabulary of 'small'$"):
        describe_tokenizer(small.data, TokenizerConfig(path="x"), False, small.eos, source="'small'")


def test_hf_directory_names_its_own_eos_and_bos(tmp_path, texts):
    directory = tmp_path / "phi3"
    directory.mkdir()
    shutil.copy(TOKENIZERS / "phi3-mini" / "tokenizer.json", directory)
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "</s>"}, "bos_token": "<s>"}))
    tok, pretrained = tokenizer_of(directory)
    assert (pretrained.eos, pretrained.bos) == ("</s>", "<s>")
    reference = Tokenizer.from_file(str(TOKENIZERS / "phi3-mini" / "tokenizer.json"))
    assert ids(tok, texts) == ids(reference, texts)
    # without the config files: EOS and BOS by their conventional names
    bare = load_pretrained(str(TOKENIZERS / "phi3-mini" / "tokenizer.json"))
    assert (bare.eos, bare.bos) == ("<|endoftext|>", "<s>")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TokenizerSourceError, match="has no tokenizer.json"):
        load_pretrained(str(tmp_path / "empty"))


def test_missing_special_tokens_are_clear_errors():
    gpt2 = load_pretrained(str(TOKENIZERS / "gpt2" / "tokenizer.json"))
    assert (gpt2.eos, gpt2.bos) == ("<|endoftext|>", None)
    with pytest.raises(ValueError, match="tokenizer.bos is auto, but 'gpt2' does not say which token is its BOS"):
        describe_tokenizer(gpt2.data, TokenizerConfig(path="x", bos="auto"), False, gpt2.eos, gpt2.bos, "'gpt2'")
    with pytest.raises(ValueError, match="tokenizer.pad '<pad>' is not in the vocabulary"):
        describe_tokenizer(gpt2.data, TokenizerConfig(path="x", pad="<pad>"), False)
    with pytest.raises(TokenizerSourceError, match="no such file"):
        load_pretrained("/nonexistent/tokenizer.json")
    with pytest.raises(TokenizerSourceError, match="neither a tokenizer.json nor a tiktoken rank file"):
        load_pretrained(str(CORPORA / "dna" / "SOURCE.md"))


def test_hub_id_without_network_fails_at_once_saying_to_pass_a_local_path(tmp_path):
    for offline in (False, True):
        started = time.perf_counter()
        with pytest.raises(TokenizerSourceError, match="pass a local path"):
            load_pretrained("hf:openai-community/gpt2", hub=HubConfig(cache_dir=str(tmp_path), offline=offline))
        assert time.perf_counter() - started < 10


def test_hub_id_resolves_from_a_local_cache_offline(tmp_path):
    # huggingface_hub's cache layout: models--org--name/refs/<branch> holds a commit; snapshots/<commit>/ the files
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "models--openai-community--gpt2"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    shutil.copy(TOKENIZERS / "gpt2" / "tokenizer.json", snapshot)
    (snapshot / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    for offline in (False, True):  # unreachable hub, then offline mode: both find the cached copy
        pretrained = load_pretrained(
            "hf:openai-community/gpt2", hub=HubConfig(cache_dir=str(tmp_path), offline=offline)
        )
        assert pretrained.data == (TOKENIZERS / "gpt2" / "tokenizer.json").read_bytes()
        assert pretrained.eos == "<|endoftext|>"


def test_encode_puts_bos_before_and_eod_after_each_document():
    tok = Tokenizer.from_file(str(TOKENIZERS / "gpt2" / "tokenizer.json"))
    docs = ["Hello world", "", "a b c"]
    plain = ids(tok, docs)
    flat, lengths = encode(tok, docs, eod_id=50256, bos_id=7)
    assert lengths.tolist() == [len(p) + 2 for p in plain]
    assert flat.tolist() == [t for p in plain for t in [7, *p, 50256]]
    flat, lengths = encode(tok, docs, eod_id=None)
    assert flat.tolist() == [t for p in plain for t in p] and flat.dtype == np.int64
    assert encode(tok, [], eod_id=1)[0].size == 0
