"""The tokenize stage for one shard: read documents, assign each to its split, encode, write Megatron files.

Output per split: `megatron/<split>/shard-NNNNN.bin/.idx` (one sequence per document, EOD included) and its
documents table `.docs.parquet` (`formats.provenance`: each document's id, file, line and place in the `.bin`),
written only for splits that received documents; `rejects/shard-NNNNN.jsonl` for records that are
not documents. The commit marker written last holds the shard's counts.

The data path is batch-wise numpy: the reader hands over a batch of texts (about 8 MB), the encoder chosen
once for the run returns their ids as one flat array plus lengths, which are copied once into the file's dtype with
BOS/EOD in place (`with_specials`), and each split's tokens are written as one slice. No Python runs per token, nor
per document but a slice's copy where documents are long.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, suppress
from dataclasses import asdict, dataclass
from typing import BinaryIO

import numpy as np
import orjson
from tokenizers import Tokenizer

from tokenmill.config import TokenmillConfig
from tokenmill.core import layout
from tokenmill.core.commits import TOKENIZE, check, commit, read_marker, shard_key, tokenize_key
from tokenmill.core.hashing import assign_splits
from tokenmill.core.packers import writes_files
from tokenmill.core.plan import Shard
from tokenmill.core.stats import Tokenized
from tokenmill.formats.megatron import BinWriter, fitting, narrowed, token_dtype, write_index
from tokenmill.formats.provenance import (
    batch_origins,
    numbered,
    read_documents_table,
    split_rows,
    write_documents_table,
)
from tokenmill.io.names import compression_of
from tokenmill.io.readers import (
    CORRUPT_STREAM,
    LINE_KINDS,
    SAMPLE_BLOCK_BYTES,
    TABLES,
    Batch,
    Piece,
    ReadOptions,
    block_place,
    fast_path_applies,
    kind_of,
    piece_groups,
    read_documents,
    read_lines,
    sampled_blocks,
)
from tokenmill.io.storage import HASH_THREADS, Store, threaded, threads_for
from tokenmill.tokenizers import chat, preference
from tokenmill.tokenizers.encoders import (
    CACHE_LIMIT_WITHOUT_DASK,
    Encoder,
    EncoderChoice,
    as_arrow,
    bound_cache,
    cached_choice,
    choose_encoder,
    clean_byte_pieces,
    load_encoder,
    loaded_backend,
    preload_backends,
    remember_choice,
    utf8_buffer,
)
from tokenmill.tokenizers.reference import (
    VERIFY_BYTES,
    excerpt,
    excerpt_bytes,
    keep_reference_ids,
    sized_to_the_run,
)
from tokenmill.tokenizers.tokenizer_info import TokenizerInfo, reading

SAMPLE_BATCH_BYTES = 1 << 20  # the verification sample reads a little of each shard, not 8 MB of each
VERIFY_SHARDS = 256  # shards the verification sample is drawn from, evenly spaced across the run
VERIFY_BLOCKS = 4  # blocks (readers.SAMPLE_BLOCK_BYTES) of each of their pieces, at seeded places
VERIFY_SEED = 20261128


LONG_DOCUMENTS = 1024  # tokens a document on average, past which a batch's ids are copied a document at a time


def with_specials(
    flat: np.ndarray, lengths: np.ndarray, bos_id: int | None, eod_id: int | None, dtype: np.dtype | None = None
):
    """Each document's ids preceded by BOS and followed by EOD (when given), as `dtype` (`flat`'s by default; ids it
    holds, `fitting`): the ids copied once, cast on the way, to their places between the marks, a slice a document
    where the documents are long (code's files), else through a mask of their places (np.insert's way, the fewer
    Python steps where documents are many and short)."""
    marks = [token for token in (bos_id, eod_id) if token is not None]
    if not marks:
        return flat.astype(dtype or flat.dtype, copy=False), lengths
    ends = np.cumsum(lengths)
    starts = ends - lengths
    ids_at = starts + len(marks) * np.arange(len(lengths)) + (bos_id is not None)  # each document's first id
    out = np.empty(len(flat) + len(marks) * len(lengths), dtype or flat.dtype)
    marked = [(ids_at - 1, bos_id), (ids_at + lengths, eod_id)]
    marked = [(positions, token) for positions, token in marked if token is not None]
    for positions, token in marked:
        out[positions] = token
    if len(lengths) * LONG_DOCUMENTS <= len(flat):
        for to, start, end in zip(ids_at.tolist(), starts.tolist(), ends.tolist(), strict=True):
            out[to : to + end - start] = flat[start:end]
    else:
        holds_ids = np.ones(len(out), bool)
        for positions, _ in marked:
            holds_ids[positions] = False
        out[holds_ids] = flat
    return out, lengths + len(marks)


def encoded_parts(
    encode: Encoder, texts, most_bytes: int, dtype: np.dtype, bos_id: int | None, eod_id: int | None
) -> Iterator[tuple[slice, np.ndarray, np.ndarray | None]]:
    """A batch's ids, narrowed to `dtype` with BOS/EOD in place, a part at a time: (its documents, their ids, their
    lengths). A document of more than `most_bytes` of text is a part of its own, encoded in pieces of about that size
    cut where the reference splits alike (`encoders.clean_byte_pieces`: the same ids as whole), each piece a part
    whose lengths are None but the last's (the document's): the encoder's arrays never hold more than about
    `most_bytes` of text's ids, whatever the documents. The runs between long documents go whole."""
    texts = as_arrow(texts)
    data, offsets = utf8_buffer(texts)
    sizes = np.diff(offsets)
    tok = reference_tokenizer(encode)
    long = np.flatnonzero(sizes > most_bytes) if tok is not None else np.zeros(0, np.int64)
    start = 0
    for doc in (*long.tolist(), len(texts)):
        if doc > start:
            ids, lengths = encode.encode_batch(texts[start:doc])
            yield slice(start, doc), *with_specials(fitting(ids, dtype), lengths, bos_id, eod_id, dtype)
        if doc == len(texts):
            break
        total, pieces = 0, clean_byte_pieces(tok, data[offsets[doc] : offsets[doc + 1]], most_bytes)
        piece = next(pieces)
        for following in (*pieces, None):  # the document's pieces, one ahead: its last gets the EOD and its length
            ids = narrowed(encode.encode_batch([piece])[0], dtype)
            first, last = total == 0, following is None
            marks = ([bos_id] if first and bos_id is not None else [], [eod_id] if last and eod_id is not None else [])
            if marks != ([], []):
                ids = np.concatenate([np.array(marks[0], dtype), ids, np.array(marks[1], dtype)])
            total += len(ids)
            yield slice(doc, doc + 1), ids, np.array([total]) if last else None
            piece = following
        start = doc + 1


def reference_tokenizer(encode: Encoder) -> Tokenizer | None:
    """The HF tokenizer that finds where a long document may be cut (the chosen encoder's reference)."""
    reference = getattr(encode, "reference", encode)
    return getattr(reference, "tokenizer", None) if reference.name == "hf" else None


@dataclass(frozen=True)
class Tokenizing:
    """What the tokenize stage uses of a run, made once (`of`) and sent with its shards' Dask tasks."""

    store: Store  # the build
    metadata_fields: dict[str, list[str]]  # each source's fields carried into the documents tables
    key: str  # the run's part of each shard's stage key (`commits.tokenize_key`)
    reading: dict[str, ReadOptions]  # how each mixture source's files are read ("" for a single input)
    streams: dict[str, list[str]]  # where each source's documents go, in split order (`config.streams`)
    split: dict[str, float]  # the split fractions
    tokenizer: TokenizerInfo
    encoder: EncoderChoice  # the run's choice
    bos_id: int | None  # put before each document (tokenizer.prepend_bos), else None
    eod_id: int | None  # put after each document (tokenizer.append_eod), else None
    batch_bytes: int  # text read and encoded at once (tokenizer.batch_bytes): a longer document in pieces
    encoder_cache_limit: int | None  # tokenizer.encoder_cache_limit; None: auto, as each worker's memory limit says
    packs: bool  # a pack stage reads each `.bin` whole again (`packers.writes_files`); else it goes around the cache

    @classmethod
    def of(cls, config: TokenmillConfig, tokenizer: TokenizerInfo, encoder: EncoderChoice | None = None) -> Tokenizing:
        """`encoder`: the run's choice; None, the reference (HF tokenizers)."""
        return cls(
            config.output.store(),
            {name: source.metadata_fields for name, source in config.inputs().items()},
            tokenize_key(config, tokenizer),
            reading(config, tokenizer),
            {name: config.streams(name) for name in config.inputs()},
            dict(config.split),
            tokenizer,
            encoder or EncoderChoice("hf", "", "the reference"),
            tokenizer.bos_id if config.tokenizer.prepend_bos else None,
            tokenizer.eod_id if config.tokenizer.append_eod else None,
            int(config.tokenizer.batch_bytes),
            None if config.tokenizer.encoder_cache_limit == "auto" else int(config.tokenizer.encoder_cache_limit),
            writes_files(config),
        )


def tokenize_shard(run: Tokenizing, shard: Shard) -> Tokenized:
    """Tokenize one shard of the plan (or return its committed result)."""
    store, shard_id = run.store, shard.shard_id
    key = shard_key(run.key, shard.source)
    earlier = check(store, TOKENIZE, shard_id, key)
    if earlier.result is not None:
        return Tokenized.from_json(earlier.result, reused=True)

    started = time.perf_counter()
    options, pieces = run.reading[shard.mix_source], shard.pieces
    encode = load_encoder(store.url_of(layout.TOKENIZER), run.tokenizer.sha256, run.encoder)
    bound_cache(encode, run.encoder_cache_limit or encoder_cache_limit_here())
    eod_id, bos_id = (None, None) if options.conversations else (run.eod_id, run.bos_id)  # a template places them
    if options.conversations:  # the masks need where each token lies: the reference says, or its offsets tell
        reference = loaded_backend(store.url_of(layout.TOKENIZER), run.tokenizer.sha256, "hf")
        fast = encode if encode.name != "hf" else None
        if options.pairs is not None:  # by the run's encoder; plain text with the reference's special tokens
            encode_pair_texts = preference.encoder_encode(encode, reference.tokenizer)
    rerouted_before = getattr(encode, "rerouted", 0)
    dtype = token_dtype(run.tokenizer.vocab_size)
    splits = run.streams[shard.mix_source]  # the split names, `<source>/<split>` in a mixture
    counts = {s: {"documents": 0, "tokens": 0, "max_token_id": -1} for s in splits}
    if options.conversations:  # and pairs: their loss masks
        for c in counts.values():
            c["supervised"] = 0
    documents_in = bytes_in = 0
    rejects: list[bytes] = []
    unnumbered = lines = 0  # rejects whose lines count from their piece's start; the lines read
    whole_files: list[str] = []  # rejects that are a whole file (unreadable, empty): said in the run's summary
    files: dict[str, dict] = {}  # size and sha256 of each file written, for the marker
    # Where each block the fast path read lies, so that validate's reference sample re-reads a few blocks, not
    # the shard (`tokenmill.stages.validate.sampled_documents`): [its piece, start, stop, first line, rejects, documents
    # before it in each split], where a table file's group of rows g (read in several batches) is [g, g + 1) and a
    # run of n whole small files read as one batch (-n, 0) from the first. None where a batch came another way
    # (conversations).
    blocks: list[list[int]] | None = []
    block = None  # the last one
    documents: dict[str, list] = {s: [] for s in splits}  # each split's rows of its documents table, batch by batch
    metadata_fields = run.metadata_fields[shard.mix_source]
    with ExitStack() as stack:
        writers: dict[str, BinWriter] = {}
        mask_files: dict[str, BinaryIO] = {}  # conversations: each split's loss mask, a byte per token
        piece_of = {piece.path: index for index, piece in enumerate(pieces)}  # a block is read back by its path

        def writer_for(split: str) -> BinWriter:
            if split not in writers:
                bin_rel = layout.megatron_prefix(split, shard_id) + ".bin"
                bin_file = store.writing_file(bin_rel, files, read_again=run.packs)
                writers[split] = BinWriter(stack.enter_context(bin_file), dtype)
            return writers[split]

        for batch, batch_rejects in read_documents(pieces, options, True, run.batch_bytes):
            if batch.block is None:
                blocks = None
            elif blocks is not None and batch.block is block:  # the next batch of a group of rows
                blocks[-1][4] += len(batch_rejects)
            elif blocks is not None:
                block, before = batch.block, [counts[s]["documents"] for s in splits]
                first = block[0] if isinstance(block, list) else block  # a run of whole files: from the first
                blocks.append(
                    [piece_of[first.path], *block_place(block), first.first_line, len(batch_rejects), *before]
                )
            documents_in += len(batch) + len(batch_rejects)
            bytes_in += batch.nbytes
            lines += batch.lines
            rejects.extend(orjson.dumps(r.to_dict()) + b"\n" for r in batch_rejects)
            unnumbered += sum(r.from_byte is not None for r in batch_rejects)
            whole_files += [f"{r.file}: {r.reason}" for r in batch_rejects if r.line == 0]
            if not len(batch):
                continue
            masks = sequences = None  # a loss mask per token; pairs: each one's two sequences' lengths
            if batch.pairs is not None:  # tokenized as TRL does, by the run's encoder
                ids, masks, sequences, _ = preference.encode_pairs(batch.pairs, encode_pair_texts)
                parts = [(slice(None), narrowed(ids, dtype), sequences[0::2] + sequences[1::2])]
            elif batch.chats is not None:
                ids, lengths, masks = chat.encode_batch(reference.tokenizer, batch.chats, fast, reference.token_offsets)
                parts = [(slice(None), narrowed(ids, dtype), lengths)]
            else:  # narrowed to the files' dtype before the specials go in; a long document in pieces
                parts = encoded_parts(encode, batch.text_values(), run.batch_bytes, dtype, bos_id, eod_id)
            # One split needs no hashing; otherwise each document's split by the stable hash of its id.
            batch_split = assign_splits(batch.ids, run.split) if len(splits) > 1 else None
            batch_origins_ = batch_origins(batch, metadata_fields)
            held = (0, -1)  # the tokens and the largest id of a long document's pieces written before its last
            for docs, flat, lengths in parts:
                whole = docs == slice(None)
                doc_split = batch_split if batch_split is None or whole else batch_split[docs]
                if lengths is None:  # a piece of a long document, its length to come with its last piece
                    writer_for(splits[0 if doc_split is None else doc_split[0]]).add_part(flat)
                    held = (held[0] + len(flat), max(held[1], int(flat.max()) if len(flat) else -1))
                    continue
                origins = batch_origins_ if whole else batch_origins_.slice(docs.start, docs.stop - docs.start)
                to = list(enumerate(splits))
                if held[0]:  # the last piece of a long document: its ids are this piece's, its length the whole's
                    to, doc_split = [to[0 if doc_split is None else int(doc_split[0])]], None
                for index, split in to:
                    chosen = slice(None) if doc_split is None else doc_split == index
                    split_lengths = lengths[chosen]
                    if not len(split_lengths):
                        continue
                    taken = slice(None) if doc_split is None else np.repeat(chosen, lengths)
                    split_tokens = flat[taken]
                    written = split_lengths  # a pair is a Megatron document of two sequences, chosen then rejected:
                    if sequences is not None:
                        written = sequences[slice(None) if doc_split is None else chosen.repeat(2)]
                    writer_for(split).add(split_tokens, written)
                    c = counts[split]
                    rows = split_rows(origins, None if doc_split is None else chosen, split_lengths, c["tokens"],
                                      shard.mix_source, split)  # fmt: skip
                    documents[split].append(rows)
                    if masks is not None:
                        if split not in mask_files:
                            mask_file = store.writing_file(layout.loss_mask_file(split, shard_id), files)
                            mask_files[split] = stack.enter_context(mask_file)
                        split_masks = masks[taken]
                        mask_files[split].write(split_masks.tobytes())
                        c["supervised"] += int(split_masks.sum())
                    c["documents"] += len(split_lengths)
                    c["tokens"] += len(split_tokens) + held[0]
                    top = int(split_tokens.max()) if len(split_tokens) else -1
                    c["max_token_id"] = max(c["max_token_id"], top, held[1])
                held = (0, -1)
    # The .bin files are committed; now their indexes, then the rejects, then the marker.
    for split, writer in writers.items():
        with store.writing(layout.megatron_prefix(split, shard_id) + ".idx", files) as tmp:
            write_index(tmp, writer.all_lengths(), dtype, 2 if options.pairs is not None else 1)
        with store.writing(layout.documents_table(split, shard_id), files) as tmp:
            write_documents_table(tmp, documents[split])
    if rejects:
        store.write_bytes(layout.rejects_file(shard_id), b"".join(rejects), files)
    else:
        store.remove(layout.rejects_file(shard_id))
    result = Tokenized(
        shard_id,
        shard.source,
        documents_in=documents_in,
        rejected=len(rejects),
        bytes_in=bytes_in,
        splits=counts,
        files_rejected=whole_files,
        unnumbered_rejects=unnumbered,
        unnumbered_lines=pieces[0].first_line is None,
        lines=lines if cut_piece(pieces[0]) and fast_path_applies(pieces[0], options) else None,
        blocks=blocks or None,
        encoder=encode.name,
        rerouted_to_reference=getattr(encode, "rerouted", 0) - rerouted_before,
        seconds=round(time.perf_counter() - started, 3),
        redone=earlier.redone,
    )
    commit(store, TOKENIZE, shard_id, key, result.to_json(), files)
    return result


def encoder_cache_limit_here() -> int:
    """tokenizer.encoder_cache_limit auto on this worker: half its Dask memory limit."""
    limit = None
    if "distributed" in sys.modules:  # else no Dask worker, and no import of Dask for nothing (0.3 s)
        with suppress(ValueError):  # not on a Dask worker
            limit = sys.modules["distributed"].get_worker().memory_manager.memory_limit
    return limit // 2 if limit else CACHE_LIMIT_WITHOUT_DASK


def cut_piece(piece: Piece) -> bool:
    """Whether the piece is one of several of its file's bytes (a compressed stream's last runs to its end)."""
    return piece.row_groups is None and (piece.end is not None or piece.start > 0)


def number_lines(config: TokenmillConfig, shards: Sequence[Shard], unnumbered: list[int]) -> None:
    """Give the documents and rejects of the `unnumbered` shards their line in the file: each is a piece of a cut
    file whose first line the partition did not count (`partition.counts_lines`), so their lines count from the
    piece's start (a reject says so with `from_byte`). The pieces before it are tokenized now, and their markers hold
    their lines. The shards are numbered on threads (their work is Arrow's and zlib's, which release the GIL)."""
    store, wanted = config.output.store(), set(unnumbered)
    pieces_of: dict[str, list[tuple[int, int]]] = {}  # a cut file -> (start, shard id) of each of its pieces
    for shard in shards:
        (piece, *others) = shard.pieces
        if not others and cut_piece(piece):
            pieces_of.setdefault(piece.path, []).append((piece.start, shard.shard_id))
    pieces = []  # each file with an unnumbered piece: its pieces in order, up to the last unnumbered one
    for file in map(sorted, pieces_of.values()):
        if last := max((k + 1 for k, (_, shard_id) in enumerate(file) if shard_id in wanted), default=0):
            pieces.append(file[:last])
    ids = [shard_id for file in pieces for _, shard_id in file]
    markers = threaded(lambda i: read_marker(store, TOKENIZE, i), ids, threads_for(store))
    done = dict(zip(ids, markers, strict=True))
    first_lines = {}
    line_ids = {
        shard.shard_id for shard in shards if shard.shard_id in wanted and config.input_of(shard).id_field is None
    }
    for file in pieces:
        line = 1
        for _, shard_id in file:
            if shard_id in wanted:
                first_lines[shard_id] = line
            line += done[shard_id]["result"]["lines"]
    threads = max(threads_for(store), min(HASH_THREADS, os.cpu_count() or 1))
    for _ in threaded(lambda i: number_shard(store, i, done[i], first_lines[i], i in line_ids), first_lines, threads):
        pass


def number_shard(store: Store, shard_id: int, done: dict, first_line: int, line_ids: bool) -> None:
    """One shard's documents tables and rejects written again with their lines counted from `first_line` (and with
    `line_ids`, no `input.id_field`, the tables' ids `<file>:<line>`), then its tokenize marker (`done`, as
    committed) with their new sizes and sha256 (a run killed between the two redoes the shard: its files changed
    since its commit). No layout is made from them here: where one names the lines or the ids (OLMo's `.csv.gz`),
    the partition counted them (`partition.counts_lines`)."""
    files, result = done["files"], done["result"]
    for split, counts in result["splits"].items():
        if counts["documents"] and result.get("unnumbered_lines"):
            rel = layout.documents_table(split, shard_id)
            with store.local_copies(rel) as (path,):
                table = read_documents_table(path)
            with store.writing(rel, files) as tmp:
                write_documents_table(tmp, [numbered(table, first_line, line_ids)])
    if result.get("unnumbered_rejects"):
        rejects = [orjson.loads(line) for line in store.read_bytes(layout.rejects_file(shard_id)).splitlines()]
        for reject in rejects:
            if reject.pop("from_byte", None) is not None:
                reject["line"] += first_line - 1
        store.write_bytes(layout.rejects_file(shard_id), b"".join(orjson.dumps(r) + b"\n" for r in rejects), files)
    commit(store, TOKENIZE, shard_id, done["key"], result | {"unnumbered_rejects": 0, "unnumbered_lines": False},
           files)  # fmt: skip


def preload_encoder(config: TokenmillConfig, tokenizer: TokenizerInfo) -> None:
    """Load the encoders this run will most likely choose into this (worker) process, while the run's choice is
    verified: each worker's first shard then starts encoding at once."""
    preload_backends(config.output.store().url_of(layout.TOKENIZER), tokenizer.sha256, config.tokenizer.encoder)


def verification_shards(shards: Sequence[Shard]) -> Sequence[Shard]:
    """The shards the verification sample is drawn from: at most VERIFY_SHARDS, evenly spaced across the run."""
    return shards[:: -(-len(shards) // VERIFY_SHARDS)] if len(shards) else shards


def verification_sample(config: TokenmillConfig, shards: Sequence[Shard], tokenizer: TokenizerInfo) -> list[str]:
    """About `tokenizer.verify_documents` texts, at most `tokenizer.verify_bytes` in all (less in a small run:
    `reference.sized_to_the_run`), drawn across the corpus: an equal share from each of `verification_shards`, from a
    few blocks at seeded places across each of its line-based pieces (from its start where a piece is read another
    way), and a long document as an excerpt of its share (`reference.excerpt_bytes`). So it costs little however large
    the shards, how many, and however long their documents."""
    settings, options = config.tokenizer, reading(config, tokenizer)
    most = sized_to_the_run(settings.verify_bytes, VERIFY_BYTES, sum(shard.bytes for shard in shards))  # those sent
    if not len(shards) or not settings.verify_documents or not most:
        return []
    shards = verification_shards(shards)
    share = max(1, -(-settings.verify_documents // len(shards)))
    share_bytes = max(1, most // len(shards))
    longest = excerpt_bytes(share_bytes, int(settings.reference_piece_bytes))
    texts: list[str] = []
    for shard in shards:
        rng = np.random.default_rng([VERIFY_SEED, shard.shard_id])
        taken = taken_bytes = 0
        for values in verification_texts(shard, options[shard.mix_source], share_bytes, rng):
            step = max(1, len(values) // share)
            for text in values[::step][: share - taken]:
                text = excerpt(text, longest, int(rng.integers(1 << 62)))
                texts.append(text)
                taken, taken_bytes = taken + 1, taken_bytes + len(text)
                if taken_bytes >= share_bytes:
                    break
            if taken >= share or taken_bytes >= share_bytes:
                break
    return texts


def verification_texts(
    shard: Shard, options: ReadOptions, share_bytes: int, rng: np.random.Generator
) -> Iterator[list]:
    """The texts (a conversation's rendered text) of the shard's pieces in a seeded order, as they are read: of blocks
    spread evenly from a seeded place across a line-based piece that can be read from anywhere (enough to hold twice
    `share_bytes`, at least VERIFY_BLOCKS), of a table file's groups of rows in a seeded order, of the first batches of
    the others."""
    wanted = max(VERIFY_BLOCKS, 2 * share_bytes // SAMPLE_BLOCK_BYTES)
    # Bad records are the tokenize stage's to report (it names their file and line; a block read here cannot know
    # its line numbers): the sample only leaves them out.
    options = dataclasses.replace(options, on_invalid="quarantine")
    for piece in (shard.pieces[k] for k in rng.permutation(len(shard.pieces))):
        kind = kind_of(piece, options)
        if kind in LINE_KINDS and compression_of(piece.path) is None:
            size = (piece.end - piece.start) if piece.end is not None else 0  # a whole file: from its start
            every = max(1, size // SAMPLE_BLOCK_BYTES // wanted)
            blocks = sampled_blocks(piece, options, every, int(rng.integers(every)))
            batches = (
                read_lines(lines, 1, f"{options.name_of(piece.path)}#{block}", kind, options, set())[0]
                for block, lines in blocks
            )
        elif kind in TABLES and (groups := piece_groups(piece, options)) is not None:
            each = (dataclasses.replace(piece, row_groups=[int(g)]) for g in rng.permutation(groups[0]))
            batches = (
                batch for group in each for batch, _ in read_documents([group], options, True, SAMPLE_BATCH_BYTES)
            )
        else:
            batches = (batch for batch, _ in read_documents([piece], options, True, SAMPLE_BATCH_BYTES))
        try:
            for batch in batches:
                yield [c.text for c in batch.chats] if batch.chats is not None else texts_of(batch)
        except CORRUPT_STREAM:  # tokenize names the file; the sample takes what it could read
            continue


def texts_of(batch: Batch) -> list[str]:
    values = batch.text_values()
    return values.to_pylist() if hasattr(values, "to_pylist") else list(values)


def choose_run_encoder(config: TokenmillConfig, shards: Sequence[Shard], tokenizer: TokenizerInfo, log=None):
    """The run's encoder (tokenizer.encoder, verified on a sample across shards), recorded in `_work/` with the
    reference's ids of the sample (for validate); the choice is said to `log`, if given (its reason says why)."""
    store, requested = config.output.store(), config.tokenizer.encoder
    if (choice := cached_choice(tokenizer.sha256, requested)) is not None:
        # Verified by an earlier run with this tokenizer and these backends' versions: validate's reference check
        # (hf on a sample of what this run wrote) still stands behind it, with no kept ids of another run's sample.
        store.remove(layout.REFERENCE_IDS)
        report = {choice.backend: "chosen: " + choice.reason}
        store.write_json(
            layout.ENCODER_CHOICE, {**asdict(choice), "unsafe": len(choice.unsafe_code_points()), "report": report}
        )
        if log is not None:
            earlier = "verified by an earlier run with this tokenizer and these backends"
            log(f"encoder: {choice.backend} {choice.version}: {choice.reason} ({earlier})")
        return choice
    data = store.read_bytes(layout.TOKENIZER)
    sample = verification_sample(config, shards, tokenizer)
    url = store.url_of(layout.TOKENIZER)  # the backends this process loaded, for the shards and the report

    def backend_of(backend: str):
        return loaded_backend(url, tokenizer.sha256, backend)

    expected = backend_of("hf").encode_batch(sample)
    keep_reference_ids(store, tokenizer.sha256, sample, *expected)
    choice, report = choose_encoder(data, requested, sample, log, backend_of, expected)
    store.write_json(
        layout.ENCODER_CHOICE, {**asdict(choice), "unsafe": len(choice.unsafe_code_points()), "report": report}
    )
    if choice.backend != "hf" and sample:  # hf needs no verifying; a choice made on no sample is not kept
        remember_choice(tokenizer.sha256, requested, choice)
    return choice
