"""Stable per-document hashing: split assignment and sampling depend on a document's id and nothing else,
so they never change when shards, workers or file order change."""

from __future__ import annotations

import hashlib

import numpy as np


def unit_interval(ids: list[str], salt: str = "") -> np.ndarray:
    """A uniform number in [0, 1) per id, from the first 8 bytes of blake2b(salt + id)."""
    prefix = salt.encode()
    words = b"".join(hashlib.blake2b(prefix + i.encode(), digest_size=8).digest() for i in ids)
    return np.frombuffer(words, dtype="<u8") / 2.0**64


def assign_splits(ids: list[str], split: dict[str, float]) -> np.ndarray:
    """The index (in `split`'s order) of each document's split."""
    bounds = np.cumsum(list(split.values()))
    bounds[-1] = np.inf  # rounding must not leave a document outside every split
    return np.searchsorted(bounds, unit_interval(ids, "split:"), side="right")
