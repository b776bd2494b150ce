"""Megatron .bin/.idx files written by tokenmill load with megatron-core's own IndexedDataset.

Needs the optional extra: pip install torch==2.13.0 megatron-core (CPU-only is enough).
"""

import warnings

import numpy as np
import pytest

with warnings.catch_warnings():  # megatron.core's __init__ warns about missing apex/TE and deprecations
    warnings.simplefilter("ignore")
    mcore = pytest.importorskip(
        "megatron.core.datasets.indexed_dataset", reason="megatron-core (and torch) not installed"
    )

from tokenmill.formats.megatron import write_indexed_dataset


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_indexed_dataset_reads_tokenmill_output(tmp_path, dtype):
    hi = np.iinfo(dtype).max
    docs = [
        np.array([1, 2, 3, hi], dtype=dtype),
        np.array([7], dtype=dtype),
        np.array([], dtype=dtype),  # an empty document still gets its own sequence
        np.arange(300, dtype=np.int64).astype(dtype) * (1 if dtype is np.uint16 else 70_001),
    ]
    prefix = tmp_path / "corpus"
    write_indexed_dataset(prefix, docs, np.dtype(dtype))

    ds = mcore.IndexedDataset(str(prefix))  # megatron-core needs a str prefix, not a Path
    # copy everything out: the arrays are views into mmaps that IndexedDataset.__del__ closes
    got = [np.array(ds[i]) for i in range(len(ds))]
    assert len(ds) == len(docs)
    assert ds.index.dtype is dtype
    assert np.array_equal(ds.sequence_lengths, [len(d) for d in docs])
    assert np.array_equal(ds.document_indices, np.arange(len(docs) + 1))  # [0, 1, ..., n]
    for g, d in zip(got, docs, strict=True):
        assert g.dtype == dtype and np.array_equal(g, d)
    del ds

    # and byte-identical to what megatron-core's own builder writes for one sequence per document
    ref = str(tmp_path / "ref")
    builder = mcore.IndexedDatasetBuilder(ref + ".bin", dtype=dtype)  # wants the numpy type, not np.dtype
    for d in docs:
        builder.add_document(d, [len(d)])
    builder.finalize(ref + ".idx")
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"corpus{ext}").read_bytes() == (tmp_path / f"ref{ext}").read_bytes(), ext


def test_pairs_are_documents_of_two_sequences_as_megatron_cores_builder_writes_them(tmp_path):
    """A preference pair's chosen and rejected sequences (`write_index(..., sequences_per_document=2)`): the same
    bytes as megatron-core's builder writes for documents of two sequences each, read back as such."""
    from tokenmill.formats.megatron import BinWriter, write_index

    pairs = [(np.array([1, 2, 3], np.uint16), np.array([1, 2, 9, 9], np.uint16)), (np.array([5, 6], np.uint16),) * 2]
    prefix = tmp_path / "pairs"
    with open(f"{prefix}.bin", "wb") as f:
        writer = BinWriter(f, np.uint16)
        for chosen, rejected in pairs:
            writer.add(np.concatenate([chosen, rejected]), np.array([len(chosen), len(rejected)]))
    write_index(f"{prefix}.idx", writer.all_lengths(), np.uint16, 2)
    ref = str(tmp_path / "ref")
    builder = mcore.IndexedDatasetBuilder(ref + ".bin", dtype=np.uint16)
    for chosen, rejected in pairs:
        builder.add_document(np.concatenate([chosen, rejected]), [len(chosen), len(rejected)])
    builder.finalize(ref + ".idx")
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"pairs{ext}").read_bytes() == (tmp_path / f"ref{ext}").read_bytes(), ext
    ds = mcore.IndexedDataset(str(prefix))
    assert ds.document_indices.tolist() == [0, 2, 4] and [np.array(ds[i]).tolist() for i in range(4)] == [
        [1, 2, 3], [1, 2, 9, 9], [5, 6], [5, 6]
    ]  # fmt: skip
    del ds
