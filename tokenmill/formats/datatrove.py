"""datatrove's tokenized files, as nanotron's nanosets read them (datatrove's `DatatroveFolderDataset`, nanotron's
`TokenizedBytesFolderDataset`), both directions. A folder per dataset (nanotron's `dataset_folder`), and in it per
file:

- `<name>.ds`: the token ids back to back, little-endian, no header: the Megatron `.bin`'s bytes. datatrove's
  `token_size` is their width: 2 (uint16) or 4 (uint32; tokenmill's int32 ids, all < 2**31, are the same bytes).
- `<name>.ds.index`: a little-endian uint64 per document, its end in tokens (exclusive, cumulative; no leading 0).
- `<name>.ds.metadata`: `<tokenizer>|<token_size>`, then the token count and its humanized form, a line each;
  nanotron reads the first line (`NanosetDatasetsArgs`) and loads the tokenizer it names with `AutoTokenizer`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tokenmill.formats.table import Mixing, SplitFound, SplitOut

INDEX_DTYPE = np.dtype("<u8")


def write(out: SplitOut) -> None:
    out.store.copy(
        out.bin_rel, out.rels[0], out.bin_digest(), out.files
    )  # the `.ds` is the `.bin`: a hard link locally
    for rel, data in zip(out.rels[1:], sidecars(out.tokens, out.lengths, out.tokenizer_name), strict=True):
        out.store.write_bytes(rel, data, out.files)


def check(found: SplitFound) -> list[str]:
    """The split's tokens, each document's end, and the token size and count its metadata says."""
    row, dtype, size = found.row, found.dtype, found.paths[0].stat().st_size
    if size != row.tokens * dtype.itemsize:
        return [f"{found.rels[0]}: {size} bytes, not the split's {row.tokens} {dtype} tokens"]
    ends = read_index(found.paths[1]).astype(np.int64)
    if len(ends) != row.documents or ends[-1] != row.tokens or not np.all(np.diff(ends) > 0):
        return [f"{found.rels[1]}: not the ends of {row.documents} documents of {row.tokens} tokens in all"]
    meta = found.paths[2].read_bytes().decode(errors="replace").split("\n")
    if not meta[0].endswith(f"|{token_size(dtype)}") or meta[1:2] != [str(row.tokens)]:
        return [f"{found.rels[2]}: not a token size of {token_size(dtype)} and {row.tokens} tokens"]
    return []


def mix(mixing: Mixing) -> dict:
    """nanotron's data stage: its folders and their weights."""
    return {"dataset_folder": list(mixing.folders.values()), "dataset_weights": list(mixing.shares.values())}


def token_size(dtype: np.dtype) -> int:
    """The `token_size` a reader must be given for a `.ds` of `dtype` ids. datatrove's own rule (2 up to a vocabulary
    of 65,536) reads 2 where tokenmill writes int32 (vocabularies of 65,500 to 65,536), so it is always the width
    written, which `.ds.metadata` says."""
    return np.dtype(dtype).itemsize


def metadata(tokenizer: str, dtype: np.dtype, tokens: int) -> bytes:
    """The `.ds.metadata` of a file of `tokens` ids of `dtype`, its tokenizer named as `AutoTokenizer` loads it."""
    humanized = next(f"{tokens / scale:.1f}{unit}" for scale, unit in ((1e9, "BT"), (1e6, "MT"), (1e3, "KT"), (1, "T"))
                     if tokens >= scale or scale == 1)  # fmt: skip
    return f"{tokenizer}|{token_size(dtype)}\n{tokens}\n{humanized}".encode()


def tokenizer_name(path: str | None) -> str:
    """The run's tokenizer (`tokenizer.path`) as nanotron's `AutoTokenizer.from_pretrained` finds it: a hub id
    (`hf:org/name`), the directory of a tokenizer file, a directory; a trained one, the dataset's `tokenizer/`."""
    if path is None:
        return "tokenizer"
    if path.startswith("hf:"):
        return path.removeprefix("hf:")
    return path if not Path(path).suffix else str(Path(path).parent)


def document_ends(lengths: np.ndarray) -> np.ndarray:
    """The `.ds.index` of documents of `lengths` tokens."""
    return np.cumsum(lengths, dtype=np.int64).astype(INDEX_DTYPE)


def sidecars(tokens: np.ndarray, lengths: np.ndarray, tokenizer: str) -> tuple[bytes, bytes]:
    """The `.ds.index` and `.ds.metadata` beside a `.ds` of `tokens` (the `.bin` itself, which the store copies)."""
    return document_ends(lengths).tobytes(), metadata(tokenizer, tokens.dtype, len(tokens))


def read_index(path: str | Path) -> np.ndarray:
    """A `.ds.index`: each document's end in tokens."""
    return np.fromfile(path, dtype=INDEX_DTYPE)
