"""The tokenize stage's batch path around the encoder: BOS/EOD insertion, the JSONL columnar fast path,
which must give exactly what the careful record-by-record path gives, rejects included, and a document of
5 million characters."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from tokenizers import Tokenizer

from tokenmill.config import TokenmillConfig
from tokenmill.core.plan import Shard, Shards, shard_ids
from tokenmill.formats.megatron import MegatronReader, narrowed
from tokenmill.io import readers
from tokenmill.io.readers import Piece, ReadOptions, read_documents
from tokenmill.stages.partition import load_or_plan
from tokenmill.stages.tokenize import (
    VERIFY_SHARDS,
    Tokenizing,
    choose_run_encoder,
    tokenize_shard,
    verification_shards,
    with_specials,
)
from tokenmill.stages.train_tokenizer import install_pretrained

from .conftest import CORPORA, TOKENIZERS, read_jsonl


def test_bos_and_eod_wrap_every_document_even_empty_ones():
    flat, lengths = np.array([1, 2, 3], np.uint32), np.array([2, 0, 1])
    out, out_lengths = with_specials(flat, lengths, bos_id=7, eod_id=9)
    assert out.tolist() == [7, 1, 2, 9, 7, 9, 7, 3, 9] and out_lengths.tolist() == [4, 2, 3]
    assert with_specials(flat, lengths, None, 9)[0].tolist() == [1, 2, 9, 9, 3, 9]
    assert with_specials(flat, lengths, None, None)[0] is flat


@pytest.mark.parametrize("bos_id", [None, 50255])
@pytest.mark.parametrize("eod_id", [None, 50256])
def test_ids_copied_into_the_files_dtype_with_their_marks_as_np_insert_places_them(bos_id, eod_id):
    """Long documents (a slice each) and short ones (a mask), empty ones among them, cast to the file's dtype on the
    way: the ids and marks np.insert and a cast put in place."""
    rng = np.random.default_rng(57)
    for documents, tokens in ((40, 200_000), (4000, 200_000)):  # 5,000 and 50 tokens a document
        lengths = rng.multinomial(tokens, np.ones(documents) / documents)
        lengths[::7] = 0
        flat = rng.integers(0, 50254, lengths.sum(), dtype=np.uint32)
        ends = np.cumsum(lengths)
        marks = [(ends - lengths, bos_id), (ends, eod_id)]
        marks = [(places, token) for places, token in marks if token is not None]
        expected = flat.astype(np.uint16)
        if marks:
            places = np.stack([p for p, _ in marks], axis=1).ravel()
            expected = np.insert(expected, places, np.tile([t for _, t in marks], documents).astype(np.uint16))
        out, out_lengths = with_specials(flat, lengths, bos_id, eod_id, np.dtype(np.uint16))
        assert out.dtype == np.uint16 and np.array_equal(out, expected)
        assert np.array_equal(out_lengths, lengths + len(marks)) and out_lengths.sum() == len(out)


def test_ids_are_narrowed_to_the_files_dtype_or_refused_never_wrapped():
    out = narrowed(np.array([0, 65535], np.uint32), np.dtype(np.uint16))
    assert out.dtype == np.uint16 and out.tolist() == [0, 65535]
    with pytest.raises(ValueError, match="token id 65536 does not fit the output's uint16"):
        narrowed(np.array([3, 65536], np.uint32), np.dtype(np.uint16))


def read_all(path, options: ReadOptions, columnar: bool, batch_bytes: int = readers.BATCH_BYTES):
    docs, rejects, nbytes, fast_batches = [], [], 0, 0
    for batch, batch_rejects in read_documents([Piece(str(path))], options, columnar, batch_bytes):
        fast_batches += batch.text_array is not None
        texts = batch.text_values()
        docs += list(zip(batch.ids, texts.to_pylist() if not isinstance(texts, list) else texts, strict=True))
        rejects += [r.to_dict() for r in batch_rejects]
        nbytes += batch.nbytes
    return (docs, rejects, nbytes), fast_batches


def test_fast_path_gives_what_the_careful_path_gives(tmp_path):
    good = [orjson.dumps({"id": f"d{i}", "text": f"text number {i} \u00e9\U00016ebb", "n": i}) for i in range(40)]
    # escaped surrogate pairs, lower and upper case: the fast path decodes them as the careful path does
    good[5:7] = [
        b'{"id": "pair", "text": "a\\ud83d\\ude00b"}',
        b'{"id": "PAIR", "text": "\\uD800\\uDC00\\udbff\\udfff"}',
    ]
    bad = [
        b'{"id": "broken", "text": ',
        b'{"id": "latin1", "text": "caf\xe9"}',
        b'{"id": "no-text"}',
        b'{"id": "d3", "text": "duplicate id"}',
        b"",
        b'{"id": "s", "text": "\\ud800"}',
        b'{"id": "low", "text": "\\ude00 alone"}',
        b'{"id": "reversed", "text": "\\ude00\\ud83d"}',
        b'{"id": "unpaired", "text": "\\ud83d\\u0041"}',
        b'{"id": 5, "text": "x"}',
    ]
    lines = good[:10] + bad + good[10:]
    results = {}
    for ending in (b"\n", b"\r\n"):
        path = tmp_path / "mixed.jsonl"
        path.write_bytes(ending.join(lines) + ending)
        for options in (ReadOptions(id_field="id"), ReadOptions(), ReadOptions(id_field="id", max_chars=20)):
            # many small blocks: the good ones are read by the fast path, the bad ones by the careful one
            (careful, _), (fast, fast_batches) = read_all(path, options, False), read_all(path, options, True, 200)
            assert fast == careful  # documents, rejects and bytes in
            assert fast_batches >= 5
            assert len(careful[1]) >= 3
            results.setdefault(repr(options), []).append(careful[2])
    # bytes in are the records' bytes, whichever line endings they had
    assert all(lf == crlf for lf, crlf in results.values())
    # the pairs' block is read by the fast path (pyarrow), which decodes them as orjson does
    batch, _ = readers.jsonl_block(b"\n".join(good[5:7]) + b"\n", 1, "x.jsonl", ReadOptions(id_field="id"), set())
    assert batch.text_array is not None and batch.text_array.to_pylist() == ["a\U0001f600b", "\U00010000\U0010ffff"]


def test_a_five_million_character_document_is_tokenized_exactly(tmp_path):
    """Batches are sized in bytes, not documents: a 5-million-character document (real Wikipedia prose) among
    ordinary ones goes through the run's encoder choice (gigatoken, guarded) and comes out with hf's ids."""
    texts = [doc["text"] for doc in read_jsonl(CORPORA / "enwiki_slice" / "enwiki_slice.jsonl.gz")[:5000]]
    huge = "\n\n".join(texts)[:5_000_000]
    assert len(huge) == 5_000_000
    documents = [texts[0], huge, texts[1], texts[2]]
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b"".join(orjson.dumps({"id": f"d{i}", "text": t}) + b"\n" for i, t in enumerate(documents)))
    tokenizer_path = TOKENIZERS / "gpt2" / "tokenizer.json"
    config = TokenmillConfig.model_validate(
        {
            "name": "huge",
            "input": {"paths": [str(path)], "id_field": "id"},
            "tokenizer": {"path": str(tokenizer_path)},
            "output": {"path": str(tmp_path / "out")},
        }
    )
    plan, _ = load_or_plan(config)
    tokenizer = install_pretrained(config)
    choice = choose_run_encoder(config, plan.shards, tokenizer, log=lambda _: None)
    assert choice.backend == "gigatoken"
    (shard,) = plan.shards
    assert tokenize_shard(Tokenizing.of(config, tokenizer, choice), shard).splits["train"]["documents"] == 4
    reader = MegatronReader(tmp_path / "out" / "megatron" / "train" / "shard-00000")
    reference = Tokenizer.from_file(str(tokenizer_path)).encode_batch_fast(documents, add_special_tokens=False)
    assert [reader[i].tolist() for i in range(4)] == [e.ids + [tokenizer.eod_id] for e in reference]


def test_the_encoder_choice_is_sent_only_the_shards_its_sample_reads():
    """At most VERIFY_SHARDS, evenly spaced (the whole plan of 98,176 shards was an 11 MB Dask task); drawn again
    from those, the same shards: the worker's sample is the one the whole plan gives."""
    shards = Shards([Shard(i, (Piece(f"s{i}"),), 1, f"s{i}") for i in range(1000)])
    sent = verification_shards(shards)
    assert shard_ids(sent).tolist() == list(range(0, 1000, 4)) and len(sent) <= VERIFY_SHARDS
    assert list(verification_shards(sent)) == list(sent)
    assert list(verification_shards(shards[:10])) == list(shards[:10])
    assert len(verification_shards(Shards([]))) == 0


def test_a_verified_encoder_choice_is_kept_per_tokenizer_and_backend_versions_and_not_verified_again(
    tmp_path, monkeypatch
):
    """The choice a run verified is kept in the user's cache (0700, its file 0600): the next run of that tokenizer
    with the same backends takes it without hf's encoding of a sample (no kept reference ids: validate encodes its
    own); a changed tokenizer, a changed backend version, or a cache file others can write is verified again."""
    import os
    import shutil

    from tokenmill.core import layout
    from tokenmill.tokenizers import encoders

    probes = encoders.cache_dir("encoder-probes")  # the code-point probes (seconds of hf) are not what is tested
    cache = tmp_path / "cache"
    monkeypatch.setenv("TOKENMILL_CACHE_DIR", str(cache))
    if probes.is_dir():
        shutil.copytree(probes, encoders.cache_dir("encoder-probes"))
    path = tmp_path / "corpus.jsonl"
    texts = [doc["text"] for doc in read_jsonl(CORPORA / "enwiki_slice" / "enwiki_slice.jsonl.gz")[:200]]
    path.write_bytes(b"".join(orjson.dumps({"text": t}) + b"\n" for t in texts))
    config = TokenmillConfig.model_validate(
        {
            "name": "cached",
            "input": {"paths": [str(path)]},
            "tokenizer": {"path": str(TOKENIZERS / "gpt2" / "tokenizer.json")},
            "output": {"path": str(tmp_path / "out")},
        }
    )
    plan, _ = load_or_plan(config)
    tokenizer = install_pretrained(config)
    kept_ids = tmp_path / "out" / layout.REFERENCE_IDS

    def choose():
        said = []
        choice = choose_run_encoder(config, plan.shards, tokenizer, log=said.append)
        return choice, kept_ids.exists(), said[0]

    first, verified, said_first = choose()
    assert first.backend == "gigatoken" and verified  # hf encoded the sample: its ids are kept for validate
    (entry,) = (cache / "encoder-choices").iterdir()
    assert entry.stat().st_mode & 0o777 == 0o600 and (cache / "encoder-choices").stat().st_mode & 0o777 == 0o700
    again, verified, said = choose()
    assert not verified and (again.backend, again.version, again.unsafe) == (first.backend, first.version, first.unsafe)
    # The manifest's reason is the same either way (a run's manifest depends on its input, not on the user's cache);
    # the log says where the verification came from
    assert again.reason == first.reason and "sampled documents" in first.reason
    assert "verified by an earlier run" in said and "verified by an earlier run" not in said_first
    assert encoders.cached_choice("0" * 64, "auto") is None  # another tokenizer's sha256: not this choice
    assert encoders.cached_choice(tokenizer.sha256, "gigatoken") is None  # nor another request

    entry.chmod(0o666)  # another user could have written it: not trusted
    assert choose()[1]
    assert entry.stat().st_mode & 0o777 == 0o600  # written again, as its own
    assert not choose()[1]

    real = encoders.package_version
    monkeypatch.setattr(encoders, "package_version", lambda p: "0.0.0-other" if p == "gigatoken" else real(p))
    assert choose()[1]  # another gigatoken version: verified again
    assert len(os.listdir(cache / "encoder-choices")) == 2


def test_the_verification_sample_of_a_table_file_comes_from_groups_at_seeded_places_not_its_start(tmp_path):
    """A Parquet file's verification sample is read from its row groups in a seeded order, not from its first
    batches: a file ordered by source (here, by group) is verified on text from across it, and the same seed gives the
    same texts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tokenmill.stages.tokenize import verification_sample

    texts = [f"group {i // 100}: document {i} " * 30 for i in range(3000)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "t.parquet", row_group_size=100)
    config = TokenmillConfig.model_validate({
        "name": "verify",
        "input": {"paths": [str(tmp_path / "t.parquet")]},
        "partition": {"shard_size": "100MB"},
        "tokenizer": {"path": str(TOKENIZERS / "gpt2" / "tokenizer.json"), "verify_documents": 20},
        "output": {"path": str(tmp_path / "out")},
    })  # fmt: skip
    plan, _ = load_or_plan(config)
    tokenizer = install_pretrained(config)
    sample = verification_sample(config, plan.shards, tokenizer)
    groups = {int(text.split(":")[0].removeprefix("group ")) for text in sample}
    assert len(sample) == 20 and groups and groups != {0}
    assert sample == verification_sample(config, plan.shards, tokenizer)
