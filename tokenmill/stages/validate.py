"""The validate stage: nothing is published unless every count reconciles and every file is sound.

Two layers: a pandera schema over the per-shard stats table (one row per shard and split) with the
cross-row checks (documents in = documents out + rejected per shard, every planned shard exactly
once, packed tokens = tokenized tokens), then the files themselves (headers, sizes, EOD, padding,
boundaries per pack mode, llm.c headers, each split's shuffle index a permutation of its rows), and
last a sample of documents re-read from the input: their stored ids equal the reference encoding and
decode back to their text.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextvars import copy_context
from dataclasses import dataclass, fields
from types import SimpleNamespace
from typing import TYPE_CHECKING

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from tokenmill import __version__
from tokenmill.config import PackConfig, TokenmillConfig
from tokenmill.core import layout
from tokenmill.core.commits import CHECK, PACK, TOKENIZE, commit, committed, read_marker
from tokenmill.core.hashing import assign_splits
from tokenmill.core.packers import pad_id as pack_pad_id
from tokenmill.core.packers import writes_packed
from tokenmill.core.plan import Columns, Plan, Shard, shard_ids
from tokenmill.core.stats import COLUMNS, Tokenized, ValidationFailed, all_rejected, skipped, stats_rows
from tokenmill.formats.megatron import MegatronIndex, token_dtype
from tokenmill.formats.packed import read_shuffle_index
from tokenmill.formats.table import FORMATS, Format, SplitFound
from tokenmill.io.readers import BATCH_BYTES, ReadOptions, block_pieces, read_documents, schema_library
from tokenmill.io.storage import STREAMED, Store
from tokenmill.tokenizers.chat import RenderedChat, mask_problems
from tokenmill.tokenizers.encoders import in_runs, loaded_backend
from tokenmill.tokenizers.preference import PairTexts, pair_problems, tokenize_texts
from tokenmill.tokenizers.reference import (
    CHECK_BYTES,
    Excerpt,
    checked_excerpt,
    excerpt_bytes,
    reference_ids,
    sized_to_the_run,
)
from tokenmill.tokenizers.tokenizer_info import TokenizerInfo, reading

if TYPE_CHECKING:
    import pandera.pandas as pa

ROWS_AT_ONCE = 10_000  # stats rows (or a dataset's files) made into Python objects at a time


# `run(name, items, work, context, *args)`: `work(context, item, *args)` over the items, named `name` (a stage of
# shard work), where the caller wants; each item's result, in order.
RunShards = Callable[..., list]
# `away(work, *args)`: `work(*args)` where the caller wants (on a worker), waited for: what it returns.
CallAway = Callable[..., object]


def stats_schema(
    shard_ids: list[int], splits: list[str], vocab_size: int, pack: PackConfig | None
) -> pa.DataFrameSchema:
    """The checks of any run of whole shards' rows of the stats table (`validate` checks it a few thousand rows at
    a time); `shard_ids`: the plan's (a grown input's plan may have gaps where shards were dropped); `pack` is
    None when no packed rows are written."""
    pa = schema_library()  # a fifth of a second to import: not in every worker that unpickles the flow

    def per_shard_reconciles(df: pd.DataFrame) -> pd.Series:
        g = df.groupby("shard_id")
        balance = (
            g["documents_in"].transform("first") - g["documents"].transform("sum") - g["rejected"].transform("first")
        )
        return balance == 0

    def packed_tokens_match(df: pd.DataFrame) -> pd.Series:
        if pack is None:
            return df.packed_real_tokens == 0
        if pack.mode == "window":  # real tokens repeat where windows overlap: checked per row against the files
            text = df.packed_real_tokens >= df.tokens
        else:
            shared = (df.packed_rows - 1).clip(lower=0) if pack.extra_token else 0  # concat + extra_token share one
            text = df.packed_real_tokens == df.tokens + shared
        # conversations are packed whole, less what pack.too_long cut
        return text.where(df.supervised_tokens < 0, df.packed_real_tokens == df.tokens - df.tokens_cut)

    nonneg = pa.Check.ge(0)
    return pa.DataFrameSchema(
        {
            "shard_id": pa.Column(int, pa.Check.isin(shard_ids)),
            "split": pa.Column(str, pa.Check.isin(splits)),
            "documents_in": pa.Column(int, nonneg),
            "rejected": pa.Column(int, nonneg),
            "documents": pa.Column(int, nonneg),
            "tokens": pa.Column(int, pa.Check.ge(0)),
            "max_token_id": pa.Column(int, pa.Check.lt(vocab_size, error=f"token id >= vocab size {vocab_size}")),
            "packed_rows": pa.Column(int, nonneg),
            "packed_real_tokens": pa.Column(int, nonneg),
            "packed_pad_tokens": pa.Column(int, nonneg),
            "padded_layout_rows": pa.Column(int, nonneg),
            "llmc_files": pa.Column(int, nonneg),
            "supervised_tokens": pa.Column(int, pa.Check.ge(-1)),  # -1: not conversations
            "too_long": pa.Column(int, nonneg),
            "tokens_cut": pa.Column(int, nonneg),
            "trainer_files": pa.Column(int, nonneg),
        },
        checks=[
            pa.Check(per_shard_reconciles, error="documents_in != documents out + rejected"),
            pa.Check(packed_tokens_match, error="packed real tokens != tokenized tokens"),
            pa.Check(lambda df: df.supervised_tokens <= df.tokens, error="more supervised tokens than tokens"),
        ],
        strict=True,
        ordered=True,
    )


def every_shard_and_split_once(table: pd.DataFrame, shard_ids: list[int], splits: list[str]) -> bool:
    """Each planned shard has exactly one row per split of its source: no (shard, split) twice and as many rows as
    pairs (the schema checks that each row's shard and split are planned ones). In a mixture the splits are
    `<source>/<split>`, and a shard has its own source's only: as many as the split names."""
    per_shard = len({split.rsplit("/", 1)[-1] for split in splits})
    return len(table) == len(set(shard_ids)) * per_shard and not table.duplicated(["shard_id", "split"]).any()


def stats_problems(
    table: pd.DataFrame, shard_ids: list[int], splits: list[str], vocab_size: int, pack: PackConfig | None
) -> list[str]:
    """The stats table against `stats_schema` (of these arguments), a few thousand rows at a time and whole shards
    each (pandera's checks take a few times the rows' memory: 50 MB for 98,176 rows at once), and every shard and
    split once: a line per failed check, naming its shards (none: the table is sound)."""
    SchemaErrors = schema_library().errors.SchemaErrors  # noqa: N806 (a class)

    schema, found = stats_schema(shard_ids, splits, vocab_size, pack), []
    for rows in shard_chunks(table):
        try:
            schema.validate(rows, lazy=True)
        except SchemaErrors as e:
            found.append(e.failure_cases)
    lines = _failure_lines(pd.concat(found, ignore_index=True), table) if found else []
    if not every_shard_and_split_once(table, shard_ids, splits):
        lines.append("  - a planned shard is missing or duplicated")
    return lines


def load_checking() -> None:
    """pandera loaded (`schema_library`) ahead of `stats_problems`, on the worker that will check the table
    (`flows.cluster.prepare_cluster`)."""
    schema_library()


def shard_chunks(table: pd.DataFrame) -> Iterator[pd.DataFrame]:
    """The table (in shard order, as `table_of` makes it) about ROWS_AT_ONCE rows at a time, a shard's rows never
    split between two."""
    ids, start = table.shard_id.to_numpy(), 0
    while start < len(table):
        end = min(start + ROWS_AT_ONCE, len(table))
        while end < len(table) and ids[end] == ids[end - 1]:
            end += 1
        yield table.iloc[start:end]
        start = end


def _check_shuffle(store: Store, split: str, split_rows: pd.DataFrame) -> list[str]:
    """The shuffle index lists every (shard, row) of the split's packed rows exactly once."""
    rel = layout.shuffle_file(split)
    split_rows = split_rows[split_rows.packed_rows > 0]
    if split_rows.empty:
        return [f"{rel}: exists but the split has no packed rows"] if store.exists(rel) else []
    if not store.exists(rel):
        return [f"{rel}: missing"]
    with store.local_copies(rel) as (path,):
        index = np.asarray(read_shuffle_index(path), dtype=np.int64)
    counts = split_rows.packed_rows.to_numpy(dtype=np.int64)
    expected = np.stack(
        [np.repeat(split_rows.shard_id.to_numpy(dtype=np.int64), counts),
         np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)], axis=1
    )  # fmt: skip
    if index.shape != expected.shape:
        return [f"{rel}: shape {index.shape}, the split has {len(expected)} packed rows"]
    if not np.array_equal(index[np.lexsort((index[:, 1], index[:, 0]))], expected):
        return [f"{rel}: not a permutation of the split's packed rows"]
    return []


# --- sampled documents: stored ids against the reference's, and decoded back to their text ----------

REFERENCE_SHARDS = 8  # the reference's sample spans at least this many shards (where there are): a block or so of each


CONVERSATIONS_READ = 4  # see `_from_shard`
SAMPLE_BATCH_BYTES = 1 << 20  # conversations read so: a shard's first ones are read (and rendered), not the rest


@dataclass(frozen=True)
class ReferenceItem:
    """A shard's part of the reference check's sample (`reference_items`)."""

    shard: Shard
    sample: int  # how many of its documents
    documents: int  # all its documents
    rejected: int  # its rejects
    seed: int
    most_bytes: int = 1 << 62  # the text its documents may hold in all (its share of tokenizer.check_bytes)

    @property
    def shard_id(self) -> int:
        return self.shard.shard_id


def reference_items(config: TokenmillConfig, plan: Plan, table: pd.DataFrame, seed: int = 1) -> list[ReferenceItem]:
    """A random sample of at least `tokenizer.check_min_documents` and `tokenizer.check_fraction` of all
    documents, as the shards it is read from, one item each for `check_reference`, each with its share of
    `tokenizer.check_bytes` (`reference.sized_to_the_run`: less in a small run; the documents drawn are checked until
    they hold it: `within_bytes`). Shards are taken in random order until they hold twice that many documents and
    number REFERENCE_SHARDS (or all there are), and each takes its share of a uniform draw from their documents. A
    mixture's sources are drawn each on its own, each its share of the documents by its share of the tokens (at
    least one, from at least one shard): drawn from all at once, a source of short texts (1.6 million chat turns
    beside 78,000 code files) took the whole sample whenever one of its shards was among those read."""
    cfg, rng = config.tokenizer, np.random.default_rng(seed)
    per_shard = table.groupby("shard_id").documents.sum()
    total = int(per_shard.sum())
    wanted = min(total, max(cfg.check_min_documents, int(np.ceil(cfg.check_fraction * total))))
    tokens = table.groupby("shard_id").tokens.sum()
    strata = [per_shard.index]  # the shards of each mixture source, or all
    if config.mixture:
        source_of = pd.Series({s.shard_id: s.mix_source for s in plan.shards}).reindex(per_shard.index)
        strata = list(source_of.groupby(source_of).groups.values())
    drawn: dict[int, int] = {}  # shard id -> documents drawn from it
    for members in strata:
        of_stratum, share = per_shard[members], tokens[members].sum() / max(int(tokens.sum()), 1)
        share = share if config.mixture else 1.0
        wanted_here = min(int(of_stratum.sum()), max(1, round(wanted * share)))
        drawn |= _drawn(of_stratum, wanted_here, max(1, round(REFERENCE_SHARDS * share)), rng)
    read = sorted(s for s, n in drawn.items() if n)
    read_ids = set(read)  # these shards of the plan only: not a dict held for each of its shards
    read_from = {s.shard_id: s for s in plan.shards if s.shard_id in read_ids}
    rejected = table.groupby("shard_id").rejected.first()
    # Each shard's share of check_bytes: as the text its drawn documents are expected to hold (tokens per document)
    expected = np.array([drawn[s] * tokens[s] / max(1, per_shard[s]) for s in read], dtype=float)
    most = sized_to_the_run(cfg.check_bytes, CHECK_BYTES, sum(shard.bytes for shard in plan.shards))
    budget = most * expected / max(expected.sum(), 1e-9)
    return [
        ReferenceItem(
            read_from[shard_id],
            drawn[shard_id],
            int(per_shard[shard_id]),
            int(rejected[shard_id]),
            seed,
            max(1, int(budget[k])),
        )
        for k, shard_id in enumerate(read)
    ]


def _drawn(per_shard: pd.Series, wanted: int, least: int, rng: np.random.Generator) -> dict[int, int]:
    """How many of `wanted` documents are drawn from each of the shards (`per_shard`: their documents) taken in random
    order until they hold twice as many and number `least` (or all there are): a uniform draw from their documents."""
    read, held = [], 0
    for shard_id in rng.permutation(per_shard.index[per_shard > 0].to_numpy()):
        if held >= 2 * wanted and len(read) >= least:
            break
        read.append(int(shard_id))
        held += int(per_shard[shard_id])
    read.sort()
    chosen = rng.choice(held, size=min(wanted, held), replace=False)
    starts = np.cumsum([0] + [int(per_shard[s]) for s in read])
    shares = np.bincount(np.searchsorted(starts, chosen, side="right") - 1, minlength=len(read))
    return {shard_id: int(shares[k]) for k, shard_id in enumerate(read)}


@dataclass(frozen=True)
class Referencing:
    """What the reference check uses of a run, made once (`of`) and sent with its shards' Dask tasks: documents are
    re-read as the tokenize stage read them."""

    store: Store  # the build
    reading: dict[str, ReadOptions]  # how each mixture source's files are read ("" for a single input)
    streams: dict[str, list[str]]  # where each source's documents went, in split order
    split: dict[str, float]
    tokenizer: TokenizerInfo
    bos: bool  # each stored document starts with BOS (tokenizer.prepend_bos)
    eod: bool  # and ends with EOD (tokenizer.append_eod)
    piece_bytes: int  # tokenizer.reference_piece_bytes: the most the reference encodes at once (excerpt_bytes)

    @classmethod
    def of(cls, config: TokenmillConfig, tokenizer: TokenizerInfo) -> Referencing:
        return cls(
            config.output.store(),
            reading(config, tokenizer),
            {name: config.streams(name) for name in config.inputs()},
            dict(config.split),
            tokenizer,
            config.tokenizer.prepend_bos,
            config.tokenizer.append_eod,
            int(config.tokenizer.reference_piece_bytes),
        )


def sampled_documents(run: Referencing, item: ReferenceItem) -> list[tuple[str, int, int, str]]:
    """(split, shard, index within the shard's split, text) of `item.sample` documents of a shard (an item of
    `reference_items`), re-read from the input: drawn from a few of the blocks tokenize read, chosen at random
    until they hold twice the sample (their places are in the shard's tokenize marker), or where the shard's
    marker does not say (input read another way, or made by an earlier tokenmill), drawn from the whole shard,
    read as tokenize read it."""
    rng = np.random.default_rng([item.seed, item.shard_id])
    piece_bytes = excerpt_bytes(item.most_bytes, run.piece_bytes)  # a longer document's excerpt
    found = _from_blocks(run, item, piece_bytes, rng)
    found = _from_shard(run, item, rng) if found is None else found
    return within_bytes(found, item.most_bytes, piece_bytes, rng)


def within_bytes(found: list[tuple], most_bytes: int, piece_bytes: int, rng: np.random.Generator) -> list[tuple]:
    """The documents of `found` (in its order) that a random order takes until the text the check encodes reaches
    `most_bytes` (a long document counted as the excerpt of `piece_bytes` that is checked of it, a pair as its
    three texts); at least one."""
    size = np.array([_encoded_size(text, piece_bytes) for *_, text in found])
    order = rng.permutation(len(found))
    kept = order[: max(1, int(np.searchsorted(np.cumsum(size[order]), most_bytes, side="right")))]
    return [found[k] for k in np.sort(kept)] if len(found) else found


def _encoded_size(text: str | RenderedChat | PairTexts, piece_bytes: int) -> int:
    """How much text the check encodes for a sampled document: a pair's prompt and both its sequences."""
    if isinstance(text, PairTexts):
        return len(text.prompt) + len(text.chosen) + len(text.rejected)
    return min(len(text.text if isinstance(text, RenderedChat) else text), piece_bytes)


def _from_blocks(run: Referencing, item: ReferenceItem, piece_bytes: int, rng: np.random.Generator) -> list | None:
    """`sampled_documents` from blocks without rejects, as `tokenize_shard` recorded them (`blocks` in its
    marker), taken in random order until they hold twice the sample, or twice the text the check encodes of them
    (`within_bytes`, a long document counted as its excerpt of `piece_bytes`: a books corpus's shard was read whole
    for an excerpt or two); None where it recorded none, or where they hold too few documents, or a block reads
    otherwise now."""
    shard_id, names = item.shard_id, run.streams[item.shard.mix_source]
    result = Tokenized.from_json(read_marker(run.store, TOKENIZE, shard_id)["result"])
    if not result.blocks:
        return None
    blocks = np.array(result.blocks, np.int64)  # piece, start, stop, first line, rejects, documents before...
    before = blocks[:, 5:]
    held = np.vstack([before[1:], [[result.splits[name]["documents"] for name in names]]]) - before
    order = rng.permutation(np.flatnonzero(blocks[:, 4] == 0))
    sample, enough = item.sample, np.cumsum(held[order].sum(axis=1))
    if not len(order) or enough[-1] < sample:
        return None
    pieces, options = item.shard.pieces, run.reading[item.shard.mix_source]
    read, text_read = [], 0  # (split names, their indexes, texts) of each batch of each block's documents; their text
    for b in order[: np.searchsorted(enough, 2 * sample) + 1]:
        if text_read >= 2 * item.most_bytes:
            break
        piece, start, stop, first_line, _, *counts = blocks[b].tolist()
        block = block_pieces(pieces, piece, start, stop, first_line, options)
        batches = list(read_documents(block, options, columnar=True))  # in as many batches as it takes
        if any(rejects for _, rejects in batches) or sum(len(batch) for batch, _ in batches) != held[b].sum():
            return None  # the file changed since: read the shard as tokenize did
        for batch, _ in batches:
            splits = assign_splits(batch.ids, run.split) if len(names) > 1 else np.zeros(len(batch), np.int64)
            indexes = np.zeros(len(batch), np.int64)
            for split, count in enumerate(counts):
                taken_here = np.count_nonzero(splits == split)
                indexes[splits == split] = count + np.arange(taken_here)
                counts[split] += taken_here
            read.append((splits, indexes, batch.text_values()))
            text_read += int(np.minimum(pc.binary_length(read[-1][2]), piece_bytes).sum())
    bounds = np.cumsum([0] + [len(splits) for splits, _, _ in read])
    found = []
    for drawn in np.sort(rng.choice(bounds[-1], size=min(sample, bounds[-1]), replace=False)):
        k = int(np.searchsorted(bounds, drawn, side="right")) - 1
        splits, indexes, texts = read[k]
        i = drawn - bounds[k]
        found.append((names[splits[i]], shard_id, int(indexes[i]), str(texts[i])))
    return found


def _from_shard(run: Referencing, item: ReferenceItem, rng: np.random.Generator) -> list[tuple]:
    """`sampled_documents` drawn uniformly from the whole shard, read as tokenize read it. Conversations are drawn
    from the shard's first CONVERSATIONS_READ times the sample: reading one means rendering it again, and the whole
    shard's would cost validate what the tokenize stage cost (a wrong mask is wrong in every conversation alike)."""
    shard_id, names = item.shard_id, run.streams[item.shard.mix_source]
    options = run.reading[item.shard.mix_source]
    drawn_from = min(item.documents, CONVERSATIONS_READ * item.sample) if options.conversations else item.documents
    positions = np.sort(rng.choice(drawn_from, size=item.sample, replace=False))
    found, position, counters = [], 0, np.zeros(len(names), np.int64)
    batch_bytes = SAMPLE_BATCH_BYTES if options.conversations else BATCH_BYTES
    for batch, _ in read_documents(item.shard.pieces, options, columnar=True, batch_bytes=batch_bytes):
        if position >= drawn_from:
            break
        splits = assign_splits(batch.ids, run.split) if len(names) > 1 else np.zeros(len(batch), np.int64)
        # a conversation with its spans, a pair's texts, or a document's text
        texts = batch.chats if batch.chats is not None else batch.pairs
        texts = texts if texts is not None else [str(text) for text in batch.text_values()]
        for i in positions[(positions >= position) & (positions < position + len(batch))] - position:
            split = splits[i]
            index = counters[split] + np.count_nonzero(splits[:i] == split)
            found.append((names[split], shard_id, int(index), texts[i]))
        counters += np.bincount(splits, minlength=len(names))
        position += len(batch)
    return found


def check_reference(run: Referencing, item: ReferenceItem) -> dict:
    """One shard's sampled documents (an item of `reference_items`) re-read from the input, their stored ids (read
    alone: `stored_sequences`) checked (on a worker, whose reference is loaded): they equal the reference's (HF
    tokenizers) encoding, and they decode to the source text (after the tokenizer's own normalization; documents
    that the tokenizer itself cannot round-trip are skipped). A document longer than its shard's share of the
    check's bytes (at most `tokenizer.reference_piece_bytes`: `reference.excerpt_bytes`) is checked on an excerpt of
    that size the reference encodes alone (`reference.checked_excerpt`), so memory and time are bounded whatever its
    size. A conversation's stored loss mask is checked too: it is exactly the mask of the tokens whose characters
    overlap its assistant spans (`chat.mask_problems`). `{"documents", "excerpts", "skipped", "wrong", "undecodable",
    "masks"}`, the last four naming files."""
    store, sample = run.store, sampled_documents(run, item)
    hf = loaded_backend(store.url_of(layout.TOKENIZER), run.tokenizer.sha256, "hf")
    tok, rng = hf.tokenizer, np.random.default_rng([item.seed, item.shard_id, 1])
    longest = excerpt_bytes(item.most_bytes, run.piece_bytes)  # a longer document is checked on an excerpt
    normalize = tok.normalizer.normalize_str if tok.normalizer else (lambda text: text)
    wrong, undecodable, masks, skipped = [], [], [], []
    checked = []  # (its name, the text checked, its stored ids, for a conversation its loss mask and the mask's name)
    pairs = []  # (its name, its texts, its two stored sequences: ids and loss mask each)
    drawn: dict[tuple[str, int], set[int]] = defaultdict(set)  # each shard split's sequences drawn
    masked: set[tuple[str, int]] = set()  # those of conversations and pairs: their loss masks too
    for split, shard_id, index, text in sample:
        drawn[split, shard_id] |= {2 * index, 2 * index + 1} if isinstance(text, PairTexts) else {index}
        if isinstance(text, RenderedChat | PairTexts):
            masked.add((split, shard_id))
    stored = {where: stored_sequences(store, *where, sequences, where in masked) for where, sequences in drawn.items()}
    for split, shard_id, index, text in sample:
        chat = isinstance(text, RenderedChat | PairTexts)
        prefix, sequences = layout.megatron_prefix(split, shard_id), stored[split, shard_id]
        if isinstance(text, PairTexts):  # a pair: the document of two sequences, chosen then rejected
            sides = [sequences[k] for k in (2 * index, 2 * index + 1)]
            pairs.append((f"{prefix}.bin: pair {index} (sequences {2 * index}, {2 * index + 1})", text, sides))
            continue
        stored_ids, mask = sequences[index]
        head, tail = (0, 0) if chat else (int(run.bos), int(run.eod))  # a template places its own specials
        ids, name = stored_ids[head : len(stored_ids) - tail], f"{prefix}.bin: document {index}"
        if chat:
            mask_name = f"{layout.loss_mask_file(split, shard_id)}: conversation {index}"
            checked.append((name, text, ids, (mask, mask_name)))
        elif len(text) <= longest // 4 or len(text.encode("utf-8", "surrogatepass")) <= longest:
            checked.append((name, text, ids, None))
        elif isinstance(part := checked_excerpt(tok, hf.token_places, text, ids, longest, rng), Excerpt):
            checked.append((f"{name} (an excerpt of it)", part.text, ids[part.first : part.last], None))
        elif part.startswith("wrong"):
            wrong.append(f"{name}: {part.removeprefix('wrong: ')}")
        else:
            skipped.append(f"{name} ({len(text):,} characters): {part.removeprefix('skipped: ')}")
    expected_pairs = tokenize_texts(tok, [text for _, text, _ in pairs])
    for (name, _, sides), expected in zip(pairs, expected_pairs, strict=True):
        masks += [f"{name}: {problem}" for problem in pair_problems(tok, expected, sides)]
    texts = [text.text if mask is not None else text for _, text, _, mask in checked]
    if any(mask is not None for *_, mask in checked):  # conversations: their masks need the reference's offsets
        encodings = [e for run_ in in_runs(texts, run.piece_bytes) for e in tok.encode_batch(texts[run_], False)]
        expected, offsets = [e.ids for e in encodings], [e.offsets for e in encodings]
    else:  # the documents the encoder was verified on are not encoded again
        expected = reference_ids(store, run.tokenizer.sha256, texts, tok, run.piece_bytes)
        offsets = [None] * len(texts)
    for (name, text, ids, mask), source, reference, spans in zip(checked, texts, expected, offsets, strict=True):
        ids = ids.tolist()
        if ids != reference:
            wrong.append(f"{name} differs from the reference (hf) encoding")
            # Decoded only here: ids equal to the reference's decode as the reference's do
            decoded, reference_decoded = (tok.decode(i, skip_special_tokens=False) for i in (ids, reference))
            if decoded != normalize(source) == reference_decoded:  # the reference round-trips; these ids do not
                undecodable.append(f"{name} does not decode to its source text")
        elif mask is not None:
            spans = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
            found = mask_problems(tok, text, np.asarray(ids), spans, mask[0])
            masks += [f"{mask[1]}: {p}" for p in found]
    excerpts = sum(name.endswith("(an excerpt of it)") for name, *_ in checked)
    return {
        "documents": len(sample) - len(skipped), "excerpts": excerpts, "pairs": len(pairs), "skipped": skipped,
        "wrong": wrong, "undecodable": undecodable, "masks": masks,
    }  # fmt: skip


def stored_sequences(
    store: Store, split: str, shard_id: int, sequences: set[int], masked: bool
) -> dict[int, tuple[np.ndarray, np.ndarray | None]]:
    """The tokens of these sequences of the shard split's `.bin`, and where `masked` their loss masks, read together:
    the `.idx` whole, then their spans alone (`Store.read_ranges`), not the shard's tokens."""
    prefix = layout.megatron_prefix(split, shard_id)
    with store.local_copies(prefix + ".idx") as (idx_path,):
        index = MegatronIndex(idx_path)
        order = sorted(sequences)
        firsts = [int(index.pointers[k]) // index.dtype.itemsize for k in order]
        spans = [(first, first + int(index.lengths[k])) for first, k in zip(firsts, order, strict=True)]
        dtype = index.dtype
    tokens = store.read_ranges(prefix + ".bin", [(a * dtype.itemsize, b * dtype.itemsize) for a, b in spans])
    masks = store.read_ranges(layout.loss_mask_file(split, shard_id), spans) if masked else [None] * len(spans)
    return {
        k: (np.frombuffer(ids, dtype), None if mask is None else np.frombuffer(mask, np.uint8))
        for k, ids, mask in zip(order, tokens, masks, strict=True)
    }


def reference_verdict(config: TokenmillConfig, checked: list[dict]) -> list[str]:
    """What `check_reference` found over the whole sample, recorded in layout.REFERENCE_CHECK: the problems, where
    more documents differ than `tokenizer.allowed_mismatch_rate` allows, or some do not decode to their text."""
    documents = sum(c["documents"] for c in checked)
    if not documents:
        return []
    wrong = [w for c in checked for w in c["wrong"]]
    undecodable = [u for c in checked for u in c["undecodable"]]
    rate, allowed = len(wrong) / documents, config.tokenizer.allowed_mismatch_rate
    store = config.output.store()
    record = {"documents": documents, "mismatches": len(wrong), "allowed_rate": allowed}
    if excerpts := sum(c.get("excerpts", 0) for c in checked):  # long documents, checked on an excerpt
        record["excerpts"] = excerpts
    if skipped := [s for c in checked for s in c.get("skipped", ())]:  # long documents no excerpt could be cut of
        record["skipped"] = skipped[:10] + ([f"... and {len(skipped) - 10} more"] if len(skipped) > 10 else [])
    store.write_json(layout.REFERENCE_CHECK, record)
    problems = undecodable[:10]
    if masks := [m for c in checked for m in c.get("masks", ())]:  # a wrong loss mask is never allowed
        what = "conversations' loss masks are not their assistant turns"
        if sum(c.get("pairs", 0) for c in checked):
            what = "pairs are not their prompt and completions, with the loss on the completions only"
        problems += [f"{len(masks)} sampled {what}", *masks[:10]]
    if rate > allowed:
        summary = f"{len(wrong)} of {documents} documents re-encoded with hf differ (allowed rate {allowed})"
        problems += [summary, *wrong[:10]]
    return problems


@dataclass(frozen=True)
class ShardFiles:
    """A shard's rows of the stats table, a dict per split, for `check_shard`; `bytes` (4 per token: about what
    its files hold) sizes the Dask tasks (`tasks.shards`)."""

    shard_id: int
    rows: list[dict]
    bytes: int = 0


class ShardsFiles(Columns):
    """Every shard's `ShardFiles`, as columns: an item is made only while its shard is sent to be checked (a
    dict per row, held for every shard while they are checked, was 1 KB a row)."""

    @staticmethod
    def item(row: dict) -> ShardFiles:
        return ShardFiles(**row)


def shard_rows(table: pd.DataFrame) -> ShardsFiles:
    """The stats table as one `ShardFiles` per shard."""
    ordered = table.sort_values("shard_id", kind="stable")
    ids = ordered.shard_id.to_numpy()
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]]) if len(ids) else np.zeros(0, np.int64)
    rows = pa.Table.from_pandas(ordered[COLUMNS], preserve_index=False).to_struct_array().combine_chunks()
    tokens = np.add.reduceat(ordered.tokens.to_numpy(np.int64), starts) if len(ids) else np.zeros(0, np.int64)
    return ShardsFiles(
        pa.table(
            {
                "shard_id": ids[starts],
                "rows": pa.ListArray.from_arrays(np.r_[starts, len(ids)].astype(np.int32), rows),
                "bytes": 4 * tokens,
            }
        )
    )


@dataclass(frozen=True)
class Checking:
    """What the check of a shard's files uses of a run, made once (`of`) and sent with its shards' Dask tasks."""

    store: Store  # the build
    vocab_size: int
    bos_id: int | None  # before each document, else None
    eod_id: int | None  # after each document, else None
    pack: PackConfig | None  # how rows were packed; None: no packed rows
    pad_id: int
    llmc_shard_tokens: int | None  # the tokens of an llm.c file; None: no llm.c files
    trainers: tuple[str, ...] = ()  # the trainers' layouts written (`OutputConfig.trainers`)
    seq_len: int = 0  # the tokens of an MDS row (pack.seq_len)
    pairs: frozenset[str] = frozenset()  # the streams of preference pairs

    @classmethod
    def of(cls, config: TokenmillConfig, tokenizer: TokenizerInfo) -> Checking:
        return cls(
            config.output.store(),
            tokenizer.vocab_size,
            tokenizer.bos_id if config.tokenizer.prepend_bos else None,
            tokenizer.eod_id if config.tokenizer.append_eod else None,
            config.pack if writes_packed(config) else None,
            pack_pad_id(config, tokenizer),
            config.output.llmc_shard_tokens if "llmc" in config.output.formats else None,
            config.output.trainers(),
            config.pack.seq_len,
            frozenset(config.pair_streams()),
        )


def check_shard(run: Checking, shard: ShardFiles) -> list[str]:
    """Every file of one shard (an item of `shard_rows`) against its stats: what is wrong, naming the files. Each
    format's files are checked by its module (`formats.table`)."""
    dtype = token_dtype(run.vocab_size)
    own = [FORMATS["megatron"]]
    own += [FORMATS["packed"]] if run.pack is not None else []
    own += [FORMATS["llmc"]] if run.llmc_shard_tokens is not None else []
    problems = []
    for row in (SimpleNamespace(**{k: _plain(v) for k, v in r.items()}) for r in shard.rows):
        if row.documents == 0 and run.store.exists(bin_rel := layout.megatron_prefix(row.split, row.shard_id) + ".bin"):
            problems.append(f"{bin_rel}: exists but stats say its split has no documents")
        found = [(format, format.module().split_files(row, run)) for format in own]
        if run.trainers and row.documents:
            trainers, problem = _trainers_of(row, run.trainers)
            found += [(format, layout.trainer_files(format.name, row.split, row.shard_id)) for format in trainers]
            problems += problem
        for format, rels in found:
            if missing := [rel for rel in rels if not run.store.exists(rel)]:
                problems += [f"{rel}: missing" for rel in missing]
            elif rels:
                with run.store.local_copies(*rels) as paths:
                    problems += format.module().check(SplitFound(rels, paths, row, dtype, run.seq_len, run))
    return problems


def _trainers_of(row, trainers: tuple[str, ...]) -> tuple[list[Format], list[str]]:
    """The trainers' layouts of a shard's split: those made from its documents, and those made as conversations or
    pairs are packed where the split's packed rows hold any; and what is wrong if the stats count other files."""
    packing = row.supervised_tokens >= 0 and row.packed_rows > 0
    wanted = [FORMATS[f] for f in trainers if FORMATS[f].made_from == "documents" or packing]
    if sum(len(format.files) for format in wanted) == row.trainer_files:
        return wanted, []
    names = [format.name for format in wanted]
    return [], [f"{layout.shard_name(row.shard_id)} {row.split}: {row.trainer_files} trainer files, not {names}"]


def check_written(run: Checking, results: tuple) -> list[str]:
    """`check_shard` as the last step of a shard's chain on the cluster (`results`: its tokenize result, and its
    pack result where the pack wrote files): its files are read back while they are still in the page cache (those
    written around it, a run's `.bin` where no pack stage reads it, with O_DIRECT). Read after the stage, outputs
    the page cache no longer holds (a corpus larger than the memory, or pushed out by the input) come back from
    disk: 0.5 s of CPU per 1 GB shard, against 0.03 s fresh. Files that passed it as they are now (a reused shard's,
    found intact by their sha256) are not read again: a shard that passes gets a check marker (`checked_key`), which
    a nightly run over a grown input finds for every shard it kept."""
    tokenized, packed = results if len(results) == 2 else (results[0], skipped(results[0]))
    key = checked_key(run, tokenized.shard_id, (TOKENIZE, PACK)[: len(results)])
    if committed(run.store, CHECK, tokenized.shard_id, key) is not None:
        return []
    rows = [dict(zip(COLUMNS, row, strict=True)) for row in stats_rows(tokenized, packed)]
    problems = check_shard(run, ShardFiles(tokenized.shard_id, rows))
    if not problems:
        commit(run.store, CHECK, tokenized.shard_id, key, {"problems": 0})
    return problems


def checked_key(run: Checking, shard_id: int, stages: tuple[str, ...]) -> str:
    """What the check of a shard's files found depends on: the markers of the `stages` of its chain (results, and
    every file's size and sha256, which the files are found to have before any check of them; not the stamps a
    later run adds), the check's parameters and tokenmill."""
    markers = [read_marker(run.store, stage, shard_id) for stage in stages]
    markers = [{k: v for k, v in m.items() if k != "stamps"} if m else m for m in markers]
    parameters = {f.name: getattr(run, f.name) for f in fields(run) if f.name != "store"}
    made_of = orjson.dumps([markers, parameters, __version__], default=_as_json, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(made_of).hexdigest()


def _as_json(value):
    if isinstance(value, PackConfig):
        return value.model_dump(mode="json")
    if isinstance(value, frozenset):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not part of a check's key")


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value


def validate(
    config: TokenmillConfig, plan: Plan, tokenizer: TokenizerInfo, table: pd.DataFrame, run: RunShards | None = None,
    checked: list[str] | None = None, away: CallAway | None = None,
) -> pd.DataFrame:  # fmt: skip
    """Check the stats table (`stats_table` of the tokenize and pack results) and the files; write `stats.json`
    and return the table, or raise ValidationFailed. `run` runs the per-shard checks where the caller wants
    (on the cluster), `away` the table's (`stats_problems`: pandera, which a flow's process must not import, see
    `schema_library`); None: here. `checked`: what every shard's files were found to have wrong already
    (`check_written`, in the tokenize stage), else they are checked here."""
    packing = writes_packed(config)
    store = config.output.store()
    if not table.documents.sum():
        raise ValidationFailed(
            f"nothing to tokenize: {all_rejected(store, table)}; nothing was published: fix the input files or "
            "the input config (input.text_field, input.format) and run again"
        )
    run = run or (lambda name, items, work, context, *args: [work(context, item, *args) for item in items])
    away = away or (lambda work, *args: work(*args))
    with ThreadPoolExecutor(1, thread_name_prefix="tokenmill-reference") as pool:
        # The reference's re-encoding of sampled documents runs while the table and the files are checked (in
        # the caller's context: its logging); it counts only where they are sound: decoding damaged files
        # means nothing.
        sample, reference = reference_items(config, plan, table), None
        if sample:
            reference = pool.submit(
                copy_context().run, run, "reference", sample, check_reference, Referencing.of(config, tokenizer)
            )
        planned, splits = shard_ids(plan.shards).tolist(), config.streams()
        failed = away(stats_problems, table, planned, splits, tokenizer.vocab_size, config.pack if packing else None)
        if failed:
            raise ValidationFailed("stats table failed validation:\n" + "\n".join(failed))
        if checked is None:
            checking = Checking.of(config, tokenizer)
            checked = [p for found in run("check", shard_rows(table), check_shard, checking) for p in found]
        problems = list(checked)
        if packing:
            for split in config.streams():
                problems += _check_shuffle(store, split, table[table.split == split])
        if not problems and reference is not None:
            problems += reference_verdict(config, reference.result())
    if problems:
        raise ValidationFailed("dataset files failed validation:\n" + "\n".join(f"  - {p}" for p in problems))
    store.write_json(layout.STATS, STREAMED, records(table))
    return table


def records(table: pd.DataFrame) -> Iterator[dict]:
    """The table's rows as dicts (as `to_dict(orient="records")` makes them), a few thousand at a time: a dict
    per row is about 1 KB."""
    for start in range(0, len(table), ROWS_AT_ONCE):
        yield from table.iloc[start : start + ROWS_AT_ONCE].to_dict(orient="records")


def _failure_lines(cases: pd.DataFrame, table: pd.DataFrame) -> list[str]:
    """One line per failed check (pandera's failure cases), naming the shards and splits (not pandera's
    cell-by-cell dump)."""
    lines = []
    for check, found in cases.groupby("check", sort=False):
        rows = sorted({int(i) for i in found["index"].dropna()})
        where = ", ".join(f"shard {table.shard_id[i]:05d}/{table.split[i]}" for i in rows[:10])
        if len(rows) > 10:
            where += f" and {len(rows) - 10} more"
        lines.append(f"  - {check}" + (f": {where}" if where else ""))
    return lines
