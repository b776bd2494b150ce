"""Reads and writes past the page cache, and what the page cache holds: the OS-level plumbing of `readers` (input
blocks read with O_DIRECT where they are not cached) and `storage` (outputs the run does not read again, written
with O_DIRECT). Linux's calls, with a fallback through the cache where a system or file system has none."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Buffer

LIBC = ctypes.CDLL(None, use_errno=True)


class UncachedFile:
    """A new local file written past the page cache (O_DIRECT), for outputs the run does not read again: their bytes
    are neither copied into the cache nor written back from it later, nor do they push the input out of it. (On a
    VM that hands freed memory back to its host, each page the cache takes afresh also costs a fault on the host:
    see docs/performance.md, "Output the page cache takes in".)

    O_DIRECT writes whole blocks from aligned memory: the bytes go through two page-aligned buffers, one filled
    while a thread writes the other; the last block is padded and the file cut to its size. Where the platform or
    the file system refuses O_DIRECT, the same writes go through the cache."""

    BUFFER = 4 << 20
    _spare: list[memoryview] = []  # the buffers of closed files, for the next: fresh memory costs more than a copy

    def __init__(self, path: str | Path):
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        try:
            self.fd = os.open(path, flags | DIRECT, 0o644)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            self.fd = os.open(path, flags, 0o644)
        self.buffers = [self._spare.pop() if self._spare else private_buffer(self.BUFFER) for _ in range(2)]
        self.writes: list = [None, None]  # each buffer's write under way
        self.writer = ThreadPoolExecutor(1, thread_name_prefix="tokenmill-uncached")
        self.current = self.filled = self.size = 0

    def write(self, data) -> int:
        data = memoryview(data).cast("B")
        done = 0
        while done < len(data):
            take = min(self.BUFFER - self.filled, len(data) - done)
            self.buffers[self.current][self.filled : self.filled + take] = data[done : done + take]
            self.filled, done = self.filled + take, done + take
            if self.filled == self.BUFFER:
                self._hand_over(self.BUFFER)
        self.size += len(data)
        return len(data)

    def _hand_over(self, end: int) -> None:
        """The current buffer's first `end` bytes to the writer thread; then the other buffer, once written."""
        self.writes[self.current] = self.writer.submit(self._write, self.buffers[self.current][:end])
        self.current, self.filled = 1 - self.current, 0
        if written := self.writes[self.current]:
            self.writes[self.current] = None
            written.result()

    def _write(self, data: memoryview) -> None:
        while data:
            try:
                data = data[os.write(self.fd, data) :]
            except OSError as e:  # a file system that took O_DIRECT at open and refuses it at write
                flags = fcntl.fcntl(self.fd, fcntl.F_GETFL)
                if e.errno != errno.EINVAL or not flags & DIRECT:
                    raise
                fcntl.fcntl(self.fd, fcntl.F_SETFL, flags & ~DIRECT)

    def __enter__(self) -> UncachedFile:
        return self

    def __exit__(self, failed, *_) -> None:
        try:
            if not failed:
                if self.filled:
                    padded = -(-self.filled // DIRECT_ALIGN) * DIRECT_ALIGN
                    self.buffers[self.current][self.filled : padded] = bytes(padded - self.filled)
                    self._hand_over(padded)
                for written in filter(None, self.writes):
                    written.result()
                os.ftruncate(self.fd, self.size)
        finally:
            self.writer.shutdown()  # waits for a write still under way where one failed
            os.close(self.fd)
            self._spare.extend(self.buffers)


DIRECT = getattr(os, "O_DIRECT", 0)  # Linux's; elsewhere UncachedFile writes through the cache
# O_DIRECT reads and writes start, end and land at multiples of this: the page, a multiple of any disk's block
DIRECT_ALIGN = max(4096, mmap.PAGESIZE)


def private_buffer(size: int) -> memoryview:
    """Page-aligned memory of `size` bytes, private to this process (Python's anonymous maps are shared with the
    processes it forks)."""
    return memoryview(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS))


def open_direct(path: str) -> int | None:
    """A descriptor of `path` for reads that skip the page cache (O_DIRECT), or None where the system or its file
    system has none (macOS, tmpfs)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECT)
    except (AttributeError, OSError):
        return None


def in_page_cache(f: BinaryIO, start: int, stop: int) -> bool:
    """Whether every page of bytes [start, stop) of `f` is in the page cache (mincore over a map of them; where the
    kernel does not say for files the process may not write, the pages count as not cached)."""
    base = start - start % mmap.PAGESIZE
    pages = np.zeros(-(-(stop - base) // mmap.PAGESIZE), np.uint8)
    with mmap.mmap(f.fileno(), stop - base, offset=base, access=mmap.ACCESS_READ) as mapped:
        address = ctypes.c_void_p(np.frombuffer(mapped, np.uint8, count=1).ctypes.data)
        found = LIBC.mincore(address, ctypes.c_size_t(stop - base), pages.ctypes.data_as(ctypes.c_void_p))
    return found == 0 and bool((pages & 1).all())


def mapped(f: BinaryIO, start: int, stop: int) -> memoryview:
    """Bytes [start, stop) of the file, a view of a memory map of their own (which starts at a page boundary)."""
    base = start - start % mmap.ALLOCATIONGRANULARITY
    return memoryview(mmap.mmap(f.fileno(), stop - base, offset=base, access=mmap.ACCESS_READ))[start - base :]


def read_direct(direct: int, buffer: Buffer, start: int, stop: int) -> tuple[int, int] | None:
    """Bytes of the file open with O_DIRECT as `direct` from `start`, rounded down to DIRECT_ALIGN, to `stop`,
    rounded up, or as many as the page-aligned `buffer` holds, read into it: (where it starts in the file, how many
    bytes it holds, fewer at the file's end); None where the file system refuses the alignment (map them instead)."""
    base = start - start % DIRECT_ALIGN
    length = min(len(buffer), -(-(stop - base) // DIRECT_ALIGN) * DIRECT_ALIGN)
    try:
        return base, os.preadv(direct, [memoryview(buffer)[:length]], base)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        return None


@contextmanager
def range_reader(f: BinaryIO, most: int) -> Iterator[Callable[[int, int], memoryview]]:
    """A reader of bytes [start, stop) of the local file `f`, at most `most` at a time: a view of a memory map
    where the page cache holds them, else read with O_DIRECT into one reused buffer (valid until the next read), so
    that a file written around the page cache (`UncachedFile`) is read back without the cache taking it in."""
    direct, buffer = open_direct(f.name), None
    try:

        def read(start: int, stop: int) -> memoryview:
            nonlocal buffer
            if direct is not None and not in_page_cache(f, start, stop):
                buffer = buffer or private_buffer(-(-most // DIRECT_ALIGN) * DIRECT_ALIGN + DIRECT_ALIGN)
                base, held = read_direct(direct, buffer, start, stop) or (0, 0)  # refused: map them
                if base + held >= stop:  # a short read (a signal, a file system's) would leave stale bytes
                    return buffer[start - base : stop - base]
            return mapped(f, start, stop)

        yield read
    finally:
        if direct is not None:
            os.close(direct)
