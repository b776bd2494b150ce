"""What an input file's name says of it: its compression, its format, and whether a directory in `input.paths`
stands for it. Standard library only: the storage layer lists inputs with it, the readers read and name them by it."""

from __future__ import annotations

import os
import posixpath

COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd", ".xz": "xz", ".bz2": "bz2"}  # as HF datasets reads
COMPRESSED = tuple(COMPRESSIONS)
# The endings that name a format; a file ending otherwise is read as plain text
FORMATS = {
    "jsonl": (".jsonl", ".json", ".ndjson"),
    "parquet": (".parquet", ".pq"),
    "arrow": (".arrow",),  # Hugging Face datasets' save_to_disk
    "text": (".txt",),
}
DATA_ENDINGS = tuple(ending for endings in FORMATS.values() for ending in endings)
# What Hugging Face datasets writes beside its data (save_to_disk, legacy hub repos): JSON, but not a corpus
NOT_DATA = {"dataset_info.json", "dataset_infos.json", "dataset_dict.json", "state.json"}


def compression_of(url: str) -> str | None:
    if not url.endswith(COMPRESSED):  # one test for most files
        return None
    for suffix, codec in COMPRESSIONS.items():
        if url.endswith(suffix):
            return codec
    return None


def uncompressed_name(url: str) -> str:
    """The file's name, lower case, without a compression suffix."""
    name = url.rsplit("/", 1)[-1].lower()
    for suffix in COMPRESSIONS if name.endswith(COMPRESSED) else ():
        name = name.removesuffix(suffix)
    return name


def format_of(url: str) -> str:
    """`jsonl`, `parquet`, `arrow` or `text`, from the file name (compression suffixes ignored)."""
    name = uncompressed_name(url)
    return next((kind for kind, endings in FORMATS.items() if name.endswith(endings)), "text")


def names_its_format(relative: str) -> bool:
    """Whether a directory in `input.paths` stands for the file at `relative` below it: a name that ends in one
    of DATA_ENDINGS (then perhaps a compression's) and is not NOT_DATA, with nothing on the way hidden (`.`
    or `_` first): a README.md, Spark's `_SUCCESS` or a `.cache/` is not a document."""
    parts = relative.split("/")
    if any(part.startswith((".", "_")) for part in parts) or parts[-1] in NOT_DATA:
        return False
    return uncompressed_name(parts[-1]).endswith(DATA_ENDINGS)


def input_root(patterns: list[str]) -> str | None:
    """The deepest directory above every file that `patterns` (a source's `input.paths`) name: where the part of each
    before its first wildcard lies (a directory itself, a file: then its own directory holds it), local ones made
    absolute. A file's name in ids and messages is its path under it (`name_under`), unique across the source and
    the same wherever the corpus is copied. None where the patterns are on different stores."""
    stores, bases = set(), []
    for pattern in patterns:
        store, _, path = pattern.rpartition("://")
        parts = path.rstrip("/").split("/")
        fixed = next((i for i, part in enumerate(parts) if any(c in part for c in "*?[")), len(parts))
        base = "/".join(parts[:fixed])
        stores.add(store)
        bases.append(base if store else os.path.abspath(base or "."))
    if len(stores) != 1 or not bases:
        return None
    (store,) = stores
    common = posixpath.commonpath(bases)
    return f"{store}://{common}" if store else common


def local_path(url: str) -> str | None:
    """The path of a local file's URL (a path, or `file://`); None for an object store's."""
    if "://" not in url:
        return url
    return url.removeprefix("file://") if url.startswith("file://") else None


def name_under(root: str | None, url: str) -> str:
    """A file's name in document ids and messages: its path under `root` (`input_root`), else its name alone."""
    if root is not None:
        path, under = url if "://" in url else os.path.abspath(url), root if root.endswith("/") else f"{root}/"
        if path.startswith(under) and len(path) > len(under):
            return path[len(under) :]
    return url.rstrip("/").rsplit("/", 1)[-1]
