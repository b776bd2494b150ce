"""The reference's (HF tokenizers) ids of the documents the run's encoder was verified on, kept in the build
(`layout.REFERENCE_IDS`, by the sha256 of each text) so that validate, which compares stored ids with the
reference's, does not encode them again: a small corpus is verified and checked whole, and the reference encodes a
few MB a second where the fast backends encode hundreds.

And how the reference encodes with its memory bounded whatever the documents: texts in runs of a bounded size
(`encoders.in_runs`), a long document's excerpt for the encoders' verification (`excerpt`), and for validate's check
of a long document's stored ids, an excerpt between two places where the reference splits the text as if it were
two (`checked_excerpt`), compared with the stored ids that cover it."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import Tokenizer

from tokenmill.core import layout
from tokenmill.io.storage import Store
from tokenmill.tokenizers.encoders import TokenOffsets, clean_cut, in_runs


def text_digests(texts: Sequence[str]) -> list[bytes]:
    return [hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest() for text in texts]


def keep_reference_ids(store: Store, tokenizer_sha256: str, texts: Sequence[str], flat, lengths) -> None:
    """Keep the reference's ids of `texts` (`flat` and `lengths`, as `Encoder.encode_batch` gives them) for the
    tokenizer whose sha256 is `tokenizer_sha256`."""
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    table = pa.table(
        {
            "text_sha256": pa.array(text_digests(texts), pa.binary(32)),
            "ids": pa.LargeListArray.from_arrays(offsets, pa.array(np.asarray(flat, np.uint32))),
        },
        metadata={"tokenizer_sha256": tokenizer_sha256},
    )
    with store.writing(layout.REFERENCE_IDS) as tmp:
        pq.write_table(table, tmp)


def reference_ids(
    store: Store, tokenizer_sha256: str, texts: Sequence[str], reference: Tokenizer, piece_bytes: int
) -> list[list[int]]:
    """The reference's ids of each of `texts`: those kept for this tokenizer (`keep_reference_ids`), and the rest
    encoded by `reference` (HF tokenizers, with no special tokens added, as the encoders encode), at most
    `piece_bytes` of text at once."""
    rows: dict[bytes, int] = {}  # a kept text's row
    try:  # one request on an object store (asking whether a missing object exists was a HEAD and a listing)
        table = pq.read_table(pa.BufferReader(store.read_bytes(layout.REFERENCE_IDS)))
    except FileNotFoundError:
        table = None
    if table is not None and table.schema.metadata.get(b"tokenizer_sha256") == tokenizer_sha256.encode():
        rows = {digest: row for row, digest in enumerate(table.column("text_sha256").to_pylist())}
    digests = text_digests(texts)
    missing = [k for k, digest in enumerate(digests) if digest not in rows]
    encoded = {}
    for run in in_runs([texts[k] for k in missing], piece_bytes):
        encodings = reference.encode_batch_fast([texts[k] for k in missing[run]], add_special_tokens=False)
        encoded |= {k: encoding.ids for k, encoding in zip(missing[run], encodings, strict=True)}
    return [encoded[k] if k in encoded else table.column("ids")[rows[d]].as_py() for k, d in enumerate(digests)]


# --- long documents: the reference encodes a bounded excerpt of them --------------------------------------------


VERIFY_BYTES, CHECK_BYTES = 2_000_000, 4_000_000  # tokenizer.verify_bytes and check_bytes: auto, in a large run
RUN_SHARE = 0.02  # auto in a smaller run: this share of its input ...
SAMPLE_FLOOR = 256 << 10  # ... but never less than this


def sized_to_the_run(setting: int | str, auto: int, input_bytes: int) -> int:
    """The bytes of text a sample that hf encodes holds (`tokenizer.verify_bytes`, `check_bytes`): the setting, or
    with `auto`, `auto` bytes, or for a smaller run RUN_SHARE of its input, at least SAMPLE_FLOOR. hf encodes a few MB
    a second a core, the fast backends hundreds: 4 MB of a 12 MB run cost hf more CPU than tokenizing the run."""
    if setting != "auto":
        return int(setting)
    return min(auto, max(SAMPLE_FLOOR, int(RUN_SHARE * input_bytes)))


LEAST_EXCERPT = 16 << 10  # the least text a long document gives a sample that hf encodes


def excerpt_bytes(share: int, piece_bytes: int) -> int:
    """The size of a long document's excerpt in a sample that hf encodes, where its shard's part of the sample is
    `share` bytes: that share (a sample of a few MB spread over many shards of books would hold an excerpt of
    `tokenizer.reference_piece_bytes` from each, several times the sample's bytes), at least LEAST_EXCERPT, at most
    `piece_bytes` (the most hf encodes at once)."""
    return min(piece_bytes, max(share, LEAST_EXCERPT))


def excerpt(text: str, most_bytes: int, seed: int) -> str:
    """`text`, or where it is longer than `most_bytes`, a run of its whole lines of about that size from a place
    drawn with `seed` (a sample holds it as a text of its own)."""
    if len(text) <= most_bytes // 4 or (size := len(text.encode("utf-8", "surrogatepass"))) <= most_bytes:
        return text
    chars = max(1, len(text) * most_bytes // size)  # about most_bytes of its UTF-8
    start = int(np.random.default_rng(seed).integers(0, len(text) - chars + 1))
    start = text.find("\n", start) + 1 if start else 0  # 0 also where no line starts after it
    end = text.rfind("\n", start, start + chars) + 1 or start + chars
    return text[start:end]


@dataclass(frozen=True)
class Excerpt:
    """What the reference checks of a long document: its text from `start` to `end` (characters) against the stored
    ids from `first` to `last` (those whose bytes lie there)."""

    text: str
    first: int
    last: int


def checked_excerpt(
    tok: Tokenizer, offsets: TokenOffsets | None, text: str, ids: np.ndarray, most_bytes: int, rng: np.random.Generator
) -> Excerpt | str:
    """The excerpt of a long document that the reference checks: about `most_bytes` of its text from a random place,
    between two clean cuts of the reference's, and the stored `ids` that cover those bytes. A string says why there
    is none: the tokenizer's offsets cannot be told from its ids (`TokenOffsets`), the stored ids do not cover the
    text, no clean cut was found, or the stored ids have no boundary where the reference has one (they differ)."""
    if offsets is None:
        return "skipped: the places of this tokenizer's tokens in a text cannot be told from its ids"
    start = clean_cut(tok, text, int(rng.integers(0, max(1, len(text) - most_bytes))))
    end = None if start is None else clean_cut(tok, text, start + max(1, most_bytes // 4))
    while end is not None and end < len(text) and len(text[start:end].encode("utf-8", "surrogatepass")) < most_bytes:
        end = clean_cut(tok, text, end + max(1, most_bytes // 4))  # a run of lines of about most_bytes
    if start is None or end is None:
        return "skipped: no line start within reach where the reference splits it cleanly"
    places = [len(text[:at].encode("utf-8", "surrogatepass")) for at in (start, end)]
    found = tokens_at(offsets, ids, text, places)
    if found is None:
        return "wrong: its stored ids do not cover its text"
    if None in found:
        return "wrong: its stored ids have no token boundary where the reference's have one"
    return Excerpt(text[start:end], *found)


PLACES_RUN = 1 << 20  # stored ids looked at a run at a time (tokens_at): memory bounded whatever the document


def tokens_at(offsets: TokenOffsets, ids: np.ndarray, text: str, places: list[int]) -> list[int | None] | None:
    """The index of the stored token that starts at each of `places` (bytes of `text`; its end: len(ids)), None where
    none starts there; None for all where the ids do not cover the text exactly."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if offsets.strips[ids].any():  # added tokens that take whitespace beside them: the whole encoding's offsets
        spans, tiles = offsets.of_batch(np.asarray(ids), np.array([len(ids)]), [text.encode("utf-8", "surrogatepass")])
        starts = np.append(spans[:, 0], size)
        found = [int(k) if (k := np.searchsorted(starts, p)) < len(starts) and starts[k] == p else None for p in places]
        return found if tiles[0] else None
    # Metaspace's space before a text is in its first token's vocabulary entry, not in the text
    at = -1 if len(ids) and offsets.spaced[ids[0]] and not text.startswith(" ") else 0
    found: list[int | None] = [len(ids) if p == size else None for p in places]
    for first in range(0, len(ids), PLACES_RUN):
        sizes = offsets.lengths[ids[first : first + PLACES_RUN]]
        starts = at + np.cumsum(sizes) - sizes
        for k, place in enumerate(places):
            if found[k] is None and (j := int(np.searchsorted(starts, place))) < len(starts) and starts[j] == place:
                found[k] = first + j
        at += int(sizes.sum())
    return found if at == size else None
