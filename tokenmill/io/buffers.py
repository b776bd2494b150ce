"""Vectorised scans over large byte buffers (a batch of input, its UTF-8 texts), a part at a time."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

SCAN_BYTES = 1 << 20  # see `scan_parts`


def scan_parts(data: np.ndarray, size: int = SCAN_BYTES) -> Iterator[tuple[int, np.ndarray]]:
    """(start, view) of each consecutive `size` elements of `data`: a vectorised scan of a batch a part at a
    time makes temporaries of a part, which the allocator reuses, where a whole batch's were fresh pages each
    time in a worker (the kernel zeroing them was about 1% of a 12 GB run's CPU)."""
    for start in range(0, len(data), size):
        yield start, data[start : start + size]
