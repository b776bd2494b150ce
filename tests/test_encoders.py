"""Encoder backends against the reference: the encoding tokenmill chooses gives, for every document of every
corpus of tests/data and each of the GPT-2, GPT-NeoX, Phi-3 (Llama-2-style), DeepSeek-V3 and Granite 3.1
(StarCoder-style) tokenizers, exactly the ids of `tokenizers.Tokenizer.encode(text, add_special_tokens=False)`.

The full reference costs minutes of HF time, so its digests are recorded in `reference_ids.json` (see
`tests/reference_ids.py`); every run also re-encodes one document in SPOT_CHECK of each corpus with HF live
(up to SPOT_BYTES of text per corpus: HF needs seconds per megabyte of DNA).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pytest
from tokenizers import Tokenizer

from tokenmill.tokenizers import encoders
from tokenmill.tokenizers.encoders import EncoderChoice, GuardedEncoder, build_encoder, choose_encoder, new_backend

from .reference_ids import BLOCK, CORPUS_FILES, TOKENIZER_NAMES, corpus_texts, digests, hf_ids, recorded, tokenizer_json

BATCH_BYTES = 8 << 20
SPOT_CHECK = 50
SPOT_BYTES = 1_000_000


def batches(texts: list[str]) -> list[pa.Array]:
    """Texts in batches of about BATCH_BYTES, as the readers hand them to the encoder."""
    out, start, size = [], 0, 0
    for i, text in enumerate(texts):
        size += len(text)
        if size >= BATCH_BYTES:
            out.append(pa.array(texts[start : i + 1]))
            start, size = i + 1, 0
    if start < len(texts):
        out.append(pa.array(texts[start:]))
    return out


def spot_checked(texts: list[str]) -> list[int]:
    """The shortest of every SPOT_CHECK-th document, as many as fit in SPOT_BYTES of text (one at least)."""
    every = sorted(range(0, len(texts), SPOT_CHECK), key=lambda i: len(texts[i]))
    fitting = np.cumsum([len(texts[i]) for i in every]) <= SPOT_BYTES
    return sorted(every[: max(1, int(fitting.sum()))])


def assert_reference_ids(name: str, corpus, texts: list[str], got: tuple[np.ndarray, np.ndarray], what: str) -> None:
    """`got` equals HF's ids: live on every SPOT_CHECK-th document, and in full against the recorded digests
    (or a live encoding of the whole corpus where the record does not match the installed files)."""
    flat, lengths = got
    ends = np.cumsum(lengths)
    spot = spot_checked(texts)
    reference = Tokenizer.from_str(tokenizer_json(name).decode())
    wrong = [i for i in spot if flat[ends[i] - lengths[i] : ends[i]].tolist()
             != reference.encode(texts[i], add_special_tokens=False).ids]  # fmt: skip
    assert not wrong, f"{what}: documents {wrong[:5]} of {corpus.name} differ from hf"
    record = recorded(name, corpus)
    if record is None:  # the record is for other files or another `tokenizers`: the whole reference, live
        assert_same_ids(got, hf_ids(name, texts), what)
        return
    mine = digests(flat, lengths)
    blocks = [i for i, (a, b) in enumerate(zip(mine["blocks"], record["blocks"], strict=True)) if a != b]
    assert mine["all"] == record["all"] and not blocks, (
        f"{what}: documents in blocks {[(b * BLOCK, b * BLOCK + BLOCK - 1) for b in blocks[:5]]} "
        f"of {corpus.name} differ from hf's recorded ids"
    )


@pytest.fixture(scope="session")
def chosen():
    """The `auto` choice per tokenizer, verified on a sample drawn across every corpus."""
    sample = [t[:20_000] for path in CORPUS_FILES for t in corpus_texts(path)[::50][:200]]
    return {name: choose_encoder(tokenizer_json(name), "auto", sample, log=lambda _: None) for name in TOKENIZER_NAMES}


def encode_all(encoder, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    parts = [encoder.encode_batch(batch) for batch in batches(texts)]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def assert_same_ids(got: tuple[np.ndarray, np.ndarray], expected: tuple[np.ndarray, np.ndarray], what: str) -> None:
    (flat, lengths), (ref_flat, ref_lengths) = got, expected
    if np.array_equal(lengths, ref_lengths) and np.array_equal(flat, ref_flat):
        return
    starts, ref_starts = np.cumsum(lengths) - lengths, np.cumsum(ref_lengths) - ref_lengths
    wrong = [
        i
        for i in range(len(ref_lengths))
        if i >= len(lengths)
        or not np.array_equal(
            flat[starts[i] : starts[i] + lengths[i]], ref_flat[ref_starts[i] : ref_starts[i] + ref_lengths[i]]
        )
    ]
    raise AssertionError(f"{what}: {len(wrong)} of {len(ref_lengths)} documents differ from hf, e.g. {wrong[:5]}")


@pytest.mark.parametrize("corpus", CORPUS_FILES, ids=lambda p: p.name.removesuffix(".jsonl.gz"))
@pytest.mark.parametrize("name", TOKENIZER_NAMES)
def test_chosen_encoder_gives_the_reference_ids_for_every_document(name, corpus, chosen):
    choice, _ = chosen[name]
    texts = corpus_texts(corpus)
    assert_reference_ids(
        name, corpus, texts, encode_all(build_encoder(tokenizer_json(name), choice), texts), choice.backend
    )


def test_auto_prefers_gigatoken_and_explains_the_others(chosen):
    for name in TOKENIZER_NAMES:
        choice, report = chosen[name]
        assert choice.backend == "gigatoken", (name, report)
        if name != "phi3-mini":  # a SentencePiece model splits on no Unicode property
            assert choice.unsafe, "gigatoken's Unicode 17 letters must be routed to hf"
        assert report["gigatoken"].startswith("chosen: identical to hf")
    assert set(report) == {"gigatoken"}, "auto stops at the first exact backend"


@pytest.mark.parametrize(
    "name, why",
    [("gpt-neox-20b", "normalizer"), ("phi3-mini", "SentencePiece"), ("deepseek-v3", "normalizer|one regex")],
)
def test_tiktoken_says_why_it_cannot_represent_a_tokenizer(name, why):
    with pytest.raises(encoders.NotRepresentable, match=why):
        encoders.tiktoken_parts(tokenizer_json(name))


@pytest.mark.parametrize("corpus", CORPUS_FILES, ids=lambda p: p.name.removesuffix(".jsonl.gz"))
def test_tiktoken_built_from_gpt2_json_gives_the_reference_ids(corpus):
    choice, _ = choose_encoder(tokenizer_json("gpt2"), "tiktoken", [], log=lambda _: None)
    texts = corpus_texts(corpus)
    assert_reference_ids(
        "gpt2", corpus, texts, encode_all(build_encoder(tokenizer_json("gpt2"), choice), texts), "tiktoken"
    )


def test_a_preloaded_tokenizer_is_parsed_once_and_gives_the_reference_ids():
    """The LocalCluster's forkserver preloads the run's tokenizer with the HF `Tokenizer` it parsed to read it
    (`preload_tokenizer(..., parsed)`): the hf backend takes that one rather than parse the file again (0.07-0.13 s
    of CPU as every run starts), and encodes as a fresh parse does."""
    data = tokenizer_json("gpt2")
    parsed = Tokenizer.from_str(data.decode())
    key = (hashlib.sha256(data).hexdigest(), "hf")
    encoders.LOADED.pop(key, None)
    encoders.preload_tokenizer(data, "auto", parsed)
    assert encoders.LOADED[key].tokenizer is parsed
    texts = corpus_texts(CORPUS_FILES[0])[:300]
    assert_same_ids(encoders.LOADED[key].encode_batch(texts), hf_ids("gpt2", texts), "the preloaded hf backend")


def test_a_letter_newer_than_the_reference_unicode_goes_to_the_reference():
    """U+16EBB (Beria Erfe, Unicode 17) is a letter to gigatoken and not to `tokenizers`: unguarded the ids
    differ, guarded the document is encoded by hf."""
    data = tokenizer_json("gpt2")
    reference = encoders.HFEncoder(Tokenizer.from_str(data.decode()))
    fast = new_backend("gigatoken", data)
    texts = ["plain text", "def f(x):\n    return '\U00016ebb's value'", "more plain text"]
    expected = reference.encode_batch(texts)
    unguarded = fast.encode_batch(texts)
    assert not np.array_equal(unguarded[0], expected[0]), "gigatoken now agrees: the guard is untested"
    unsafe = encoders.probe_code_points(fast, reference)
    assert 0x16EBB in unsafe
    guarded = GuardedEncoder(fast, reference, unsafe)
    assert_same_ids(guarded.encode_batch(texts), expected, "guarded gigatoken")
    assert guarded.rerouted == 1


def test_a_byte_level_vocabulary_without_every_byte_runs_on_gigatoken():
    """Granite's (StarCoder's) vocabulary has no token of 14 bytes: those UTF-8 never holds, and 0xF1, which only
    code points of planes 4-7 hold, which no Unicode version assigns. gigatoken, which needs a token for every byte
    (it refused: the run was hf's, at a few MB/s), is given one for each; every code point holding one of those bytes
    goes to hf, not only the probes' sample of the unassigned planes."""
    data = tokenizer_json("granite-3.1")
    fast = new_backend("gigatoken", data)
    assert fast.lacking == (0xC0, 0xC1, 0xF1, *range(0xF5, 0x100))
    texts = ["def f():\n    return 1\n", "plane 4 \U00040000 and \U0007fffe", "a flag \U0001f3f4\U000e0067\U000e007f"]
    choice, report = choose_encoder(data, "auto", texts, log=lambda _: None)
    assert choice.backend == "gigatoken", report
    assert np.isin(np.arange(0x40000, 0x80000), choice.unsafe_code_points()).all()
    encoder, reference = build_encoder(data, choice), encoders.HFEncoder(Tokenizer.from_str(data.decode()))
    assert_same_ids(encoder.encode_batch(texts), reference.encode_batch(texts), "guarded gigatoken")
    assert encoder.rerouted >= 1  # the second text, whose code points hold 0xF1


def test_unsafe_documents_are_found_in_sliced_arrays_of_every_utf8_width():
    fast = new_backend("hf", tokenizer_json("gpt2"))
    guard = GuardedEncoder(fast, fast, np.array([0xE9, 0x16EBB, 0x20AC]))
    texts = pa.array(["skip", "abc", "caf\u00e9", "\u20ac5", "x\U00016ebb", "\U0001f600 ok", "plain"])[1:]
    assert guard.documents_with_unsafe_code_points(texts).tolist() == [1, 2, 3]
    assert GuardedEncoder(fast, fast, np.array([0x16EBB])).documents_with_unsafe_code_points(texts).tolist() == [3]


@pytest.mark.parametrize("unsafe", [[0x88F, 0xC5C, 0xA7CE, 0xA7CF, *range(0x10940, 0x1095A), *range(0x323B0, 0x3347A)],
                                    [0x41, 0xE9, 0x905, 0x4E2D, 0x1F600]])  # fmt: skip
def test_unsafe_documents_are_found_among_texts_of_their_scripts(unsafe):
    """A text is sent to the reference where it holds an unsafe code point, whatever else it holds: here texts of
    code points drawn near the unsafe ones (the same first bytes of UTF-8, a neighbour) and from the scripts around
    them (Devanagari, CJK, emoji), against a plain Python check of each text."""
    fast = new_backend("hf", tokenizer_json("gpt2"))
    guard = GuardedEncoder(fast, fast, np.array(unsafe))
    rng = np.random.default_rng(57)
    near = np.array([c + d for c in unsafe[:: len(unsafe) // 5] for d in (-65, -1, 0, 1, 64) if 0 < c + d < 0x110000])
    pool = np.concatenate([near, np.arange(0x900, 0x980), np.arange(0x4E00, 0x4F00), np.arange(0x1F600, 0x1F650)])
    pool = pool[(pool < 0xD800) | (pool > 0xDFFF)]
    texts = ["".join(map(chr, rng.choice(pool, size=int(rng.integers(1, 12))))) for _ in range(3000)]
    expected = [k for k, text in enumerate(texts) if set(map(ord, text)) & set(unsafe)]
    assert 100 < len(expected) < 2900
    assert guard.documents_with_unsafe_code_points(pa.array(texts)).tolist() == expected


def test_splice_replaces_only_the_given_documents():
    flat, lengths = np.array([1, 2, 3, 4, 5, 6], np.uint32), np.array([2, 0, 3, 1])
    out, out_lengths = encoders.splice(
        flat, lengths, np.array([1, 3]), np.array([9, 9, 8], np.uint32), np.array([2, 1])
    )
    assert out.tolist() == [1, 2, 9, 9, 3, 4, 5, 8] and out_lengths.tolist() == [2, 2, 3, 1]


def test_a_requested_backend_that_cannot_be_exact_is_an_error():
    with pytest.raises(encoders.NotRepresentable, match="normalizer"):
        choose_encoder(tokenizer_json("gpt-neox-20b"), "tiktoken", [], log=lambda _: None)
    choice, _ = choose_encoder(tokenizer_json("gpt2"), "hf", [], log=lambda _: None)
    assert choice == EncoderChoice("hf", choice.version, "requested in the config")
