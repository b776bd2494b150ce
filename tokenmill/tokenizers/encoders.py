"""Encoder backends: one small interface over HF `tokenizers` (the reference), `gigatoken` and `tiktoken`,
and the choice among them that keeps every document's ids identical to the reference.

An encoder takes a batch of texts (a pyarrow string array: the UTF-8 bytes and offsets as the readers
produce them, or a list of str) and returns all ids as one flat uint32 array plus each document's length.

Exactness is measured, never assumed. The fast backends evaluate the pre-tokenizer regex with their own
Unicode tables, which differ from the reference's for some code points (gigatoken's are Unicode 17,
`tokenizers`' older: newly assigned letters such as U+16EBB split differently). So before a backend is
used, `probe_code_points` encodes every code point in a few contexts with both and records the ones that
disagree; any document containing one of those is encoded by the reference instead (`GuardedEncoder`).
`choose_encoder` then checks the guarded backend on a sample of real documents and on the tokenizer's
own special tokens, and picks the fastest backend that reproduces the reference exactly. The choice is a
small `EncoderChoice` (backend, version, reason, unsafe code point ranges) made once per run and passed to
every shard task; `load_encoder` rebuilds the encoder from it once per worker process.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import importlib.metadata
import itertools
import json
import os
import re
import stat
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import orjson
import psutil
import pyarrow as pa
from tokenizers import Tokenizer

from tokenmill.io.buffers import scan_parts
from tokenmill.tokenizers.tiktoken_convert import byte_to_unicode, in_gigatoken_spelling

BACKENDS = ("gigatoken", "tiktoken", "hf")  # fastest first: `auto` takes the first one that is exact
Texts = pa.Array | Sequence[str]


class Encoder(Protocol):
    name: str
    version: str

    def encode_batch(self, texts: Texts) -> tuple[np.ndarray, np.ndarray]:
        """(every document's ids back to back as uint32, each document's number of ids as int64)."""


class NotRepresentable(ValueError):
    """The backend cannot encode this tokenizer exactly (the message says why)."""


def package_version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def as_arrow(texts: Texts) -> pa.Array:
    """Texts as one pyarrow string array (a list of str is copied once into a UTF-8 buffer)."""
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    return texts if isinstance(texts, pa.Array) else pa.array(texts, pa.string())


def as_list(texts: Texts) -> list[str]:
    return texts.to_pylist() if isinstance(texts, pa.Array | pa.ChunkedArray) else list(texts)


def utf8_buffer(texts: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The UTF-8 bytes of a string array and its int64 offsets into them (zero-copy for the bytes)."""
    offset_type = np.int64 if pa.types.is_large_string(texts.type) else np.int32
    _, offsets_buffer, data_buffer = texts.buffers()
    offsets = np.frombuffer(offsets_buffer, offset_type, len(texts) + 1, texts.offset * np.dtype(offset_type).itemsize)
    data = np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    return data, offsets.astype(np.int64)


HF_RUN_BYTES = 1 << 20  # hf holds ~200 bytes of memory per byte of text it encodes at once: a run at a time


def in_runs(texts: Sequence[str], most_bytes: int) -> Iterator[slice]:
    """Consecutive runs of `texts` holding at most `most_bytes` of text each (a longer text alone)."""
    start = held = 0
    for end, text in enumerate(texts):
        if end > start and held + len(text) > most_bytes:
            yield slice(start, end)
            start, held = end, 0
        held += len(text)
    yield slice(start, len(texts))  # the last run (empty for no texts)


def flatten(id_lists: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter(map(len, id_lists), np.int64, len(id_lists))
    flat = np.fromiter(itertools.chain.from_iterable(id_lists), np.uint32, int(lengths.sum()))
    return flat, lengths


CUT_CONTEXT = 2048  # characters on each side of a cut within which the reference must split alike
CUT_TRIES = 16  # line starts tried for a cut before a document is said to have none


def is_clean_cut(tok: Tokenizer, text: str, at: int) -> bool:
    """Whether the reference splits `text` at `at` as if it were two texts: around it, the ids of the two sides
    encoded apart are those of both encoded together (no token spans it, nothing before it changes what follows)."""
    lo, hi = max(0, at - CUT_CONTEXT), min(len(text), at + CUT_CONTEXT)
    both, left, right = tok.encode_batch_fast([text[lo:hi], text[lo:at], text[at:hi]], add_special_tokens=False)
    return both.ids == left.ids + right.ids


def clean_cut(tok: Tokenizer, text: str, near: int) -> int | None:
    """The first line start at or after `near` where the reference splits `text` cleanly (`is_clean_cut`), among
    the next CUT_TRIES; the text's end where it comes first; None where none of them is clean."""
    at = near
    for _ in range(CUT_TRIES):
        if at >= len(text):
            return len(text)
        if at == 0 or (text[at - 1] == "\n" and is_clean_cut(tok, text, at)):
            return at
        at = text.find("\n", at) + 1 or len(text)
    return None


def clean_byte_pieces(tok: Tokenizer, data: np.ndarray, most_bytes: int) -> Iterator[str]:
    """`in_clean_pieces` of a text given as its UTF-8 bytes (`data`, a view of a batch's buffer): no more than a piece
    and the windows around its cuts are ever decoded, so a document of tens of MB costs the memory of a piece."""
    start = 0
    while start < len(data):
        cut = len(data)
        at = start + most_bytes
        for _ in range(CUT_TRIES):
            if at >= len(data) or (data[at - 1] == NEWLINE and clean_byte_cut(tok, data, at)):
                cut = min(at, len(data))
                break
            at = next_line_start(data, at)
        yield bytes(data[start:cut]).decode()  # a cut follows a line break: never inside a character
        start = cut


NEWLINE = ord("\n")


def next_line_start(data: np.ndarray, at: int, step: int = 1 << 20) -> int:
    """Where the line after byte `at` of `data` starts (its end where there is none)."""
    while at < len(data):
        found = np.flatnonzero(data[at : at + step] == NEWLINE)
        if len(found):
            return at + int(found[0]) + 1
        at += step
    return len(data)


def clean_byte_cut(tok: Tokenizer, data: np.ndarray, at: int) -> bool:
    """`is_clean_cut` at byte `at` (a line start) of UTF-8 bytes, on the text around it."""
    lo, hi = max(0, at - 4 * CUT_CONTEXT), min(len(data), at + 4 * CUT_CONTEXT)
    left = bytes(data[lo:at]).decode(errors="ignore")  # a character cut at the window's edge is left out
    return is_clean_cut(tok, left + bytes(data[at:hi]).decode(errors="ignore"), len(left))


def in_clean_pieces(tok: Tokenizer, text: str, most_bytes: int) -> Iterator[str]:
    """`text` in consecutive pieces of about `most_bytes`, cut only where the reference splits it cleanly
    (`clean_cut`): their ids back to back are the text's. Where no clean cut is within reach of a piece's end (a
    text without line breaks, a tokenizer that puts something before every text), the rest goes whole."""
    start = 0
    while start < len(text):
        cut = clean_cut(tok, text, start + most_bytes) or len(text)
        yield text[start:cut]
        start = cut


class HFEncoder:
    """HF `tokenizers`: the reference every other backend must reproduce."""

    name = "hf"

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.version = package_version("tokenizers")

    def encode_batch(self, texts: Texts) -> tuple[np.ndarray, np.ndarray]:
        """Runs of texts of at most HF_RUN_BYTES at a time; a longer text in pieces between clean cuts
        (`in_clean_pieces`): the same ids, with memory bounded whatever the documents."""
        texts, runs = as_list(texts), []
        for run in in_runs(texts, HF_RUN_BYTES):
            if run.stop - run.start == 1 and len(texts[run.start]) > HF_RUN_BYTES:
                pieces = [self._ids(piece) for piece in in_clean_pieces(self.tokenizer, texts[run.start], HF_RUN_BYTES)]
                ids = np.concatenate([flat for flat, _ in pieces])
                runs.append((ids, np.array([len(ids)], np.int64)))
            else:
                runs.append(self._ids(texts[run]))
        if len(runs) == 1:
            return runs[0]
        return np.concatenate([f for f, _ in runs]), np.concatenate([n for _, n in runs])

    def _ids(self, texts: str | list[str]) -> tuple[np.ndarray, np.ndarray]:
        texts = [texts] if isinstance(texts, str) else texts
        return flatten([e.ids for e in self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)])

    @functools.cached_property
    def token_offsets(self) -> TokenOffsets | None:
        return TokenOffsets.of(self.tokenizer.to_str().encode())

    @functools.cached_property
    def token_places(self) -> TokenOffsets | None:
        """Where its tokens lie in a text (`TokenOffsets.of`, `as_hf_reports=False`)."""
        return TokenOffsets.of(self.tokenizer.to_str().encode(), as_hf_reports=False)


# The ASCII whitespace HF tokenizers strips beside an added token with lstrip or rstrip (Rust's is_whitespace; it
# also strips some non-ASCII spaces: an encoding with those there does not tile its text, and goes to the reference).
_SOLID = np.ones(256, bool)
_SOLID[[9, 10, 11, 12, 13, 32]] = False


@dataclass(frozen=True)
class TokenOffsets:
    """Where each token of an encoding lies in its text, from the ids alone, as HF tokenizers' offsets say (in
    bytes): what a fast backend, which gives ids only, needs for the loss masks of conversations. A token covers
    the bytes its vocabulary entry stands for (`▁` a space, `<0xNN>` one byte, a byte-level character its byte);
    an added token also the whitespace it strips; the first token not the space Metaspace puts before a text.
    Only for tokenizers whose offsets are that (`of` gives None otherwise), and each encoding is checked:
    where its tokens do not tile its text exactly, `of_ids` gives None and the caller asks the reference."""

    lengths: np.ndarray  # bytes of text each id stands for
    added: np.ndarray  # per id: an added token (matched in the text before the model sees it)
    strips: np.ndarray  # per id: 1 lstrip, 2 rstrip (bits) for added tokens that strip whitespace beside them
    spaced: np.ndarray  # per id, Metaspace's prepend_scheme first: it starts with the space put before a text
    found: re.Pattern  # the added tokens in a text, longest first, as HF matches them

    @classmethod
    def of(cls, tokenizer_json: bytes, as_hf_reports: bool = True) -> TokenOffsets | None:
        """`as_hf_reports=False`: where the tokens lie, also where HF tokenizers reports them otherwise (a ByteLevel
        post-processor's trim_offsets takes the spaces off the offsets it reports, not off the tokens)."""
        spec = orjson.loads(tokenizer_json)
        model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
        parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
        kinds = {part.get("type") for part in parts} - {None, "Split"}
        post = spec.get("post_processor") or {}
        processors = post.get("processors", [post]) if post.get("type") == "Sequence" else [post]
        if spec.get("normalizer") is not None or model.get("type") != "BPE" or len(kinds) != 1:
            return None  # a normalizer moves characters; other models and mixed pre-tokenizers are not modelled
        if as_hf_reports and any(p.get("type") == "ByteLevel" and p.get("trim_offsets") for p in processors):
            return None  # offsets trimmed of their spaces
        (kind,) = kinds
        (part,) = [p for p in parts if p.get("type") == kind]
        if kind == "Metaspace" and part.get("prepend_scheme", "always") in ("first", "never"):
            space = part.get("replacement", "▁")
            byte_fallback = re.compile(r"<0x[0-9A-F]{2}>") if model.get("byte_fallback") else None

            def length(token: str) -> int:
                if byte_fallback is not None and byte_fallback.fullmatch(token):
                    return 1
                return len(token.replace(space, " ").encode())

        elif kind == "ByteLevel" and not part.get("add_prefix_space"):
            byte_of = {ch: b for b, ch in byte_to_unicode().items()}

            def length(token: str) -> int:
                return sum(1 if ch in byte_of else len(ch.encode()) for ch in token)

        else:
            return None
        added = spec.get("added_tokens") or []
        size = max([*model["vocab"].values(), *(t["id"] for t in added)]) + 1
        lengths, strips, spaced = np.zeros(size, np.int64), np.zeros(size, np.uint8), np.zeros(size, bool)
        is_added = np.zeros(size, bool)
        prepends = kind == "Metaspace" and part.get("prepend_scheme") == "first"
        for token, id_ in model["vocab"].items():
            lengths[id_] = length(token)
            spaced[id_] = prepends and token.startswith(part.get("replacement", "▁"))
        for token in added:
            lengths[token["id"]] = len(token["content"].encode())
            strips[token["id"]] = token.get("lstrip", False) | token.get("rstrip", False) << 1
            spaced[token["id"]], is_added[token["id"]] = False, True
        contents = sorted((t["content"].encode() for t in added), key=len, reverse=True)
        return cls(lengths, is_added, strips, spaced, re.compile(b"|".join(map(re.escape, contents)) or b"(?!)"))

    def of_batch(self, ids: np.ndarray, lengths: np.ndarray, texts: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """Each token's (start, end) in its text's bytes, for a batch of encodings (`ids` back to back, `lengths`
        of each), and whether each encoding's tokens tile its text (where not, its offsets mean nothing)."""
        count = len(texts)
        conversation = np.repeat(np.arange(count), lengths)  # each token's text
        firsts = np.cumsum(lengths) - lengths
        text_lengths = np.fromiter(map(len, texts), np.int64, count)
        text_starts = np.cumsum(text_lengths) - text_lengths
        joined = b"".join(texts)
        sizes = self.lengths[ids]
        if len(ids):
            first = firsts[lengths > 0]
            after_space = np.frombuffer(joined, np.uint8)[np.minimum(text_starts, len(joined) - 1)] == ord(" ")
            spaced = first[self.spaced[ids[first]] & ~after_space[lengths > 0] & (text_lengths[lengths > 0] > 0)]
            sizes[spaced] -= 1  # the space Metaspace put before a text
        tiles = np.ones(count, bool)
        if self.strips[ids].any():  # added tokens that strip whitespace: every added token found in the texts
            at = np.flatnonzero(self.added[ids])
            found = np.array(
                [(i, *m.span()) for i, text in enumerate(texts) for m in self.found.finditer(text)], np.int64
            ).reshape(-1, 3)
            expected = np.bincount(conversation[at], minlength=count)
            tiles &= np.bincount(found[:, 0], minlength=count) == expected
            at, found = at[tiles[conversation[at]]], found[tiles[found[:, 0]]]
            wrong = found[:, 2] - found[:, 1] != sizes[at]
            tiles[found[wrong, 0]] = False
            starts, ends = found[:, 1] + text_starts[found[:, 0]], found[:, 2] + text_starts[found[:, 0]]
            solid = np.flatnonzero(_SOLID[np.frombuffer(joined, np.uint8)])  # where no whitespace is
            text_ends = (text_starts + text_lengths)[found[:, 0]]
            next_solid = np.minimum(np.append(solid, len(joined))[np.searchsorted(solid, ends)], text_ends)
            last_solid = np.maximum(
                np.insert(solid, 0, -1)[np.searchsorted(solid, starts)], text_starts[found[:, 0]] - 1
            )
            strips = self.strips[ids[at]]
            sizes[at] += np.where(strips & 2, next_solid - ends, 0) + np.where(strips & 1, starts - last_solid - 1, 0)
        ends = np.cumsum(sizes)
        ends -= (ends - sizes)[firsts][conversation] if len(ids) else 0  # from each text's start
        totals = np.zeros(count, np.int64)
        totals[lengths > 0] = ends[np.cumsum(lengths)[lengths > 0] - 1]
        tiles &= totals == text_lengths
        offsets = np.stack([ends - sizes, ends], axis=1)
        alone = offsets[:, 1] == 0  # that space alone: HF gives it the text's first character, before which it is
        offsets[alone, 1] = np.minimum(1, text_lengths[conversation[alone]])
        return offsets, tiles


class GigatokenEncoder:
    """gigatoken: reads the batch's UTF-8 buffer directly and returns flat ids, no Python object per document."""

    name = "gigatoken"

    def __init__(self, tokenizer_json: bytes):
        import gigatoken

        tokenizer_json = in_gigatoken_spelling(tokenizer_json)
        self.lacking: tuple[int, ...] = ()  # bytes the vocabulary has no token of (`every_byte_a_token`)
        try:
            try:
                self.tokenizer = gigatoken.Tokenizer.from_json(tokenizer_json)
            except RuntimeError as e:
                if "no single-byte vocab entry" not in str(e):
                    raise
                tokenizer_json, self.lacking = every_byte_a_token(tokenizer_json)
                self.tokenizer = gigatoken.Tokenizer.from_json(tokenizer_json)
        except RuntimeError as e:  # its Rust loader's refusal (a pre-tokenizer it does not know, say)
            raise NotRepresentable(f"gigatoken cannot load it ({str(e).splitlines()[0]})") from None
        self.version = package_version("gigatoken")
        self.loadable = tokenizer_json  # as it loaded: to start it afresh (`bound_cache`)
        self.cache_limit = CACHE_LIMIT_WITHOUT_DASK  # see `bound_cache`
        self.emptied: tuple[int, int] | None = None  # (process, its resident bytes) when its cache was last empty

    @property
    def parallel(self) -> bool:
        """A worker process owns one core: gigatoken's own thread pool only where it was given more (read at each
        call: an encoder loaded in the forkserver serves workers given their share of the cores since)."""
        return int(os.environ.get("RAYON_NUM_THREADS", "1")) > 1

    def encode_batch(self, texts: Texts) -> tuple[np.ndarray, np.ndarray]:
        import awkward as ak
        import gigatoken

        if self.tokenizer is None:  # its cache emptied (`empty_cache`): a fresh one, about 0.15 s
            self.tokenizer = gigatoken.Tokenizer.from_json(self.loadable)
        data, offsets = utf8_buffer(as_arrow(texts))
        strings = ak.contents.ListOffsetArray(
            ak.index.Index64(offsets),
            ak.contents.NumpyArray(data, parameters={"__array__": "char"}),
            parameters={"__array__": "string"},
        )
        layout = self.tokenizer.encode_batch(ak.Array(strings), parallel=self.parallel).layout
        ids_offsets = np.asarray(layout.offsets.data, dtype=np.int64)
        flat = np.asarray(layout.content.data, dtype=np.uint32)[ids_offsets[0] : ids_offsets[-1]]
        self._bound_cache()
        return flat, np.diff(ids_offsets)

    def _bound_cache(self) -> None:
        """gigatoken keeps the ids of every distinct piece of text it has split off and drops none, so on text with
        few spaces (Chinese, Japanese: nearly every clause a new piece) a process grows with the corpus. Once this
        process's memory passes `cache_limit`, a fresh tokenizer replaces it (about 0.15 s; the same ids), if the
        process has grown by an eighth of the limit since the last (what else it holds is not this cache's to free).
        Its own memory: not the pages of files it maps (the input's), which the system takes back as it needs."""
        here, resident = os.getpid(), anonymous_memory()
        if self.emptied is None or self.emptied[0] != here:  # a forked worker's first batch
            self.emptied = (here, resident)
        if resident > self.cache_limit and resident - self.emptied[1] > self.cache_limit // 8:
            self.empty_cache()

    def empty_cache(self) -> None:
        """Let go of the tokenizer and its cache, and hand the memory back to the system; the next batch builds a
        fresh one (the same ids)."""
        self.tokenizer = None
        return_freed_memory()
        self.emptied = (os.getpid(), anonymous_memory())  # what `_bound_cache` counts growth from


def return_freed_memory() -> None:
    """Hand the memory this process has freed back to the system (glibc's `malloc_trim`), which glibc otherwise keeps
    for its next allocations: the cache's millions of small ones, freed, left the process as large as before."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc
        ctypes.CDLL(None).malloc_trim(0)


def anonymous_memory() -> int:
    """This process's resident memory that no file backs, in bytes."""
    memory = psutil.Process().memory_info()
    return memory.rss - getattr(memory, "shared", 0)  # Linux: the pages of files (and shared memory) it maps


CACHE_LIMIT_WITHOUT_DASK = 2 << 30  # tokenizer.encoder_cache_limit auto, off a Dask worker or one without a limit


def empty_encoder_caches() -> None:
    """Empty the caches of this process's fast encoders (gigatoken's) once its tokenize stage has ended: validate's
    reference check (hf, about 200 bytes a byte of the text it encodes at once) came on top of a cache of the whole
    stage's pieces, and a worker of 600 MiB on Chinese text was restarted there."""
    for encoder in LOADED.values():
        if isinstance(encoder, GigatokenEncoder):
            encoder.empty_cache()


def bound_cache(encoder: Encoder, limit: int) -> None:
    """Have `encoder`'s fast backend, if it keeps a cache that grows with the text (gigatoken), start it empty again
    whenever this process's memory passes `limit` (tokenizer.encoder_cache_limit)."""
    fast = getattr(encoder, "fast", encoder)
    if isinstance(fast, GigatokenEncoder):
        fast.cache_limit = limit


def every_byte_a_token(tokenizer_json: bytes) -> tuple[bytes, tuple[int, ...]]:
    """A byte-level BPE as gigatoken can load it, which needs a token for every byte: the bytes its vocabulary has no
    token of (StarCoder's and Granite's lack those UTF-8 never holds, and 0xF1, which only code points no Unicode
    version assigns hold) each given one, with an id past the others; and those bytes. A document holding a code
    point whose UTF-8 holds one of them is encoded by hf (`cached_unsafe_code_points`), so these ids are never
    written."""
    spec = orjson.loads(tokenizer_json)
    vocab, chars = spec["model"]["vocab"], byte_to_unicode()
    lacking = tuple(b for b, ch in chars.items() if ch not in vocab)
    after = max([*vocab.values(), *(t["id"] for t in spec.get("added_tokens") or [])]) + 1
    vocab |= {chars[b]: after + k for k, b in enumerate(lacking)}
    return orjson.dumps(spec), lacking


def code_points_holding(byte_values: Sequence[int]) -> np.ndarray:
    """Every code point whose UTF-8 holds any of `byte_values`."""
    cp = np.arange(0x110000, dtype=np.int64)
    cp = cp[(cp < 0xD800) | (cp >= 0xE000)]
    length = np.select([cp < 0x80, cp < 0x800, cp < 0x10000], [1, 2, 3], 4)
    lead = np.select([length == 1, length == 2, length == 3], [cp, 0xC0 | cp >> 6, 0xE0 | cp >> 12], 0xF0 | cp >> 18)
    holding = np.isin(lead, byte_values)
    for k, shift in enumerate((0, 6, 12)):  # the last, second last and third last continuation bytes
        holding |= (length > k + 1) & np.isin(0x80 | (cp >> shift) & 0x3F, byte_values)
    return cp[holding]


GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def tiktoken_parts(tokenizer_json: bytes) -> tuple[str, dict[bytes, int], dict[str, int], np.ndarray]:
    """What a `tiktoken.Encoding` equal to this byte-level BPE needs: split pattern, mergeable ranks, special
    tokens, and the map from tiktoken's ranks to the tokenizer's ids. Raises NotRepresentable otherwise."""
    spec = orjson.loads(tokenizer_json)
    model = spec["model"]
    if model.get("type") != "BPE":
        raise NotRepresentable(f"a {model.get('type')} model is not a BPE")
    if model.get("byte_fallback") or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise NotRepresentable("a SentencePiece-style BPE (byte fallback or subword affixes) is not byte-level")
    if spec.get("normalizer") is not None:
        raise NotRepresentable(f"tiktoken has no normalizer ({spec['normalizer'].get('type')})")
    pattern = _split_pattern(spec.get("pre_tokenizer"))
    added = spec.get("added_tokens") or []
    if any(t.get("single_word") or t.get("lstrip") or t.get("rstrip") for t in added):
        raise NotRepresentable("added tokens with single_word/lstrip/rstrip match differently in tiktoken")
    contents = [t["content"] for t in added]
    if any(a != b and b.startswith(a) for a in contents for b in contents):
        raise NotRepresentable("an added token is a prefix of another (tiktoken does not match longest first)")

    byte_of = {ch: b for b, ch in byte_to_unicode().items()}
    vocab: dict[str, int] = model["vocab"]
    merges = [m.split(" ", 1) if isinstance(m, str) else m for m in model["merges"]]

    def raw(token: str) -> bytes:
        return bytes(byte_of[ch] for ch in token)

    # tiktoken merges the adjacent pair whose concatenation has the lowest rank; HF applies merges in list
    # order. Ranks in merge order (single bytes first) make the two agree.
    ranks: dict[bytes, int] = {}
    try:
        for b, ch in byte_to_unicode().items():
            if ch not in vocab:
                raise NotRepresentable(f"byte {b} is not in the vocabulary")
            ranks[bytes([b])] = len(ranks)
        ids = [vocab[ch] for ch in byte_to_unicode().values()]
        for left, right in merges:
            merged = raw(left + right)
            if merged in ranks:
                raise NotRepresentable(f"two merges make the same token {left + right!r}")
            ranks[merged] = len(ranks)
            ids.append(vocab[left + right])
    except KeyError as e:
        raise NotRepresentable(f"a token is not written in GPT-2's byte alphabet ({e})") from e
    if leftover := set(vocab) - {t["content"] for t in added} - {"".join(map(byte_to_unicode().get, r)) for r in ranks}:
        raise NotRepresentable(f"{len(leftover)} vocabulary entries are neither bytes, merges nor added tokens")
    specials = {content: len(ranks) + i for i, content in enumerate(contents)}
    ids += [t["id"] for t in added]
    return pattern, ranks, specials, np.array(ids, dtype=np.uint32)


def _split_pattern(pre_tokenizer: dict | None) -> str:
    """The single regex a pre-tokenizer splits with, when it is just a regex split plus the byte-level map."""
    if pre_tokenizer is None:
        raise NotRepresentable("no pre-tokenizer")
    kind = pre_tokenizer.get("type")
    if kind == "ByteLevel":
        if pre_tokenizer.get("add_prefix_space") or not pre_tokenizer.get("use_regex", True):
            raise NotRepresentable("ByteLevel with add_prefix_space, or without its regex")
        return GPT2_PATTERN
    steps = pre_tokenizer.get("pretokenizers", []) if kind == "Sequence" else []
    if (
        len(steps) == 2
        and steps[0].get("type") == "Split"
        and "Regex" in steps[0].get("pattern", {})
        and steps[0].get("behavior") == "Isolated"
        and not steps[0].get("invert")
        and steps[1].get("type") == "ByteLevel"
        and not steps[1].get("use_regex", True)
        and not steps[1].get("add_prefix_space")
    ):
        return steps[0]["pattern"]["Regex"]
    raise NotRepresentable(f"the pre-tokenizer ({kind} of {[s.get('type') for s in steps]}) is not one regex split")


class TiktokenEncoder:
    """tiktoken, for byte-level BPE tokenizers it can represent exactly (see `tiktoken_parts`)."""

    name = "tiktoken"

    def __init__(self, tokenizer_json: bytes):
        import tiktoken

        pattern, ranks, specials, self.ids_of_ranks = tiktoken_parts(tokenizer_json)
        self.encoding = tiktoken.Encoding("tokenmill", pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
        self.version = package_version("tiktoken")

    def encode_batch(self, texts: Texts) -> tuple[np.ndarray, np.ndarray]:
        # HF splits added tokens out of the text too, so every special is allowed.
        encode = functools.partial(self.encoding.encode, allowed_special="all", disallowed_special=())
        flat, lengths = flatten(list(map(encode, as_list(texts))))
        return self.ids_of_ranks[flat], lengths


class GuardedEncoder:
    """A fast backend whose documents containing a code point it was seen to mishandle go to the reference."""

    def __init__(self, fast: Encoder, reference: HFEncoder, unsafe: np.ndarray):
        self.fast, self.reference = fast, reference
        self.name, self.version = fast.name, fast.version
        self.unsafe = np.zeros(0x110000, dtype=bool)  # a lookup table indexed by code point
        self.unsafe[unsafe] = True
        self.lowest_unsafe = int(unsafe.min()) if len(unsafe) else 0x110000
        # The first two bytes of each unsafe code point's UTF-8 (of those past ASCII): a lead byte that starts none is
        # not decoded. Devanagari's and CJK's letters share lead bytes with unsafe code points of their blocks, but
        # not second bytes, and decoding each letter cost about as much as encoding the text.
        self.unsafe_starts = np.zeros(1 << 16, dtype=bool)
        wide = unsafe[unsafe >= 0x80].astype(np.int64)
        length = np.select([wide < 0x800, wide < 0x10000], [2, 3], 4)
        lead = np.select([length == 2, length == 3], [0xC0 | wide >> 6, 0xE0 | wide >> 12], 0xF0 | wide >> 18)
        self.unsafe_starts[lead << 8 | (0x80 | (wide >> (6 * (length - 2))) & 0x3F)] = True
        self.unsafe_leads = np.unique(lead).tolist()  # GPT-2's: 0xE0, 0xEA, 0xF0 (CJK's letters start 0xE3-0xE9)
        self.rerouted = 0  # documents encoded by the reference so far (for the stats)

    def encode_batch(self, texts: Texts) -> tuple[np.ndarray, np.ndarray]:
        texts = as_arrow(texts)
        flat, lengths = self.fast.encode_batch(texts)
        suspicious = self.documents_with_unsafe_code_points(texts)
        if not len(suspicious):
            return flat, lengths
        self.rerouted += len(suspicious)
        exact_flat, exact_lengths = self.reference.encode_batch(texts.take(pa.array(suspicious)))
        return splice(flat, lengths, suspicious, exact_flat, exact_lengths)

    def _may_lead(self, part: np.ndarray, lowest_lead: int) -> np.ndarray:
        """Where `part`'s bytes may start an unsafe code point: those past the lowest such lead byte (one comparison:
        few, in text of Latin letters), or in text of other scripts, whose every letter passes it, each of the few
        lead bytes that start one (GPT-2's: 0xE0, 0xEA, 0xF0; CJK's letters start 0xE3 to 0xE9)."""
        past = part >= lowest_lead
        if len(self.unsafe_leads) > 4 or np.count_nonzero(past) < len(part) // 64:
            return past
        return functools.reduce(np.logical_or, (part == lead for lead in self.unsafe_leads))

    def documents_with_unsafe_code_points(self, texts: pa.Array) -> np.ndarray:
        """Indexes of the documents holding an unsafe code point, by decoding only the UTF-8 lead bytes
        that can start one (vectorised over the whole batch)."""
        if self.lowest_unsafe >= 0x110000:
            return np.zeros(0, np.int64)
        data, offsets = utf8_buffer(texts)
        data = data[: offsets[-1]]
        lowest_lead = 0 if self.lowest_unsafe < 0x80 else (0xC0 if self.lowest_unsafe < 0x800 else 0xE0)
        if self.lowest_unsafe >= 0x10000:
            lowest_lead = 0xF0
        if lowest_lead:
            found = [np.flatnonzero(self._may_lead(part, lowest_lead)) + start for start, part in scan_parts(data)]
            leads = np.concatenate(found) if found else np.zeros(0, np.int64)
        else:
            leads = np.arange(len(data))
        leads = leads[leads >= offsets[0]]
        last = len(data) - 1  # only the bytes at and after the leads are widened, not the whole batch
        if lowest_lead:
            leads = leads[self.unsafe_starts[data[leads].astype(np.int64) << 8 | data[np.minimum(leads + 1, last)]]]
        if not len(leads):
            return np.zeros(0, np.int64)
        b0, b1, b2, b3 = (data[np.minimum(leads + k, last)].astype(np.uint32) for k in range(4))
        code_points = np.where(
            b0 < 0x80,
            b0,
            np.where(
                b0 < 0xE0,
                ((b0 & 0x1F) << 6) | (b1 & 0x3F),
                np.where(
                    b0 < 0xF0,
                    ((b0 & 0x0F) << 12) | ((b1 & 0x3F) << 6) | (b2 & 0x3F),
                    ((b0 & 0x07) << 18) | ((b1 & 0x3F) << 12) | ((b2 & 0x3F) << 6) | (b3 & 0x3F),
                ),
            ),
        )
        hits = leads[self.unsafe[np.minimum(code_points, 0x10FFFF)] & ((b0 < 0x80) | (b0 >= 0xC0))]
        return np.unique(np.searchsorted(offsets, hits, side="right") - 1)


def splice(
    flat: np.ndarray, lengths: np.ndarray, documents: np.ndarray, new_flat: np.ndarray, new_lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Replace the ids (or a value per token) of `documents` (sorted indexes) with `new_flat`/`new_lengths`, in
    one pass."""
    starts = np.concatenate([[0], np.cumsum(lengths)])
    new_starts = np.concatenate([[0], np.cumsum(new_lengths)])
    pieces, previous = [], 0
    for k, doc in enumerate(documents):  # only the few rerouted documents: not a per-document loop
        pieces += [flat[starts[previous] : starts[doc]], new_flat[new_starts[k] : new_starts[k + 1]]]
        previous = doc + 1
    pieces.append(flat[starts[previous] :])
    out_lengths = lengths.copy()
    out_lengths[documents] = new_lengths
    return np.concatenate(pieces).astype(flat.dtype, copy=False), out_lengths


# --- choosing a backend -------------------------------------------------------------------------------


@dataclass(frozen=True)
class EncoderChoice:
    """What every shard task needs to rebuild the chosen encoder: small, hashable, made once per run."""

    backend: str  # hf | gigatoken | tiktoken
    version: str  # of the backend's package
    reason: str
    unsafe: tuple[tuple[int, int], ...] = ()  # code point ranges (inclusive) whose documents go to hf

    def unsafe_code_points(self) -> np.ndarray:
        parts = [np.arange(lo, hi + 1) for lo, hi in self.unsafe]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def as_ranges(code_points: np.ndarray) -> tuple[tuple[int, int], ...]:
    code_points = np.unique(code_points)
    if not len(code_points):
        return ()
    breaks = np.flatnonzero(np.diff(code_points) != 1)
    starts = np.concatenate([[code_points[0]], code_points[breaks + 1]])
    ends = np.concatenate([code_points[breaks], [code_points[-1]]])
    return tuple((int(a), int(b)) for a, b in zip(starts, ends, strict=True))


def new_backend(backend: str, tokenizer_json: bytes) -> Encoder:
    """An unguarded encoder of `backend` for this tokenizer (ImportError / NotRepresentable if it cannot be)."""
    if backend == "hf":
        return HFEncoder(Tokenizer.from_str(tokenizer_json.decode()))
    if backend == "gigatoken":
        return GigatokenEncoder(tokenizer_json)
    if backend == "tiktoken":
        return TiktokenEncoder(tokenizer_json)
    raise ValueError(f"unknown encoder backend {backend!r}; expected one of {', '.join(BACKENDS)}")


def build_encoder(tokenizer_json: bytes, choice: EncoderChoice) -> Encoder:
    reference = HFEncoder(Tokenizer.from_str(tokenizer_json.decode()))
    return guarded(reference, new_backend(choice.backend, tokenizer_json) if choice.backend != "hf" else None, choice)


def guarded(reference: HFEncoder, fast: Encoder | None, choice: EncoderChoice) -> Encoder:
    """The chosen encoder from its backends: `fast` guarded by `reference`, or the reference alone (hf)."""
    if choice.backend == "hf":
        return reference
    if fast.version != choice.version:
        raise RuntimeError(
            f"{choice.backend} {fast.version} is installed here, but the run verified {choice.version}: "
            "install the same version on every worker"
        )
    return GuardedEncoder(fast, reference, choice.unsafe_code_points())


# Backends loaded in this process, by the tokenizer's sha256 and the backend's name: a tokenizer's bytes name it
# wherever they were read from (the LocalCluster's forkserver loads the configured file before the run has
# installed it in the output; see `preload_tokenizer`). A long-lived worker keeps the last few.
LOADED: dict[tuple[str, str], Encoder] = {}
KEPT_BACKENDS = 8


def keep_loaded(
    sha256: str, backend: str, tokenizer_json: bytes, warm: bool = True, parsed: Tokenizer | None = None
) -> Encoder:
    """`backend` for the tokenizer `tokenizer_json` (of that sha256), built, warmed (a process's first call into
    gigatoken costs about 0.3 s of one-time set-up, whatever the text) and kept in LOADED. `parsed`: the tokenizer
    as HF tokenizers read it, not yet used, which the hf backend takes rather than parse it again (0.07 s for
    GPT-2's)."""
    encoder = HFEncoder(parsed) if backend == "hf" and parsed is not None else new_backend(backend, tokenizer_json)
    if warm:
        encoder.encode_batch(["warm-up"])
    if len(LOADED) >= KEPT_BACKENDS:
        del LOADED[next(iter(LOADED))]
    LOADED[(sha256, backend)] = encoder
    return encoder


def loaded_backend(url: str, sha256: str, backend: str) -> Encoder:
    """An unguarded backend for the tokenizer at `url`, loaded (`keep_loaded`) once per process and tokenizer."""
    if (sha256, backend) in LOADED:
        return LOADED[(sha256, backend)]
    import fsspec

    with fsspec.open(url, "rb") as f:
        data = f.read()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise RuntimeError(f"{url} changed while the run was using it (sha256 differs)")
    return keep_loaded(sha256, backend, data)


@functools.lru_cache(maxsize=4)
def load_encoder(url: str, sha256: str, choice: EncoderChoice) -> Encoder:
    """The chosen encoder for the tokenizer at `url`, built once per worker process."""
    fast = loaded_backend(url, sha256, choice.backend) if choice.backend != "hf" else None
    return guarded(loaded_backend(url, sha256, "hf"), fast, choice)


def preload_backends(url: str, sha256: str, requested: str) -> None:
    """Load the backends a run with `tokenizer.encoder: requested` will most likely use, so that a worker's first
    shard does not wait for them (about 0.6 s per worker process)."""
    load_likely_backends(lambda backend: loaded_backend(url, sha256, backend), requested)


def preload_tokenizer(tokenizer_json: bytes, requested: str, parsed: Tokenizer | None = None) -> None:
    """`preload_backends` for a tokenizer in memory, in a process that forks workers (the LocalCluster's
    forkserver), so that they start with its encoders. Only the fast backend is warmed: the reference's first
    call would start its thread pool, whose threads a forked worker would not have (so `parsed`, the tokenizer
    as HF tokenizers read it, which the reference then is, must not have encoded anything)."""
    sha256 = hashlib.sha256(tokenizer_json).hexdigest()

    def load(backend: str) -> Encoder:
        return keep_loaded(sha256, backend, tokenizer_json, warm=backend != "hf", parsed=parsed)

    load_likely_backends(load, requested)


def load_likely_backends(load, requested: str) -> None:
    """`load(backend)` the reference, which guards every other backend, and the first fast backend installed that
    can represent the tokenizer, as `choose_encoder` tries them."""
    load("hf")
    for backend in BACKENDS if requested == "auto" else (requested,):
        if backend == "hf":
            return
        with contextlib.suppress(ImportError, NotRepresentable):
            load(backend)
            return


PROBE_VERSION = 1  # bump when the probes change: cached results of older probes are not reused


def probe_texts(code_points: np.ndarray) -> list[str]:
    """One short text per code point, in contexts where a different Unicode property changes the ids, not
    just the split: before a contraction ("'s" is one token only when split off alone), alone and after a
    letter (a letter joins a following letter, not punctuation)."""
    return [f"{c}'s a{c}'s\n" for c in map(chr, code_points)]


# No Unicode version to date (17.0) assigns a character in planes 4-13, so every encoder classifies them
# alike: they are probed sparsely, to catch an encoder that disagrees anyway, and the rest is probed whole.
UNASSIGNED_PLANES = (0x40000, 0xE0000)


def probed_code_points() -> np.ndarray:
    every = np.arange(0x110000, dtype=np.int64)
    surrogate = (every >= 0xD800) & (every < 0xE000)
    sparse = (every >= UNASSIGNED_PLANES[0]) & (every < UNASSIGNED_PLANES[1]) & (every % 61 != 0)
    return every[~surrogate & ~sparse]


def _differing(fast: Encoder, reference: Encoder, texts: list[str], expected=None) -> np.ndarray:
    """Indexes of the texts `fast` encodes differently from `reference` (whose encoding of them is `expected`,
    where given)."""
    fast_flat, fast_lengths = fast.encode_batch(texts)
    ref_flat, ref_lengths = reference.encode_batch(texts) if expected is None else expected
    if np.array_equal(fast_lengths, ref_lengths) and np.array_equal(fast_flat, ref_flat):
        return np.zeros(0, np.int64)
    fast_starts, ref_starts = np.cumsum(fast_lengths) - fast_lengths, np.cumsum(ref_lengths) - ref_lengths
    return np.array(
        [
            i
            for i in range(len(texts))
            if not np.array_equal(
                fast_flat[fast_starts[i] : fast_starts[i] + fast_lengths[i]],
                ref_flat[ref_starts[i] : ref_starts[i] + ref_lengths[i]],
            )
        ],
        dtype=np.int64,
    )


def probe_code_points(fast: Encoder, reference: Encoder, group: int = 64) -> np.ndarray:
    """Every code point `fast` splits differently from `reference` in any probe context. Probes go in groups
    (one text per `group` code points, cheap for the reference); a group that differs is probed point by
    point, and if no single point differs there, the whole group counts as unsafe."""
    code_points = probed_code_points()
    groups = [code_points[i : i + group] for i in range(0, len(code_points), group)]
    grouped_texts = ["".join(probe_texts(g)) for g in groups]
    unsafe = []
    for g in _differing(fast, reference, grouped_texts):
        single = _differing(fast, reference, probe_texts(groups[g]))
        unsafe.append(groups[g][single] if len(single) else groups[g])
    return np.concatenate(unsafe) if unsafe else np.zeros(0, np.int64)


def cache_dir(kind: str = "encoder-probes") -> Path:
    """Where tokenmill keeps what it worked out once for a tokenizer (`TOKENMILL_CACHE_DIR`, else ~/.cache)."""
    return Path(os.environ.get("TOKENMILL_CACHE_DIR", Path.home() / ".cache" / "tokenmill")) / kind


def _ours(path: Path) -> bool:
    """Whether `path` is a file or directory of this user's that no one else can write, and not a link."""
    try:
        found = path.lstat()
    except FileNotFoundError:
        return False
    return found.st_uid == os.getuid() and not found.st_mode & 0o022 and not stat.S_ISLNK(found.st_mode)


def read_cached(kind: str, name: str) -> bytes | None:
    """The file `name` of the cache `kind`, where this user wrote it: a cache file, or a directory above it, that
    another user owns or can write is not trusted (what it says would decide how a run encodes), and is ignored."""
    root, path = cache_dir(kind), cache_dir(kind) / name
    if not all(map(_ours, (root.parent, root, path))):
        return None
    with contextlib.suppress(OSError):
        with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
            return f.read()
    return None


def write_cached(kind: str, name: str, data: bytes) -> None:
    """Keep `data` as `name` in the cache `kind` (directories 0700, the file 0600, written whole then renamed)."""
    root = cache_dir(kind)
    with contextlib.suppress(OSError):  # a cache that cannot be written costs the next run its time, nothing more
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        for directory in (root.parent, root):
            if directory.lstat().st_uid == os.getuid():
                directory.chmod(0o700)
        tmp = root / f".{name}.{os.getpid()}.tmp"
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "wb") as f:
            f.write(data)
        os.replace(tmp, root / name)


def cached_unsafe_code_points(tokenizer_json: bytes, fast: Encoder, reference: HFEncoder) -> np.ndarray:
    """`probe_code_points`, remembered per tokenizer and backend versions (it costs seconds of reference time)."""
    digest = hashlib.sha256(tokenizer_json).hexdigest()[:16]
    name = f"{digest}-{fast.name}-{fast.version}-hf-{reference.version}-probe{PROBE_VERSION}.json"
    if (cached := read_cached("encoder-probes", name)) is not None:
        return np.array(json.loads(cached), dtype=np.int64)
    # Code points holding a byte without a token (`every_byte_a_token`): all of them, not the probes' sample of those
    # in unassigned planes
    unsafe = np.union1d(probe_code_points(fast, reference), code_points_holding(getattr(fast, "lacking", ())))
    write_cached("encoder-probes", name, json.dumps(unsafe.tolist()).encode())
    return unsafe


CHOICE_VERSION = 2  # bump when a kept choice's entry changes: another format's entries are not read (2: the reason
# kept is the manifest's own, the same as when a run verifies the choice itself)


def choice_cache_name(tokenizer_sha256: str, requested: str) -> str:
    """The name of a verified encoder choice in the cache: the tokenizer (its file's sha256), what was asked, and the
    versions of tokenmill and of every backend `auto` tries (one installed, upgraded or removed asks again)."""
    from tokenmill import __version__

    backends = [package_version(PACKAGES[b]) for b in BACKENDS]
    versions = [__version__, PROBE_VERSION, CHOICE_VERSION, requested, *backends]
    return f"{tokenizer_sha256}-{hashlib.sha256(json.dumps(versions).encode()).hexdigest()[:16]}.json"


PACKAGES = {"hf": "tokenizers", "gigatoken": "gigatoken", "tiktoken": "tiktoken"}


def cached_choice(tokenizer_sha256: str, requested: str) -> EncoderChoice | None:
    """The encoder an earlier run verified for this tokenizer, these backends' versions and this request, if any
    (`remember_choice`)."""
    if (cached := read_cached("encoder-choices", choice_cache_name(tokenizer_sha256, requested))) is None:
        return None
    try:
        kept = json.loads(cached)
        unsafe = tuple((int(lo), int(hi)) for lo, hi in kept["unsafe"])
        return EncoderChoice(kept["backend"], kept["version"], kept["reason"], unsafe)
    except (ValueError, KeyError, TypeError):  # a damaged entry: verified again
        return None


def remember_choice(tokenizer_sha256: str, requested: str, choice: EncoderChoice) -> None:
    """Keep a fast backend's choice, verified on a run's sample, for the next run of this tokenizer (`cached_choice`):
    its verification is hf's encoding of the sample, most of a small run's fixed cost."""
    entry = {"backend": choice.backend, "version": choice.version, "reason": choice.reason, "unsafe": choice.unsafe}
    write_cached("encoder-choices", choice_cache_name(tokenizer_sha256, requested), json.dumps(entry).encode())


def special_case_texts(tokenizer_json: bytes) -> list[str]:
    """The tokenizer's own special cases: each added token alone, inside words, doubled and among spaces."""
    added = [t["content"] for t in orjson.loads(tokenizer_json).get("added_tokens") or []]
    edges = ["", " ", "  ", "\n", "x y", "  \n\t", "ünïcödé", "日本語", "1234567", "'s 'LL", "\r\n", "a\u0301"]
    texts = edges + [f"{a}{tok}{b}" for tok in added for a, b in (("", ""), ("a", "b"), (" ", " "), (tok, "\n"))]
    return texts


def choose_encoder(
    tokenizer_json: bytes, requested: str, sample: Sequence[str], log=None, backend_of=None, expected=None
) -> tuple[EncoderChoice, dict]:
    """The backend to use: `requested`, or with `auto` the fastest installed one that reproduces the
    reference on `sample` and on the tokenizer's special cases once its unsafe code points are guarded.
    Returns the choice and a report of every candidate (why it was taken or not), and says the choice to `log`
    when given. `backend_of(name)` gives each backend (default: `new_backend`, loaded anew); `expected`, the
    reference's encoding of `sample` (`Encoder.encode_batch`), where the caller has it."""
    backend_of = backend_of or (lambda backend: new_backend(backend, tokenizer_json))
    reference = backend_of("hf")
    specials = special_case_texts(tokenizer_json)
    checks = [*specials, *sample]

    @functools.cache
    def expected_checks():  # the reference's encoding of the checks: once, whichever backends are checked
        if expected is None:
            return reference.encode_batch(checks)
        flat, lengths = reference.encode_batch(specials)
        return np.concatenate([flat, expected[0]]), np.concatenate([lengths, expected[1]])

    candidates = BACKENDS if requested == "auto" else (requested,)
    chosen_at = time.perf_counter()
    report: dict[str, str] = {}
    for backend in candidates:
        if backend == "hf":
            choice = EncoderChoice("hf", reference.version, "the reference (no faster backend was exact)")
            if requested == "hf":
                choice = EncoderChoice("hf", reference.version, "requested in the config")
            report["hf"] = choice.reason
            break
        try:
            fast = backend_of(backend)
        except ImportError as e:
            report[backend] = "not installed"
            if requested != "auto":
                raise ValueError(
                    f"tokenizer.encoder {backend}: not installed (pip install tokenmill[{backend}])"
                ) from e
            continue
        except NotRepresentable as e:
            report[backend] = f"cannot represent this tokenizer: {e}"
            if requested != "auto":
                raise
            continue
        unsafe = cached_unsafe_code_points(tokenizer_json, fast, reference)
        guarded = GuardedEncoder(fast, reference, unsafe)
        wrong = _differing(guarded, reference, checks, expected_checks())
        if len(wrong):
            report[backend] = f"{len(wrong)} of {len(checks)} verification texts differ from hf"
            if requested != "auto":
                raise ValueError(
                    f"tokenizer.encoder {backend}: {report[backend]} (e.g. {checks[wrong[0]][:80]!r}); use auto or hf"
                )
            continue
        # Neither the sample's size nor a timing: the reason goes into the manifest, which must be the same whether
        # this run verified the choice or took one an earlier run verified (`cached_choice`)
        on = "sampled documents and " if sample else ""
        reason = (
            f"identical to hf on {on}{len(specials)} special cases; "
            f"{len(unsafe)} code points it splits differently are routed to hf"
        )
        report[backend] = "chosen: " + reason
        choice = EncoderChoice(backend, fast.version, reason, as_ranges(unsafe))
        break
    if log is not None:
        took = time.perf_counter() - chosen_at
        log(f"encoder: {choice.backend} {choice.version}: {choice.reason} ({len(sample)} documents, {took:.1f} s)")
    return choice, report
