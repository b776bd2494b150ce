"""A mixture's sources resolved into the mix a trainer draws, from the tokens actually made, and the files that
say it in each trainer's terms.

Each source has one target: a `weight` (its share of the training tokens the weighted sources share), a `tokens`
budget, or `epochs`. The budgets and epochs are drawn as given; the weighted sources share what `mix.total_tokens`
leaves, or, with no total, the largest mix in which none of them repeats. A source drawn more than its training
tokens repeats (fractional epochs); more than `mix.max_epochs` stops the run naming it.

Megatron: `mix/megatron/train.args` (what `--data-args-path` reads: `weight prefix` pairs over every training shard,
each shard's weight its source's share times its part of the source's tokens, so megatron-core's
`BlendedMegatronDatasetBuilder` draws each source in its share), and `mix/megatron/per_split.json` (what
`--per-split-data-args-path` reads) whose validation and test blends list one prefix per source, each source's
shards merged into one `mix/megatron/<split>/<source>.bin/.idx`, so that `--multiple-validation-sets` reports a loss
per source. Prefixes name the published version's files. A single input has the same two files in `megatron/`
(`write_megatron_args`), its shards weighted by their tokens, outside its manifest (`layout.MEGATRON_TRAIN_ARGS`).

Each trainer's layout in `output.formats`: `mix/<format>/<split>.json`, its sources' folders of the training split
in the version and what that trainer takes to draw them in their shares (each `formats/<format>.py`'s `mix`, for
those the table marks mixable, `layout.MIX_TRAINERS`): OLMo-core's source
mixture (`target_ratio` and the source's files), nanotron's `dataset_folder` and `dataset_weights`, litdata's
`CombinedStreamingDataset` weights, streaming's per-stream `proportion`, and `datasets.interleave_datasets`'
`probabilities`. Those trainers draw samples of one length (all but HF datasets), so a source's share of samples is
its share of tokens; `interleave_datasets` draws rows, documents, so each source's probability is its share over
its mean document length (normalized): a draw of documents in those probabilities holds tokens in the shares.

Packed (THD): `mix/packed/<split>.npy`, the (shard, row) pairs of every source's training rows as the mix draws
them (`write_packed_mix`), which `tokenmill.loader.PackedSplit(root, "train")` reads in order.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from tokenmill.config import TokenmillConfig
from tokenmill.core import layout
from tokenmill.core.packers import global_shuffle_index, writes_packed
from tokenmill.core.shares import MixError, draw
from tokenmill.core.stats import all_rejected
from tokenmill.formats.megatron import MegatronIndex, write_index
from tokenmill.formats.packed import write_shuffle_index
from tokenmill.formats.table import FORMATS, Mixing
from tokenmill.io.storage import Store

# Megatron's split names (its Split enum and --per-split-data-args-path keys) for tokenmill's.
MEGATRON_SPLITS = {"train": "train", "val": "valid", "valid": "valid", "validation": "valid", "test": "test"}


def training_split(config: TokenmillConfig) -> str:
    """The split a trainer draws the mix from: `train`, else the first."""
    return "train" if "train" in config.split else next(iter(config.split))


def resolve(config: TokenmillConfig, table: pd.DataFrame) -> dict:
    """The mix from the stats table (a row per shard and split): per source its documents and tokens per split,
    its target, and the training tokens a trainer draws from it, their share of the mix and the epochs that
    makes. Raises MixError where a target cannot be met."""
    train, mix = training_split(config), config.mix
    made_by_stream = table.groupby("split")[["documents", "tokens"]].sum().reindex(config.streams(), fill_value=0)
    made = {
        s.name: {split: made_by_stream.loc[f"{s.name}/{split}"].astype(int).to_dict() for split in config.split}
        for s in config.sources
    }
    available = {name: splits[train]["tokens"] for name, splits in made.items()}
    for name, tokens in available.items():
        if not tokens:
            raise MixError(f"source {name!r} made no {train} tokens: {why_empty(config, table, name)}")
    drawn = draw(config, available)
    total = sum(drawn.values())
    sources = {}
    for s in config.sources:
        epochs = drawn[s.name] / available[s.name]
        if epochs > mix.max_epochs:
            raise MixError(
                f"source {s.name!r} would be drawn {epochs:.2f} times ({drawn[s.name]:,.0f} of its "
                f"{available[s.name]:,} {train} tokens), over mix.max_epochs {mix.max_epochs:g}: give it a smaller "
                "target, give the mix more of the other sources, or raise mix.max_epochs"
            )
        target = next((k, getattr(s, k)) for k in ("weight", "tokens", "epochs") if getattr(s, k) is not None)
        sources[s.name] = {
            "splits": made[s.name],
            "target": {"kind": target[0], "value": target[1]},
            "tokens_drawn": round(drawn[s.name]),
            "share": round(drawn[s.name] / total, 6),
            "epochs": round(epochs, 4),
        }
    return {"split": train, "total_tokens": round(total), "sources": sources}


def why_empty(config: TokenmillConfig, table: pd.DataFrame, source: str) -> str:
    """Why a source made no training tokens: its records all rejected (`tokenmill.core.stats.all_rejected`), or its
    documents all in other splits."""
    rows = table[table.split.str.startswith(f"{source}/")]
    if documents := int(rows.documents.sum()):
        return f"its {documents:,} documents all fell in other splits (give the split a larger fraction)"
    return f"{all_rejected(config.output.store(), rows)}; fix its input config or its files and run again"


def stream_shards(table: pd.DataFrame, stream: str) -> pd.DataFrame:
    """The shards of a stream that hold documents, in shard order, with their tokens."""
    rows = table[(table.split == stream) & (table.documents > 0)]
    return rows.sort_values("shard_id")[["shard_id", "tokens"]]


def write_mix(config: TokenmillConfig, table: pd.DataFrame, resolved: dict, published: str) -> None:
    """The mix's files, made anew (an earlier mix's go: a source since removed): Megatron's, and the packed
    loader's where packed rows are written."""
    config.output.store().remove_tree(layout.MIX)
    write_megatron_mix(config, table, resolved, published)
    for format in (f for f in layout.MIX_TRAINERS if f in config.output.formats):
        write_trainer_mix(config, table, resolved, published, format)
    if writes_packed(config):
        write_packed_mix(config, table, resolved)


def write_megatron_mix(config: TokenmillConfig, table: pd.DataFrame, resolved: dict, published: str) -> None:
    """Write the Megatron files of the mix (module docstring) into the build, their prefixes under `published`
    (the version's URL)."""
    store, train = config.output.store(), resolved["split"]
    blends: dict[str, list[str]] = {"train": []}  # Megatron's split -> weight, prefix, weight, prefix, ...
    for name, source in resolved["sources"].items():
        stream = f"{name}/{train}"
        shards = stream_shards(table, stream)
        for shard_id, tokens in zip(shards.shard_id, shards.tokens, strict=True):
            weight = source["share"] * tokens / source["splits"][train]["tokens"]
            blends["train"] += [f"{weight:.12g}", f"{published}/{layout.megatron_prefix(stream, int(shard_id))}"]
    for split in config.split:
        if split == train or split not in MEGATRON_SPLITS:
            continue
        blend = blends[MEGATRON_SPLITS[split]] = []
        for name, source in resolved["sources"].items():
            if source["splits"][split]["documents"]:
                stream, merged = f"{name}/{split}", layout.mix_merged_prefix(split, name)
                shards = [layout.megatron_prefix(stream, int(i)) for i in stream_shards(table, stream).shard_id]
                merge_megatron(store, shards, merged)
                blend += [str(source["splits"][split]["tokens"]), f"{published}/{merged}"]
    write_megatron_blends(store, blends, layout.MIX_TRAIN_ARGS, layout.MIX_PER_SPLIT_ARGS)


def write_megatron_args(config: TokenmillConfig, table: pd.DataFrame, published: str) -> list[str]:
    """A single input's Megatron data-args files, read by the flags a mixture's are (a single input is a mixture of
    one source): each split's shards, each weighted by its part of the split's tokens, so that megatron-core draws
    the split as it is; one validation set. Their prefixes under `published` (the version's URL); return the files."""
    store, train = config.output.store(), training_split(config)
    blends: dict[str, list[str]] = {"train": []}
    for split in config.split:
        name = "train" if split == train else MEGATRON_SPLITS.get(split)
        shards = stream_shards(table, split)
        if name is None or (name != "train" and (name in blends or shards.empty)):
            continue
        total = int(shards.tokens.sum())
        blends[name] = [
            entry
            for shard_id, tokens in zip(shards.shard_id, shards.tokens, strict=True)
            for entry in (f"{tokens / total:.12g}", f"{published}/{layout.megatron_prefix(split, int(shard_id))}")
        ]
    write_megatron_blends(store, blends, layout.MEGATRON_TRAIN_ARGS, layout.MEGATRON_PER_SPLIT_ARGS)
    return [layout.MEGATRON_TRAIN_ARGS, layout.MEGATRON_PER_SPLIT_ARGS]


def write_megatron_blends(store: Store, blends: dict[str, list[str]], train_args: str, per_split: str) -> None:
    """`blends` (Megatron's split -> weight, prefix, weight, prefix, ...) as `--data-args-path`'s file `train_args`
    (the training blend) and `--per-split-data-args-path`'s `per_split` (every split's)."""
    pairs = zip(blends["train"][::2], blends["train"][1::2], strict=True)
    store.write_bytes(train_args, "".join(f"{weight} {prefix}\n" for weight, prefix in pairs).encode())
    store.write_bytes(per_split, (json.dumps(blends, indent=2) + "\n").encode())


def write_trainer_mix(
    config: TokenmillConfig, table: pd.DataFrame, resolved: dict, published: str, format: str
) -> None:
    """`mix/<format>/<train split>.json`: the training split's mix in the terms of the trainer of `format`, written by
    its module (`formats.table`), its folders and files under `published` (the version's URL)."""
    train, sources = resolved["split"], resolved["sources"]
    streams = {name: f"{name}/{train}" for name in sources}
    token_files = {
        name: [
            f"{published}/{layout.trainer_file(format, stream, int(i))}" for i in stream_shards(table, stream).shard_id
        ]
        for name, stream in streams.items()
    }
    mixing = Mixing(
        folders={name: f"{published}/{format}/{stream}" for name, stream in streams.items()},
        shares={name: source["share"] for name, source in sources.items()},
        epochs={name: source["epochs"] for name, source in sources.items()},
        made={name: source["splits"][train] for name, source in sources.items()},
        token_files=token_files,
        remote="://" in published,
    )
    config.output.store().write_json(layout.mix_trainer_file(format, train), FORMATS[format].module().mix(mixing))


def write_packed_mix(config: TokenmillConfig, table: pd.DataFrame, resolved: dict) -> None:
    """Write the mix of packed rows (`mix/packed/<split>.npy`, read by `tokenmill.loader.PackedSplit`): each
    source's training rows as many times as its epochs say, whole epochs in full and the fraction as a seeded
    sample of its rows without repeats, all shuffled together with `mix.seed`."""
    train, seed = resolved["split"], config.mix.seed
    drawn = []
    for k, (name, source) in enumerate(resolved["sources"].items()):
        packed = table[(table.split == f"{name}/{train}") & (table.packed_rows > 0)].sort_values("shard_id")
        rows = global_shuffle_index(list(zip(packed.shard_id, packed.packed_rows, strict=True)), seed)
        whole, fraction = divmod(source["epochs"], 1)
        part = np.random.default_rng([seed, k]).choice(len(rows), round(fraction * len(rows)), replace=False)
        drawn += [rows] * int(whole) + [rows[np.sort(part)]]
    index = np.concatenate(drawn)
    index = index[np.random.default_rng(seed).permutation(len(index))]
    with config.output.store().writing(layout.mix_packed_file(train)) as tmp:
        write_shuffle_index(tmp, index)


def merge_megatron(store: Store, prefixes: list[str], merged: str) -> None:
    """Megatron files `prefixes` (each a shard's documents) as one `merged.bin/.idx`, in order; a stream of preference
    pairs stays documents of two sequences."""
    lengths, dtype, per_document = [], None, 1
    with store.writing(merged + ".bin") as tmp, open(tmp, "wb") as out:
        for prefix in prefixes:
            with store.local_copies(prefix + ".idx") as (idx,):
                index = MegatronIndex(idx)
                lengths.append(np.array(index.lengths))
                dtype = index.dtype
                per_document = 2 if len(index.document_indices) - 1 < len(index) else per_document
            with store.open(prefix + ".bin") as f:
                while chunk := f.read(8 << 20):
                    out.write(chunk)
    with store.writing(merged + ".idx") as tmp:
        write_index(tmp, np.concatenate(lengths), dtype, per_document)
