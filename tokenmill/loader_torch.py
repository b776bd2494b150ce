"""The torch side of `tokenmill.loader`: a split's samples as a `torch.utils.data.IterableDataset` that gives each
rank, and each DataLoader worker within a rank, its own samples; and a collate function that flattens a batch for
varlen (THD) attention. Apart from `tokenmill.loader` so that reading a split with numpy alone needs no torch.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import IterableDataset, get_worker_info

from tokenmill.loader import PackedSplit, distributed_rank


class PackedTorchDataset(IterableDataset):
    """The samples of one split for this rank, as torch tensors.

    Rank r of w takes positions r, r + w, r + 2w, ... of the (shuffled) split, all ranks the same
    number (the last `len % w` samples are left out, so no rank waits on another at the end); within
    a rank, DataLoader worker k of K takes every K-th of those.

    Args:
        root: a dataset directory, as for `PackedSplit`.
        split: a split, or a mixture source's `<source>/<split>`.
        rank: this process's rank; default `distributed_rank()`'s (torch.distributed, else $RANK, else 0).
        world_size: the number of ranks; default `distributed_rank()`'s (else $WORLD_SIZE, else 1).
        shuffle: as for `PackedSplit`: the split's global shuffle order, or shard order.
        mask_cross_document_labels: as for `tokenmill.loader.training_sample`.
    """

    def __init__(
        self,
        root: str | Path,
        split: str,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        shuffle: bool = True,
        mask_cross_document_labels: bool = True,
    ):
        self.samples = PackedSplit(root, split, shuffle=shuffle, mask_cross_document_labels=mask_cross_document_labels)
        default_rank, default_world = distributed_rank()
        self.rank = default_rank if rank is None else rank
        self.world_size = default_world if world_size is None else world_size
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not within world size {self.world_size}")

    def positions(self) -> range:
        """This rank's positions in the split."""
        per_rank = len(self.samples) // self.world_size
        return range(self.rank, per_rank * self.world_size, self.world_size)

    def __len__(self) -> int:
        return len(self.positions())

    def __iter__(self):
        mine = self.positions()
        if (worker := get_worker_info()) is not None:
            mine = mine[worker.id :: worker.num_workers]
        for position in mine:
            yield {k: torch.from_numpy(v) for k, v in self.samples[position].items()}


def collate_thd(samples: list[dict]) -> dict:
    """Stack a batch `[B, seq_len]` and join its boundaries into one `cu_seqlens` over the flattened
    `B * seq_len` tokens, with `max_seqlen`, as varlen attention kernels take them."""
    batch = {k: torch.stack([s[k] for s in samples]) for k in ("input_ids", "labels", "position_ids")}
    seq_len = batch["input_ids"].shape[1]
    starts = [s["cu_seqlens"][:-1] + i * seq_len for i, s in enumerate(samples)]
    cu = torch.cat([*starts, torch.tensor([len(samples) * seq_len], dtype=torch.int32)]).to(torch.int32)
    return batch | {"cu_seqlens": cu, "max_seqlen": int((cu[1:] - cu[:-1]).max())}
