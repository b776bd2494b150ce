"""Memory bounded by the config whatever the documents: a corpus of documents from bytes to tens of MB (generated
code-like text) runs with the defaults on workers of a small memory limit and comes out with hf's ids; a setting that
lets hf take a whole long document at once kills the worker, and the run says which stage, which documents and which
settings, not Dask's KilledWorker text."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import orjson
import pytest
import yaml
from tokenizers import Tokenizer

from tokenmill.formats.megatron import MegatronReader
from tokenmill.formats.provenance import read_documents_table
from tokenmill.tokenizers.encoders import in_clean_pieces

from .conftest import EXAMPLES

GPT2 = EXAMPLES / "tokenizers" / "gpt2" / "tokenizer.json"
SIZES = [1, 10, 100, 1_000, 10_000, 100_000, 1_000_000, 3_000_000, 12_000_000]  # bytes of the long documents
WORKER_MEMORY = "1.5GiB"  # hf took ~180 bytes a byte of a text it encoded whole: 2 GB for the 12 MB document


def code_like(size: int, seed: int) -> str:
    """About `size` bytes of lines of C-like code, some non-ASCII: no line begins or ends with whitespace (so that
    GPT-2's pre-tokenizer splits the text after every line break, and the reference can be encoded line by line)."""
    rng = random.Random(seed)
    names = ["buffer", "count", "dcn_reg", "häufig", "données", "値", "mask_sh", "x", "MAX_LEN", "offset_0x1f"]
    lines, total = [], 0
    while total < size:
        a, b = rng.choice(names), rng.choice(names)
        line = rng.choice(
            [
                f"#define {a.upper()}__{b.upper()}_{rng.randrange(1 << 16)} 0x{rng.randrange(1 << 32):08X}",
                f"{a}[{rng.randrange(999)}] = {b}({a}, {rng.random():.4f}); // {b} ünïcode {rng.randrange(10**6)}",
                f"if ({a} > {b}) {{ return {rng.randrange(-5, 5)}; }}",
                f"/* {a} {b} — «quoted» text, 日本語 {rng.randrange(100)} */",
            ]
        )
        lines.append(line)
        total += len(line.encode()) + 1
    return "\n".join(lines)[: max(size, 1)].rstrip() or "x"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The long documents among 200 short ones, as one JSONL file."""
    rng = random.Random(7)
    texts = [code_like(size, seed) for seed, size in enumerate(SIZES)]
    texts += [code_like(rng.randrange(20, 4000), 100 + k) for k in range(200)]
    rng.shuffle(texts)
    path = tmp_path_factory.mktemp("memory") / "code.jsonl"
    path.write_bytes(b"".join(orjson.dumps({"id": f"doc-{k}", "text": t}) + b"\n" for k, t in enumerate(texts)))
    return path, {f"doc-{k}": t for k, t in enumerate(texts)}


def config_file(tmp_path, corpus_path, **tokenizer) -> str:
    config = {
        "name": "code",
        "input": {"paths": [str(corpus_path)], "id_field": "id"},
        "split": {"train": 1.0},
        "tokenizer": {"path": str(GPT2), **tokenizer},
        "pack": {"mode": "none"},
        "dask": {"n_workers": 2, "memory_limit": WORKER_MEMORY},
        "output": {"path": str(tmp_path / "out")},
    }
    path = tmp_path / "code.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def reference_ids(tok: Tokenizer, text: str) -> list[int]:
    """hf's ids of `text`: whole up to 1 MB, above that line by line (the same ids for these texts: the test checks
    it on the 1 MB document)."""
    if len(text) <= 1_000_000:
        return tok.encode(text, add_special_tokens=False).ids
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    return [i for e in tok.encode_batch_fast(lines, add_special_tokens=False) for i in e.ids]


def test_documents_from_bytes_to_tens_of_mb_run_on_small_workers_and_give_hf_ids(tmp_path, corpus, run_cli):
    corpus_path, texts = corpus
    # The defaults, but validate's reference check takes every document (a long one on an excerpt): 4 MB by default
    run = run_cli("run", config_file(tmp_path, corpus_path, check_bytes="64MB"), local_cluster=True)
    assert "Dataset published" in run.stdout
    assert "largest process" in run.stdout  # the summary states the run's peak memory

    tok = Tokenizer.from_file(str(GPT2))
    medium = next(t for t in texts.values() if 900_000 < len(t) <= 1_000_000)
    lines = [line + "\n" for line in medium.split("\n")]
    lines[-1] = lines[-1][:-1]
    assert reference_ids(tok, medium) == [i for e in tok.encode_batch_fast(lines, False) for i in e.ids]

    out, checked = tmp_path / "out", 0
    for table_path in sorted((out / "megatron" / "train").glob("*.docs.parquet")):
        reader = MegatronReader(str(table_path).removesuffix(".docs.parquet"))
        for k, doc_id in enumerate(read_documents_table(table_path, ["id"]).column("id").to_pylist()):
            assert reader[k].tolist() == reference_ids(tok, texts[doc_id]) + [50256], doc_id
            checked += 1
    assert checked == len(texts)
    check = json.loads((out / "_work" / "reference_check.json").read_text())
    assert check["mismatches"] == 0 and check.get("excerpts", 0) >= 1, check  # long ones checked on an excerpt


def test_hf_in_pieces_gives_the_ids_of_the_whole_text():
    """`in_clean_pieces` cuts only where the reference splits alike: the pieces' ids are the whole text's, also for
    text whose lines begin with whitespace (code's indentation), where a cut after a line break changes the ids."""
    tok = Tokenizer.from_file(str(GPT2))
    indented = "\n".join(("    " * (k % 4)) + f"x_{k} = f({k});" for k in range(40_000))
    for text in (code_like(600_000, 1), indented, "no line breaks at all " * 20_000):
        pieces = list(in_clean_pieces(tok, text, 50_000))
        assert "".join(pieces) == text and (len(pieces) > 5 or "\n" not in text)
        ids = [i for piece in pieces for i in tok.encode(piece, add_special_tokens=False).ids]
        assert ids == tok.encode(text, add_special_tokens=False).ids


# Dask gives up on a task at its fourth worker's death by default; at the first here, which is what the tests need to
# see: each death (a worker filling its memory limit, then its nanny starting another) took about 5 s.
FIRST_DEATH_FAILS = "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES"


def test_a_setting_that_lets_hf_take_a_whole_long_document_ends_in_a_message_naming_it(
    tmp_path, corpus, run_cli, monkeypatch
):
    monkeypatch.setenv(FIRST_DEATH_FAILS, "0")
    corpus_path, texts = corpus
    config = config_file(tmp_path, corpus_path, reference_piece_bytes="1GB", check_bytes="1GB")
    run = run_cli("run", config, check=False, local_cluster=True)
    output = run.stdout + run.stderr
    assert run.returncode != 0
    line, size = next((k, len(raw)) for k, raw in enumerate(corpus_path.read_bytes().splitlines(), 1) if len(raw) > 1e7)
    assert "reference ran out of memory" in output and f"code.jsonl line {line} ({size / 1e6:.1f} MB)" in output
    assert "tokenizer.reference_piece_bytes" in output and "dask.memory_limit" in output
    assert "KilledWorker: Attempted to run task" not in output


def test_a_long_documents_excerpt_is_checked_against_the_stored_ids_that_cover_it():
    """validate's check of a long document: an excerpt between two clean cuts, against the stored ids whose bytes lie
    there; right ids pass, a changed id or ids shifted by one fail."""
    import numpy as np

    from tokenmill.tokenizers.encoders import HFEncoder
    from tokenmill.tokenizers.reference import Excerpt, checked_excerpt

    hf = HFEncoder(Tokenizer.from_file(str(GPT2)))
    text = code_like(3_000_000, 3)
    ids = np.array(hf.tokenizer.encode(text, add_special_tokens=False).ids, np.uint32)
    for seed in range(3):
        part = checked_excerpt(hf.tokenizer, hf.token_places, text, ids, 200_000, np.random.default_rng(seed))
        assert isinstance(part, Excerpt) and 150_000 < len(part.text) < 400_000
        assert ids[part.first : part.last].tolist() == hf.tokenizer.encode(part.text, add_special_tokens=False).ids
        changed = ids.copy()
        changed[(part.first + part.last) // 2] = 50255
        again = checked_excerpt(hf.tokenizer, hf.token_places, text, changed, 200_000, np.random.default_rng(seed))
        assert (
            isinstance(again, str) or changed[again.first : again.last].tolist() != ids[part.first : part.last].tolist()
        )
        shifted = checked_excerpt(hf.tokenizer, hf.token_places, text, ids[1:], 200_000, np.random.default_rng(seed))
        assert shifted == "wrong: its stored ids do not cover its text"


def test_an_excerpt_is_whole_lines_of_about_the_size_asked_for_whatever_the_script():
    from tokenmill.tokenizers.reference import excerpt

    for line in ("ascii line of code;", "日本語の行です。", "emoji 🎉 line"):
        text = "\n".join(f"{line} {k}" for k in range(100_000))
        for seed in range(5):
            part = excerpt(text, 100_000, seed)
            assert 50_000 < len(part.encode()) <= 100_000 and part in text
            assert text.startswith(part) or text[text.index(part) - 1] == "\n"
    assert excerpt("short", 100_000, 0) == "short"


# Run in a process of its own, so that its peak is the tokenize stage's: the plan, the tokenizer, the encoder's choice,
# a first shard (a warm-up: the encoders', Arrow's and the allocator's first allocations), then the shard measured,
# while a thread samples the anonymous memory (the input's pages are the file's, mapped).
TOKENIZE_ONE_SHARD = """
import json, sys, threading, time
from tokenmill.config import TokenmillConfig
from tokenmill.stages.partition import load_or_plan
from tokenmill.stages.train_tokenizer import install_pretrained
from tokenmill.stages.tokenize import Tokenizing, choose_run_encoder, tokenize_shard

def anonymous():
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("RssAnon"))

def tokenized(config):
    config = TokenmillConfig.model_validate(config)
    plan, _ = load_or_plan(config)
    tokenizer = install_pretrained(config)
    choice = choose_run_encoder(config, plan.shards, tokenizer)
    (shard,) = plan.shards
    return lambda: tokenize_shard(Tokenizing.of(config, tokenizer, choice), shard), choice

warm_up, measured = map(json.loads, sys.argv[1:])
tokenized(warm_up)[0]()
tokenize, choice = tokenized(measured)
before, peak, done = anonymous(), [0], threading.Event()

def sample():
    while not done.is_set():
        peak[0] = max(peak[0], anonymous())
        time.sleep(0.005)

sampler = threading.Thread(target=sample)
sampler.start()
result = tokenize()
done.set()
sampler.join()
from tokenmill.tokenizers.encoders import empty_encoder_caches  # as the flow has each worker do after the stage

empty_encoder_caches()
grew, after = peak[0] - before, anonymous() - before
print(json.dumps({"grew": grew, "after": after, "encoder": choice.backend, "documents": result.documents_in}))
"""


def ascii_code(size: int, seed: int) -> str:
    """`code_like` without its non-ASCII names, which the fast encoder routes to hf (a few MB a second)."""
    lines = code_like(size, seed).encode("ascii", "ignore").decode().split("\n")
    return "\n".join(line.strip() or "x" for line in lines)


def tokenize_stage_growth(tmp_path, name: str, texts: list[str], batch_bytes: str, **tokenizer) -> dict:
    """The tokenize stage's growth in anonymous memory on one shard of `texts` (`TOKENIZE_ONE_SHARD`), after a
    warm-up shard of 1 MB; `tokenizer`: more tokenizer settings."""
    import subprocess
    import sys

    from .conftest import REPO

    def config(name: str, texts: list[str]) -> str:
        corpus = tmp_path / f"{name}.jsonl"
        records = (orjson.dumps({"id": f"{name}-{k}", "text": t}) + b"\n" for k, t in enumerate(texts))
        corpus.write_bytes(b"".join(records))
        return json.dumps(
            {
                "name": name,
                "input": {"paths": [str(corpus)], "id_field": "id"},
                "split": {"train": 1.0},
                "partition": {"shard_size": "1GB"},
                "tokenizer": {"path": str(GPT2), "batch_bytes": batch_bytes, **tokenizer},
                "pack": {"mode": "none"},
                "output": {"path": str(tmp_path / f"out-{name}")},
            }
        )

    warm_up = config(f"{name}-warm-up", [ascii_code(1_000_000, 1000)])
    command = [sys.executable, "-c", TOKENIZE_ONE_SHARD, warm_up, config(name, texts)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_tokenize_stages_memory_grows_neither_with_the_shard_nor_with_its_longest_documents_ids(tmp_path):
    """tokenizer.batch_bytes bounds what the stage holds: a shard twelve times larger takes the memory of a small one,
    and a 24 MB document (encoded in pieces of batch_bytes, cut where hf splits alike) adds about its text as parsed
    (at most 4 bytes a byte), not its ids, and has hf's ids. Before the pieces, the stage held ~8 bytes a byte of its
    longest document (the ids as uint32, narrowed, then with the EOD inserted); a shard of 48 MB of short documents
    grew 85 MB at 8 MB batches."""
    short = [ascii_code(random.Random(k).randrange(200, 8000), k) for k in range(1100)]  # about 4 MB
    longest = ascii_code(24_000_000, 99)
    small = tokenize_stage_growth(tmp_path, "small", short, "1MB")
    large = tokenize_stage_growth(tmp_path, "large", short * 12, "1MB")
    long = tokenize_stage_growth(tmp_path, "long", [*short, longest], "1MB")
    assert small["encoder"] == large["encoder"] == long["encoder"] == "gigatoken"
    assert large["grew"] < small["grew"] + 20e6, (small, large)
    # its text, parsed: ~2.6 bytes a byte measured, 3.75 once on a loaded host (pyarrow's mimalloc returns freed pages
    # after a delay); the ids whole held ~8
    assert long["grew"] < small["grew"] + 4 * len(longest), (small, long)

    reader = MegatronReader(tmp_path / "out-long" / "megatron" / "train" / "shard-00000")
    tok = Tokenizer.from_file(str(GPT2))
    assert reader[len(short)].tolist() == reference_ids(tok, longest) + [50256]
    assert reader[len(short) - 1].tolist() == tok.encode(short[-1], add_special_tokens=False).ids + [50256]


def unique_chinese(size: int, seed: int) -> str:
    """About `size` bytes of random CJK ideographs in clauses of 4 to 15 split by full-width commas: GPT-2's
    pre-tokenizer makes each clause one piece, nearly every one new, as in Chinese text."""
    rng = np.random.default_rng(seed)
    code_points = rng.integers(0x4E00, 0x9FA6, size // 3, dtype=np.uint32)
    code_points[np.cumsum(rng.integers(5, 17, len(code_points) // 5))[: len(code_points) // 11]] = ord("，")
    return code_points.tobytes().decode("utf-32-le")


def test_the_encoders_cache_is_emptied_at_its_limit_on_text_of_ever_new_pieces(tmp_path):
    """gigatoken keeps every distinct piece of text it has split off: on 36 MB of Chinese-like text a shard grew by
    about 165 MB, and a worker with it until its nanny killed it. With tokenizer.encoder_cache_limit the cache starts
    empty again once the process passes it, its memory handed back to the system (without that, the process still
    grew by 80-95 MB), and the ids are hf's. Once the stage has ended, the caches are emptied whatever their size
    (`empty_encoder_caches`): validate's reference check came on top of them, and a worker was restarted there."""
    texts = [unique_chinese(60_000, seed) for seed in range(600)]
    grown = tokenize_stage_growth(tmp_path, "kept", texts, "1MB")
    # A limit below what the process holds anyway: the cache starts afresh each time the process grows by an eighth
    bounded = tokenize_stage_growth(tmp_path, "bounded", texts, "1MB", encoder_cache_limit="100MB")
    assert grown["encoder"] == bounded["encoder"] == "gigatoken"
    assert grown["grew"] > 100e6, grown  # unbounded: off a Dask worker the default is 2 GiB (measured 139-166 MB)
    assert grown["after"] < 40e6, grown  # emptied once the stage is over
    assert bounded["grew"] < 40e6, (grown, bounded)  # measured: 2 MB

    reader = MegatronReader(tmp_path / "out-bounded" / "megatron" / "train" / "shard-00000")
    tok = Tokenizer.from_file(str(GPT2))
    for k in (0, 299, 598, 599):  # the last ones encoded by a cache started afresh
        assert reader[k].tolist() == tok.encode(texts[k], add_special_tokens=False).ids + [50256]


def test_a_tokenize_task_out_of_memory_is_tried_again_with_smaller_batches_and_succeeds(tmp_path, run_cli, monkeypatch):
    """A shard whose batches are too large for its workers (tokenizer.batch_bytes 1 GB: the whole 72 MB shard at
    once, ~0.6 GB more) kills every worker that runs it; the stage tries it once more with batches of 1 MB, and the
    run publishes hf's ids, saying what it did."""
    from tokenmill.tokenizers.encoders import cached_unsafe_code_points, new_backend

    monkeypatch.setenv(FIRST_DEATH_FAILS, "0")
    gpt2 = GPT2.read_bytes()
    unsafe = cached_unsafe_code_points(gpt2, new_backend("gigatoken", gpt2), new_backend("hf", gpt2))
    # A tenth of the documents hold a code point gigatoken splits differently: hf encodes them again while the batch's
    # ids are held, so the batch's memory lasts seconds, not the fraction of one the nanny's poll could miss.
    mark = f" {chr(unsafe[len(unsafe) // 2])}" if len(unsafe) else ""
    short = [ascii_code(random.Random(k).randrange(200, 8000), k) + (mark if k % 10 == 0 else "") for k in range(1100)]
    texts = short * 18  # about 72 MB
    corpus = tmp_path / "many.jsonl"
    corpus.write_bytes(b"".join(orjson.dumps({"id": f"d{k}", "text": t}) + b"\n" for k, t in enumerate(texts)))
    config = yaml.safe_load(open(config_file(tmp_path, corpus)))
    config["tokenizer"]["batch_bytes"] = "1GB"
    config["partition"] = {"shard_size": "1GB"}
    config["dask"]["memory_limit"] = "600MiB"
    path = tmp_path / "many.yaml"
    path.write_text(yaml.safe_dump(config))
    run = run_cli("run", str(path), local_cluster=True)
    said = run.stdout + run.stderr
    assert "tokenize shard-00000: every worker that ran it died (most likely for memory)" in said, said[-3000:]
    assert "trying it again with tokenize's batches of 1,048,576 bytes" in said
    assert "Dataset published" in run.stdout
    # The workers the nanny restarted are said, and count in the largest process (a dead worker cannot say its peak)
    restarted = r"Dask workers restarted by their nanny for passing 95% of dask.memory_limit: \d+ \(the largest at"
    assert re.search(restarted, said), said[-3000:]
    assert int(re.search(r"largest process: ([\d,]+) MB", run.stdout)[1].replace(",", "")) > 0.95 * 600 * 2**20 / 1e6

    reader = MegatronReader(tmp_path / "out" / "megatron" / "train" / "shard-00000")
    tok = Tokenizer.from_file(str(GPT2))
    assert len(reader) == len(texts)
    for k in (0, 1099, 1100, len(texts) - 1):
        assert reader[k].tolist() == tok.encode(texts[k], add_special_tokens=False).ids + [50256]


def test_the_largest_process_is_a_runs_own_not_the_memory_of_the_process_that_started_it():
    """A run started from a process that holds 1 GB (a notebook, a benchmark holding its corpus) reports its own peak:
    Linux's ru_maxrss, which the summary read before, keeps the parent's across exec and said 1 GB."""
    import subprocess
    import sys

    held = bytearray(1 << 30)
    held[:: 1 << 12] = b"\1" * len(held[:: 1 << 12])  # resident, page by page
    code = "from tokenmill.core.tries import peak_rss; print(peak_rss())"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert 1 << 20 < int(child.stdout) < 300 << 20
    del held
