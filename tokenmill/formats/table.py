"""Every format tokenmill writes, in one table: what the rest of tokenmill needs to know of each (`output.formats`).

`config` takes the names, their descriptions and what each holds from here; `layout` each trainer's files and
their kinds in the manifest; the pack stage, validate and the mix call the module of each trainer's layout,
`tokenmill/formats/<name>.py`, which holds all of that layout's code behind one small interface:

    write(out: SplitOut) -> None         a shard's split in the layout (the pack stage)
    check(found: SplitFound) -> list[str]   its files as written, against the split's stats: what is wrong
    mix(mixing: Mixing) -> dict          a mixture's training split in the trainer's terms (`mixable` ones)
    split_index(shards, dtype, seq_len) -> dict   a split's `index.json` over its shards' files (`indexed` ones)

tokenmill's own formats (megatron, packed, llmc) keep their writer and reader in their module, and beside them the
two functions validate calls: `split_files(row, run) -> list[str]`, the files the run wrote for a shard's split (they
depend on it: a loss mask for conversations, the number of llm.c parts), and `check(found)`.

Adding a trainer's layout is that module and a row here (docs/architecture.md, "Adding a trainer's layout").
A leaf: it imports nothing of tokenmill, so that the config can read it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

TEXT, CHAT, PAIRS = "text", "chat", "pairs"  # what a format holds: documents, conversations, preference pairs


@dataclass(frozen=True)
class Format:
    name: str  # in output.formats, and the folder of a trainer's layout
    description: str  # for the config's reference
    holds: frozenset[str] = frozenset((TEXT, CHAT, PAIRS))
    # A trainer's layout: each file of a shard's split, `<name>/<split>/shard-NNNNN<suffix>`, and its kind in the
    # manifest, the token file first; none for tokenmill's own formats (megatron, packed, llmc)
    files: tuple[tuple[str, str], ...] = ()
    # made from the split's documents as the `.bin` holds them, or (conversations, pairs) as they are packed
    made_from: Literal["documents", "packing"] = "documents"
    indexed: bool = False  # read through an `index.json` per split that lists every shard's file (`split_index`)
    mixable: bool = False  # a mixture's mix is written in its terms, `mix/<name>/<split>.json` (`mix`)
    # its files name each document's line in its input file: the partition counts the lines at the cuts of a large
    # file (`partition.counts_lines`), so that the pack stage knows them when it writes the layout
    numbers_lines: bool = False

    @property
    def suffixes(self) -> tuple[str, ...]:
        return tuple(suffix for suffix, _ in self.files)

    def module(self) -> ModuleType:
        """The module that writes, checks and mixes this trainer's layout."""
        return importlib.import_module(f"tokenmill.formats.{self.name}")


FORMATS = {
    format.name: format
    for format in (
        Format(
            "megatron",
            "Megatron-LM's .bin/.idx per shard and split (always written: every other format is made from it)",
        ),  # fmt: skip
        Format("packed", "packed rows as .npy (unless pack.mode is none)"),
        Format("llmc", "flat token shards as nanoGPT/llm.c read them"),
        Format(
            "trl",
            "conversations (input.chat) as TRL's Parquet, preference pairs (input.preference) as TRL's tokenized "
            "DPO columns (docs/chat.md)",
            holds=frozenset((CHAT, PAIRS)),
            files=((".parquet", "trl"),),
            made_from="packing",
        ),
        Format(
            "megatron_bridge",
            "conversations as Megatron-Bridge's packed Parquet (docs/chat.md)",
            holds=frozenset((CHAT,)),
            files=((".parquet", "megatron-bridge"),),
            made_from="packing",
        ),
        Format(
            "olmo",
            "OLMo-core's numpy token files with their documents' .csv.gz",
            holds=frozenset((TEXT, CHAT)),
            files=((".npy", "olmo-tokens"), (".csv.gz", "olmo-documents")),
            mixable=True,
            numbers_lines=True,
        ),
        Format(
            "datatrove",
            "nanotron's tokenized files (.ds, .ds.index, .ds.metadata)",
            holds=frozenset((TEXT,)),
            files=(
                (".ds", "datatrove-tokens"),
                (".ds.index", "datatrove-index"),
                (".ds.metadata", "datatrove-metadata"),
            ),
            mixable=True,
        ),
        Format(
            "litdata",
            "LitGPT's litdata chunks, a document per item",
            holds=frozenset((TEXT,)),
            files=((".bin", "litdata"),),
            indexed=True,
            mixable=True,
        ),
        Format(
            "hf_parquet",
            "Parquet of input_ids, a row per document (HF datasets)",
            holds=frozenset((TEXT,)),
            files=((".parquet", "hf-parquet"),),
            mixable=True,
        ),
        Format(
            "mds",
            "MosaicML streaming shards of pack.seq_len-token rows (llm-foundry)",
            holds=frozenset((TEXT,)),
            files=((".mds", "mds"),),
            indexed=True,
            mixable=True,
        ),
    )
}
NAMES = tuple(FORMATS)
TRAINERS = tuple(name for name, format in FORMATS.items() if format.files)  # the trainers' own layouts


@dataclass(frozen=True)
class SplitOut:
    """What a trainer's layout of one shard's split is written from, and where (`write`)."""

    store: Any  # tokenmill.io.storage.Store: the build
    rels: list[str]  # the layout's files of the split (`layout.trainer_files`), the token file first
    files: dict  # each file written -> its size and sha256 (`Store.writing`), for the pack stage's marker
    tokens: Any  # the ids the layout holds, back to back (np.ndarray): the split's documents, or as packed
    lengths: Any  # each document's (conversation's, pair's sequence's) tokens
    vocab_size: int
    seq_len: int  # pack.seq_len
    tokenizer_name: str  # the run's tokenizer as `AutoTokenizer.from_pretrained` finds it
    bin_rel: str = ""  # the split's Megatron `.bin`, whose bytes a layout may take as they are (`Store.copy`)
    bin_digest: Callable[[], dict] | None = None  # its size and sha256 as its tokenize committed them
    documents: Callable[[list[str]], Any] | None = None  # columns of the split's documents table (`formats.provenance`)
    masks: Any = None  # conversations, pairs: 1 where a token carries loss
    prompts: Any = None  # pairs: each pair's prompt tokens (a pair is its chosen then its rejected sequence)
    packed: Any = None  # conversations: their packed rows (`packers.Packed`)
    loss: Any = None  # and the packed rows' loss mask


@dataclass(frozen=True)
class SplitFound:
    """A format's files of one shard's split as written (`check`), and the split's stats to hold them against."""

    rels: list[str]
    paths: list[Any]  # the files, local (`Store.local_copies`)
    row: Any  # the split's row of the stats table (its documents, tokens, packed rows and tokens)
    dtype: Any  # the `.bin`'s np.dtype
    seq_len: int
    # tokenmill's own formats (megatron, packed, llmc): what the validate stage knows of the run
    # (`stages.validate.Checking`: the ids around documents, how rows were packed, the llm.c file size)
    run: Any = None

    def not_the_split(self) -> str:
        row = self.row
        return f"{self.rels[0]}: not the split's {row.tokens} {self.dtype} tokens and {row.documents} documents"


@dataclass(frozen=True)
class Mixing:
    """A mixture's training split, for a trainer's mix (`mix`): each source's folder of the layout, its share and
    epochs, what its split holds, and its token files in order."""

    folders: dict[str, str]
    shares: dict[str, float]
    epochs: dict[str, float]
    made: dict[str, dict]  # source -> its training split's documents and tokens
    token_files: dict[str, list[str]]
    remote: bool  # the version lies in an object store (s3://), not a local directory
