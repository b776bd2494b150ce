"""The one configuration model: loaded from YAML, overridden with `--set`, and the main flow's parameter.

Everything that defines *what* is produced (input, partition, split, tokenizer, pack) goes into
`dataset_hash()`; `output` and `dask` say *where* it is written and run, so they stay out of it:
the same data written to another place or with more workers is the same dataset.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ByteSize, ConfigDict, Field, field_validator, model_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputConfig(_Section):
    paths: list[str] = Field(description="Local paths, globs or fsspec URLs (s3://...) of JSONL(.gz) files.")
    text_field: str = Field("text", description="Field holding the document text.")
    id_field: str | None = Field(
        None, description="Field holding a unique document id; if unset, `<file name>:<line>` is used."
    )


class PartitionConfig(_Section):
    shard_size: ByteSize = Field(
        ByteSize(64_000_000), description="Target uncompressed text bytes per shard, e.g. 64MB or 1GiB."
    )


class TrainConfig(_Section):
    algorithm: Literal["bpe"] = "bpe"
    vocab_size: int = Field(32000, ge=260)
    min_frequency: int = Field(2, ge=1)
    sample_size: ByteSize = Field(ByteSize(50_000_000), description="Bytes of text to train on.")
    seed: int = 0


class TokenizerConfig(_Section):
    path: str | None = Field(None, description="A pretrained tokenizer.json.")
    train: TrainConfig | None = Field(None, description="Train a tokenizer on a sample of the input instead.")
    eod: str = Field("<|endoftext|>", description="End-of-document token, appended after each document.")
    append_eod: bool = True

    @model_validator(mode="after")
    def _one_source(self) -> TokenizerConfig:
        if (self.path is None) == (self.train is None):
            raise ValueError("set exactly one of tokenizer.path (pretrained) or tokenizer.train")
        return self


class PackConfig(_Section):
    mode: Literal["concat", "none"] = Field(
        "concat", description="concat: documents joined with EOD and cut into seq_len rows; none: no packing."
    )
    seq_len: int = Field(2048, ge=2)
    pad_id: int | None = Field(None, description="Id filling the tail of the last row; default the EOD id.")


class OutputConfig(_Section):
    path: str = Field(description="Local directory or s3://bucket/prefix receiving the dataset.")

    @field_validator("path")
    @classmethod
    def _absolute_if_local(cls, path: str) -> str:
        # Dask workers may run elsewhere: a relative path means the one seen from where the run starts.
        return path if "://" in path else str(Path(path).expanduser().absolute())


class DaskConfig(_Section):
    address: str | None = Field(None, description="Scheduler address; null starts a LocalCluster here.")
    n_workers: int | None = Field(None, ge=1, description="LocalCluster worker processes; null: one per core.")


class TokenmillConfig(_Section):
    """A tokenmill run: which corpus, how to tokenize and pack it, and where to put the result."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="Dataset name.")
    input: InputConfig
    partition: PartitionConfig = PartitionConfig()
    split: dict[str, float] = Field(
        default_factory=lambda: {"train": 1.0},
        description="Split name -> fraction, assigned by a stable hash of the document id.",
    )
    tokenizer: TokenizerConfig
    pack: PackConfig = PackConfig()
    output: OutputConfig
    dask: DaskConfig = DaskConfig()

    @field_validator("split")
    @classmethod
    def _fractions_sum_to_one(cls, split: dict[str, float]) -> dict[str, float]:
        if not split or any(f < 0 for f in split.values()) or abs(sum(split.values()) - 1.0) > 1e-9:
            raise ValueError(f"split fractions must be >= 0 and sum to 1, got {split}")
        for name in split:
            if not name.isidentifier():
                raise ValueError(f"split name {name!r} must be a plain identifier")
        return split

    def dataset_config(self) -> dict:
        """The part of the config that defines the dataset's content (recorded in the manifest)."""
        return self.model_dump(mode="json", exclude={"output", "dask"})

    def dataset_hash(self) -> str:
        return self.section_hash(*self.dataset_config())

    def section_hash(self, *sections: str) -> str:
        """A short hash of the named config sections: the cache key of a stage that depends on them."""
        chosen = self.model_dump(mode="json", include=set(sections))
        canonical = json.dumps(chosen, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def apply_override(data: dict, assignment: str) -> None:
    """Apply one `dotted.key=value` override in place; the value is parsed as YAML (`4096`, `[a, b]`, `null`)."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key:
        raise ValueError(f"--set expects key=value, got {assignment!r}")
    *parents, leaf = key.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"--set {key}: {part!r} is not a section")
    node[leaf] = yaml.safe_load(raw)


def load_config(path: str | Path, overrides: list[str] = ()) -> TokenmillConfig:
    """Read a YAML config, apply `--set` overrides and validate.

    Relative local paths in the file are taken relative to the current directory, as a user typing
    `tokenmill run examples/demo.yaml` from the repository root expects.
    """
    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    for assignment in overrides:
        apply_override(data, assignment)
    return TokenmillConfig.model_validate(data)
