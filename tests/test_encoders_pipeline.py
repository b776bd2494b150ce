"""The tokenize stage's batch path around the encoder: BOS/EOD insertion and the JSONL columnar fast path,
which must give exactly what the careful record-by-record path gives, rejects included."""

from __future__ import annotations

import numpy as np
import orjson

from tokenmill import readers
from tokenmill.readers import Piece, ReadOptions, read_documents
from tokenmill.tokenize import with_specials


def test_bos_and_eod_wrap_every_document_even_empty_ones():
    flat, lengths = np.array([1, 2, 3], np.uint32), np.array([2, 0, 1])
    out, out_lengths = with_specials(flat, lengths, bos_id=7, eod_id=9)
    assert out.tolist() == [7, 1, 2, 9, 7, 9, 7, 3, 9] and out_lengths.tolist() == [4, 2, 3]
    assert with_specials(flat, lengths, None, 9)[0].tolist() == [1, 2, 9, 9, 3, 9]
    assert with_specials(flat, lengths, None, None)[0] is flat


def read_all(path, options: ReadOptions, columnar: bool):
    docs, rejects = [], []
    for batch, batch_rejects in read_documents([Piece(str(path))], options, columnar=columnar):
        texts = batch.text_values()
        docs += list(zip(batch.ids, texts.to_pylist() if not isinstance(texts, list) else texts, strict=True))
        rejects += [r.to_dict() for r in batch_rejects]
    return docs, rejects


def test_fast_path_gives_what_the_careful_path_gives(tmp_path, monkeypatch):
    monkeypatch.setattr(readers, "BATCH_BYTES", 200)  # many blocks: good ones fast, bad ones careful
    good = [orjson.dumps({"id": f"d{i}", "text": f"text number {i} \u00e9\U00016ebb", "n": i}) for i in range(40)]
    bad = [
        b'{"id": "broken", "text": ',
        b'{"id": "latin1", "text": "caf\xe9"}',
        b'{"id": "no-text"}',
        b'{"id": "d3", "text": "duplicate id"}',
        b"",
        b'{"id": "s", "text": "\\ud800"}',
        b'{"id": 5, "text": "x"}',
    ]
    lines = good[:10] + bad + good[10:]
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    for options in (ReadOptions(id_field="id"), ReadOptions(), ReadOptions(id_field="id", max_chars=20)):
        careful, fast = read_all(path, options, False), read_all(path, options, True)
        assert fast == careful
        assert len(careful[1]) >= 3
