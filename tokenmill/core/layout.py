"""Where every file of a dataset lives, relative to `output.path`; the one place that knows the names."""

from __future__ import annotations

import re

from tokenmill.formats.table import FORMATS, TRAINERS

PLAN = "plan.json"
TOKENIZER = "tokenizer/tokenizer.json"
FERTILITY_REPORT = ("report/fertility.md", "report/fertility.json")  # see tokenmill.stages.fertility
STATS = "stats.json"
MANIFEST = "manifest.json"
LATEST = "LATEST"  # beside the versions of a dataset: the name of the newest complete one
PRIVATE = ("_commits/", "_work/")  # bookkeeping, not part of the published dataset
# A mixture's files for the trainers (tokenmill.stages.mix): Megatron's --data-args-path and --per-split-data-args-path.
MIX = "mix"
MIX_TRAIN_ARGS = "mix/megatron/train.args"
MIX_PER_SPLIT_ARGS = "mix/megatron/per_split.json"
# A single input's, beside its shards' directories: published with the version but not in its manifest, since they
# name where the version lies rather than what it holds (the same data elsewhere is the same bytes).
MEGATRON_TRAIN_ARGS = "megatron/train.args"
MEGATRON_PER_SPLIT_ARGS = "megatron/per_split.json"


def shard_name(shard_id: int) -> str:
    return f"shard-{shard_id:05d}"


def markers(stage: str) -> str:
    """The folder of a stage's commit markers (`tokenmill.core.commits`)."""
    return f"_commits/{stage}"


def marker(stage: str, shard_id: int) -> str:
    """A shard's commit marker of a stage (`tokenmill.core.commits`)."""
    return f"{markers(stage)}/{shard_name(shard_id)}.json"


RUN_CONFIG = "_work/config.json"  # the run's config as it ran, signed (`tokenmill.commands.runs`), for reruns


def renumbered(rel: str, shard_id: int, new_id: int) -> str:
    """A shard's file's name once the shard has another id."""
    return rel.replace(shard_name(shard_id), shard_name(new_id), 1)


def chat_template_file(source: str) -> str:
    """The chat template a chat input's conversations were rendered with, as read (its source's name in a mixture)."""
    return f"tokenizer/chat_template{f'.{source}' if source else ''}.jinja"


def megatron_prefix(split: str, shard_id: int) -> str:
    return f"megatron/{split}/{shard_name(shard_id)}"


def loss_mask_file(split: str, shard_id: int) -> str:
    """A conversations' split (input.chat): a byte per token of its `.bin`, 1 where the token carries loss (OLMo-core
    reads it as a label mask)."""
    return megatron_prefix(split, shard_id) + ".loss_mask.bin"


# The documents table's own columns (`formats.provenance`); the configured metadata fields follow them
DOCUMENTS_COLUMNS = ("id", "source", "file", "line", "split", "token_offset", "token_length")


def documents_table(split: str, shard_id: int) -> str:
    """A shard's split's documents table (`formats.provenance`): a row per document of its `.bin`, where it came
    from and where its tokens lie."""
    return megatron_prefix(split, shard_id) + ".docs.parquet"


def packed_prefix(split: str, shard_id: int) -> str:
    return f"packed/{split}/{shard_name(shard_id)}"


# Each trainer's layout (`formats.table`): the files of a shard's split, `<format>/<split>/shard-NNNNN<suffix>`, the
# token file first; those read through each split's `index.json` (`trainer_index`); those a mixture's mix is
# written for (`mix_trainer_file`).
TRAINER_SUFFIXES = {name: FORMATS[name].suffixes for name in TRAINERS}
INDEXED_TRAINERS = tuple(name for name in TRAINERS if FORMATS[name].indexed)
MIX_TRAINERS = tuple(name for name in TRAINERS if FORMATS[name].mixable)


def trainer_files(format: str, split: str, shard_id: int) -> list[str]:
    """A shard's split in a trainer's own layout: its files, the token file first."""
    return [f"{format}/{split}/{shard_name(shard_id)}{suffix}" for suffix in TRAINER_SUFFIXES[format]]


def trainer_file(format: str, split: str, shard_id: int) -> str:
    """A shard's split's token file in a trainer's own layout (`trainer_files`)."""
    return trainer_files(format, split, shard_id)[0]


def trainer_index(format: str, split: str) -> str:
    """A split's `index.json` for the reader of an indexed layout (INDEXED_TRAINERS): every shard's file in it."""
    return f"{format}/{split}/index.json"


def mix_merged_prefix(split: str, source: str) -> str:
    """A mixture source's documents of a (validation or test) split as one Megatron dataset."""
    return f"mix/megatron/{split}/{source}"


def mix_trainer_file(format: str, split: str) -> str:
    """A mixture's split in a trainer's own terms (`tokenmill.stages.mix`): its sources' folders of `format` and the
    weight each is drawn with."""
    return f"mix/{format}/{split}.json"


def mix_packed_file(split: str) -> str:
    """A mixture's packed rows of a split as the mix draws them: (shard id, row) pairs, shuffled
    (tokenmill.stages.mix)."""
    return f"mix/packed/{split}.npy"


def shuffle_file(split: str) -> str:
    """The split's global shuffle index over its packed rows, across shards."""
    return f"packed/{split}/shuffle.npy"


def llmc_file(split: str, shard_id: int, part: int) -> str:
    """Part `part` of a shard's split as an llm.c token file (parts keep files under the size cap)."""
    return f"llmc/{split}/{shard_name(shard_id)}-{part:04d}.bin"


def rejects_file(shard_id: int) -> str:
    return f"rejects/{shard_name(shard_id)}.jsonl"


def shuffle_bucket(source: int, target: int) -> str:
    return f"_work/shuffle/from-{source:05d}/to-{target:05d}.jsonl"


def shuffled_shard(shard_id: int) -> str:
    return f"_work/shuffle/{shard_name(shard_id)}.jsonl"


def sample_file(shard_id: int) -> str:
    return f"_work/sample/{shard_name(shard_id)}.jsonl"


def holdout_file(shard_id: int) -> str:
    """The shard's held-out documents (never trained on), for the fertility report."""
    return f"_work/holdout/{shard_name(shard_id)}.jsonl"


def reserve_file(shard_id: int) -> str:
    """Stratified sampling: the shard's lowest-hash documents per group, to top up rare groups."""
    return f"_work/sample/{shard_name(shard_id)}.reserve.jsonl"


_SHARD_FILE = re.compile(
    r"^(?P<family>megatron|packed)/(?P<split>(?:[^/]+/)?[^/]+)/shard-(?P<shard>\d+)\.(?P<ext>bin|idx|docs\.parquet|loss_mask\.bin|tokens\.npy|cu_seqlens\.npy|row_offsets\.npy|loss\.npy)$"
)
_TRAINER_FILE = re.compile(
    rf"^(?P<format>{'|'.join(TRAINERS)})/(?P<split>(?:[^/]+/)?[^/]+)/shard-(?P<shard>\d+)(?P<suffix>\.[a-z.]+)$"
)
_TRAINER_KINDS = {(name, suffix): kind for name in TRAINERS for suffix, kind in FORMATS[name].files}
_KINDS = {  # (format, suffix) -> kind where it is not the format's name
    ("olmo", "npy"): "olmo-tokens",
    ("olmo", "csv.gz"): "olmo-documents",
    ("datatrove", "ds"): "datatrove-tokens",
    ("datatrove", "ds.index"): "datatrove-index",
    ("datatrove", "ds.metadata"): "datatrove-metadata",
}
_KINDS = {
    "bin": "megatron-bin",
    "idx": "megatron-idx",
    "docs.parquet": "documents-table",
    "tokens.npy": "packed-tokens",
    "cu_seqlens.npy": "packed-cu-seqlens",
    "row_offsets.npy": "packed-row-offsets",
    "loss_mask.bin": "megatron-loss-mask",
    "loss.npy": "packed-loss",
}


def describe(rel: str) -> dict:
    """The manifest's view of a file: its kind, and its split and shard where it has them."""
    if m := _SHARD_FILE.match(rel):
        return {"kind": _KINDS[m["ext"]], "split": m["split"], "shard": int(m["shard"])}
    if m := re.match(r"^llmc/(?P<split>(?:[^/]+/)?[^/]+)/shard-(?P<shard>\d+)-\d+\.bin$", rel):
        return {"kind": "llmc", "split": m["split"], "shard": int(m["shard"])}
    if (m := _TRAINER_FILE.match(rel)) and (kind := _TRAINER_KINDS.get((m["format"], m["suffix"]))):
        return {"kind": kind, "split": m["split"], "shard": int(m["shard"])}
    if m := re.match(rf"^(?P<format>{'|'.join(INDEXED_TRAINERS)})/(?P<split>(?:[^/]+/)?[^/]+)/index\.json$", rel):
        return {"kind": f"{m['format']}-index", "split": m["split"], "shard": None}
    if m := re.match(r"^packed/(?P<split>(?:[^/]+/)?[^/]+)/shuffle\.npy$", rel):
        return {"kind": "packed-shuffle", "split": m["split"], "shard": None}
    if m := re.match(r"^rejects/shard-(\d+)\.jsonl$", rel):
        return {"kind": "rejects", "split": None, "shard": int(m[1])}
    if rel.startswith("mix/"):
        return {"kind": "mix", "split": None, "shard": None}
    kind = {PLAN: "plan", TOKENIZER: "tokenizer", STATS: "stats"}.get(rel, "other")
    if rel in FERTILITY_REPORT:
        kind = "fertility-report"
    return {"kind": kind, "split": None, "shard": None}


REFERENCE_CHECK = "_work/reference_check.json"


ENCODER_CHOICE = "_work/encoder.json"  # the run's encoder choice, for the manifest
REFERENCE_IDS = "_work/reference_ids.parquet"  # the reference's ids of what the choice verified (`reference`)
