"""The reference's (HF tokenizers) ids of the documents the run's encoder was verified on, kept in the build
(`layout.REFERENCE_IDS`, by the sha256 of each text) so that validate, which compares stored ids with the
reference's, does not encode them again: a small corpus is verified and checked whole, and the reference encodes a
few MB a second where the fast backends encode hundreds."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import Tokenizer

from tokenmill import layout
from tokenmill.storage import Store


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


def reference_ids(store: Store, tokenizer_sha256: str, texts: Sequence[str], reference: Tokenizer) -> list[list[int]]:
    """The reference's ids of each of `texts`: those kept for this tokenizer (`keep_reference_ids`), and the rest
    encoded by `reference` (HF tokenizers, with no special tokens added, as the encoders encode)."""
    rows: dict[bytes, int] = {}  # a kept text's row
    if store.exists(layout.REFERENCE_IDS):
        with store.local_copies(layout.REFERENCE_IDS) as (path,):
            table = pq.read_table(path)
        if table.schema.metadata.get(b"tokenizer_sha256") == tokenizer_sha256.encode():
            rows = {digest: row for row, digest in enumerate(table.column("text_sha256").to_pylist())}
    digests = text_digests(texts)
    missing = [k for k, digest in enumerate(digests) if digest not in rows]
    encodings = reference.encode_batch_fast([texts[k] for k in missing], add_special_tokens=False)
    encoded = {k: encoding.ids for k, encoding in zip(missing, encodings, strict=True)}
    return [encoded[k] if k in encoded else table.column("ids")[rows[d]].as_py() for k, d in enumerate(digests)]
