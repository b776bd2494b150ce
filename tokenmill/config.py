"""The one configuration model: loaded from YAML, overridden with `--set`, and the main flow's parameter.

Everything that defines *what* is produced (input, partition, split, tokenizer, pack) goes into
`dataset_hash()`; `output` and `dask` say *where* it is written and run, so they stay out of it:
the same data written to another place or with more workers is the same dataset.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import yaml
from pydantic import BaseModel, ByteSize, ConfigDict, Field, SecretStr, field_validator, model_validator

from tokenmill.formats.table import CHAT, FORMATS, NAMES, PAIRS, TEXT, TRAINERS
from tokenmill.io.names import DATA_ENDINGS

# Imported where used: with pyarrow and fsspec, importing the config was half the time `tokenmill run` took to
# start its cluster's process.
if TYPE_CHECKING:
    from tokenmill.core.plan import Shard
    from tokenmill.io.readers import ReadOptions
    from tokenmill.io.storage import Store
    from tokenmill.tokenizers.chat import ChatTemplate


# A name that is also a path segment (a dataset, a version, a mixture source): no slash, no leading dot.
NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StorageConfig(_Section):
    """Options for s3:// URLs (passed to s3fs). Leave empty to use the standard AWS environment
    (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, AWS_PROFILE); secrets given here are
    never written to the manifest, logs or hashes."""

    endpoint_url: str | None = Field(None, description="S3-protocol endpoint, e.g. http://127.0.0.1:9000 (MinIO).")
    profile: str | None = Field(None, description="AWS profile name.")
    key: SecretStr | None = Field(None, description="Access key id (prefer the environment).")
    secret: SecretStr | None = Field(None, description="Secret access key (prefer the environment).")

    def fsspec_options(self) -> dict:
        options = {"endpoint_url": self.endpoint_url, "profile": self.profile}
        options |= {k: v.get_secret_value() for k, v in (("key", self.key), ("secret", self.secret)) if v}
        return {k: v for k, v in options.items() if v is not None}


class ChatConfig(_Section):
    """Records that are conversations: how to find their turns, which template renders them and which tokens carry
    loss (docs/chat.md). The template is the model's own, rendered as transformers' apply_chat_template renders it."""

    format: Literal["messages", "sharegpt", "prompt_completion"] = Field(
        "messages",
        description="messages: a list of {role, content} turns (HF, OpenAI); sharegpt: a list of {from, value} turns "
        "(human, gpt, system, function_call, observation); prompt_completion: a user turn of prompt_fields and an "
        "assistant turn of completion_field (Alpaca, dolly, gsm8k).",
    )
    messages_field: str | None = Field(
        None, description="The list of turns; null: messages (conversations for sharegpt)."
    )
    role_field: str | None = Field(None, description="A turn's role; null: role (from for sharegpt).")
    content_field: str | None = Field(None, description="A turn's text; null: content (value for sharegpt).")
    roles: dict[str, str] = Field(
        default_factory=dict,
        description="A record's role -> system, user, assistant or tool (sharegpt's are mapped already), e.g. "
        "{human: user, bot: assistant}.",
    )
    prompt_fields: list[str] = Field(
        ["instruction", "input"],
        min_length=1,
        description="prompt_completion: the fields of the user's turn, those present joined by a blank line (the "
        "first is required).",
    )
    completion_field: str = Field("output", description="prompt_completion: the field of the assistant's turn.")
    system_field: str | None = Field(None, description="prompt_completion: a field holding a system turn, if any.")
    tools_field: str | None = Field(
        None, description="The tools the template is given: a list of JSON schemas, or its JSON text (glaive)."
    )
    template: str | None = Field(
        None,
        description="A .jinja file holding the chat template; null: the chat_template of the tokenizer's "
        "tokenizer_config.json (tokenizer.path a directory or hf:org/name).",
    )
    mask: Literal["assistant", "last_assistant", "all"] = Field(
        "assistant",
        description="Which tokens carry loss: assistant: every assistant turn with its end-of-turn; last_assistant: "
        "the last one only; all: every token.",
    )
    trailer: bool = Field(
        True,
        description="A conversation that ends with the assistant's turn: what the template writes after it (phi3's "
        "<|endoftext|>) carries loss too, as in TRL's {% generation %} templates.",
    )
    date: datetime.date | None = Field(
        None,
        description="The date a template that writes today's date (strftime_now, as Granite's does) writes, so that "
        "a rerun renders the same tokens; such a template without it is refused.",
    )

    def record_format(self):
        """The reader's view: `tokenmill.tokenizers.chat.RecordFormat`."""
        from tokenmill.tokenizers.chat import SHAREGPT, RecordFormat

        base = SHAREGPT if self.format == "sharegpt" else RecordFormat()
        given = {
            "messages_field": self.messages_field,
            "role_field": self.role_field,
            "content_field": self.content_field,
        }
        return RecordFormat(
            kind="prompt_completion" if self.format == "prompt_completion" else "messages",
            **{key: value or getattr(base, key) for key, value in given.items()},
            roles=tuple({**dict(base.roles), **self.roles}.items()),
            prompt_fields=tuple(self.prompt_fields),
            completion_field=self.completion_field,
            system_field=self.system_field,
            tools_field=self.tools_field,
        )


class PreferenceConfig(_Section):
    """Records that are preference pairs (DPO and its relatives): a prompt with a chosen and a rejected completion, in
    TRL's preference formats, tokenized as TRL's DPO preprocessing tokenizes them (docs/chat.md, Preference pairs)."""

    prompt_field: str = Field("prompt", description="The prompt: a list of messages, or a string.")
    chosen_field: str = Field("chosen", description="The chosen completion: a list of messages, or a string.")
    rejected_field: str = Field("rejected", description="The rejected completion: a list of messages, or a string.")
    tools_field: str | None = Field(
        None, description="The tools the template is given: a list of JSON schemas, or its JSON text."
    )
    form: Literal["auto", "explicit", "implicit"] = Field(
        "auto",
        description="auto: a record's prompt is prompt_field where it has one, else the start chosen and rejected "
        "share (TRL's extract_prompt); explicit: every record has prompt_field; implicit: the prompt is always "
        "extracted (prompt_field is not read).",
    )
    template: str | None = Field(
        None,
        description="A .jinja file holding the chat template that renders conversational pairs; null: the "
        "chat_template of the tokenizer's tokenizer_config.json.",
    )
    date: datetime.date | None = Field(
        None, description="The date a template that writes today's date writes (as input.chat.date)."
    )
    max_length: int | None = Field(
        None,
        ge=2,
        description="TRL's max_length: the most tokens of a side (the prompt and one completion); null: half of "
        "pack.seq_len, so that every pair fits a packed row. A pair whose prompt alone has max_length tokens is "
        "dropped.",
    )
    too_long: Literal["drop", "truncate"] = Field(
        "drop",
        description="A pair with a side longer than max_length: dropped whole, or each such side cut to its first "
        "max_length tokens (TRL's collator, keep_start); never one side only. Counted in the report either way.",
    )

    def pair_format(self):
        """The reader's view: `tokenmill.tokenizers.preference.PairFormat`."""
        from tokenmill.tokenizers.preference import PairFormat

        return PairFormat(self.prompt_field, self.chosen_field, self.rejected_field, self.tools_field, self.form)


class InputConfig(_Section):
    """The corpus: which files, their format, where each record keeps its text and id, and what makes a record
    invalid (docs/inputs.md)."""

    paths: list[str] = Field(
        description="Local paths, globs or fsspec URLs (s3://...) of the input files; a directory or prefix: the "
        f"{', '.join(DATA_ENDINGS)} files under it (compressed or not, hidden ones aside)."
    )
    format: Literal["auto", "jsonl", "parquet", "arrow", "text"] = Field(
        "auto",
        description="auto: from the file name, a compression suffix (.gz, .zst, .zstd, .xz, .bz2) set aside: .jsonl, "
        ".json or .ndjson is JSON lines (a .json file that opens with `[`: one JSON array of records), .parquet or .pq "
        "Parquet, .arrow Arrow (Hugging Face datasets' save_to_disk), anything else plain text (compressed or not).",
    )
    text_field: str = Field("text", description="Field holding the document text; may be nested (meta.content).")
    id_field: str | None = Field(
        None,
        description="Field holding a unique document id; if unset, `<file>:<line or row>` is used, `<file>` "
        "the file's path under the deepest directory holding all of `paths`.",
    )
    separator: str | None = Field(
        None, description="Plain text: a line that separates documents; null: one document per file."
    )
    on_invalid: Literal["fail", "quarantine"] = Field(
        "quarantine", description="fail: stop at the first bad record; quarantine: write it to rejects/ and go on."
    )
    min_chars: int = Field(1, ge=0, description="Shorter texts are invalid records (empty ones by default).")
    max_chars: int | None = Field(None, ge=1, description="Longer texts are invalid records; null: no limit.")
    metadata_fields: list[str] = Field(
        default_factory=list,
        description="Record fields (url, lang, a quality score; may be nested) carried into the documents table "
        "beside each shard's tokens (docs/outputs.md) as strings, a number or boolean as its JSON text. A JSONL block "
        "where one mixes kinds (strings and numbers, whole numbers beside `4.0`) or holds objects is read record by "
        "record: slower.",
    )
    storage: StorageConfig = Field(StorageConfig(), description="Credentials and endpoint for s3:// input paths.")
    chat: ChatConfig | None = Field(
        None,
        description="The records are conversations, rendered with the model's chat template, their loss mask on "
        "the assistant's turns (docs/chat.md); text_field is then not read.",
    )
    preference: PreferenceConfig | None = Field(
        None,
        description="The records are preference pairs (prompt, chosen, rejected), tokenized as TRL's DPO "
        "preprocessing tokenizes them (docs/chat.md); text_field is then not read.",
    )

    @model_validator(mode="after")
    def _chat_or_pairs(self) -> InputConfig:
        if self.chat is not None and self.preference is not None:
            raise ValueError("input.chat and input.preference: records are conversations or pairs, give one")
        return self

    @field_validator("metadata_fields")
    @classmethod
    def _not_a_table_column(cls, names: list[str]) -> list[str]:
        from tokenmill.core.layout import DOCUMENTS_COLUMNS

        if taken := [n for n in names if n in DOCUMENTS_COLUMNS]:
            raise ValueError(
                f"{taken[0]!r} is a column of the documents table already ({', '.join(DOCUMENTS_COLUMNS)})"
            )
        return names

    def read_options(
        self, fields: tuple[str, ...] = (), template: ChatTemplate | None = None, eos_token: str | None = None
    ) -> ReadOptions:
        """How its files are read; a chat or preference input's records are rendered with `template`
        (`TokenizerInfo.chat`); `eos_token` is appended to a plain-text pair's completions (`TokenizerInfo`)."""
        from tokenmill.io.names import input_root
        from tokenmill.io.readers import ReadOptions
        from tokenmill.tokenizers.chat import ChatReading
        from tokenmill.tokenizers.preference import PairReading

        chat = pairs = None
        if self.chat is not None and template is not None:
            chat = ChatReading(self.chat.record_format(), template, self.chat.mask, self.chat.trailer)
        if self.preference is not None and (template is not None or eos_token is not None):
            eos = template.variables.get("eos_token", eos_token or "") if template is not None else eos_token
            pairs = PairReading(self.preference.pair_format(), template, eos)  # TRL appends the EOS to plain text
        return ReadOptions(
            text_field=self.text_field,
            id_field=self.id_field,
            format=self.format,
            on_invalid=self.on_invalid,
            min_chars=self.min_chars,
            max_chars=self.max_chars,
            separator=self.separator,
            fields=tuple(dict.fromkeys((*fields, *self.metadata_fields))),
            storage_options=self.storage.fsspec_options(),
            conversations=self.chat is not None or self.preference is not None,
            chat=chat,
            pairs=pairs,
            root=input_root(self.paths),
        )


class SourceConfig(_Section):
    """One source of a mixture: its input, and one target for its share of the mix's training tokens."""

    name: str = Field(
        pattern=NAME, description="Names its outputs (megatron/<name>/<split>/...) and its row of the mix."
    )
    input: InputConfig = Field(description="The source's files and how to read them, as a single input's.")
    weight: float | None = Field(
        None, gt=0, description="Its share of the mix's training tokens, relative to the other sources' weights."
    )
    tokens: int | None = Field(None, gt=0, description="Its budget: the training tokens a trainer draws from it.")
    epochs: float | None = Field(None, gt=0, description="How many times its training tokens are drawn (2.5: 2.5x).")

    @model_validator(mode="after")
    def _one_target(self) -> SourceConfig:
        targets = [k for k in ("weight", "tokens", "epochs") if getattr(self, k) is not None]
        if len(targets) != 1:
            raise ValueError(
                f"source {self.name!r}: set exactly one of weight, tokens or epochs (got {targets or 'none'})"
            )
        return self


class MixConfig(_Section):
    """How the sources' targets resolve into the mix a trainer draws (see tokenmill.stages.mix)."""

    total_tokens: int | None = Field(
        None,
        gt=0,
        description="Training tokens of the whole mix; the weighted sources share what the budgeted and epoch "
        "sources leave. null: the largest mix in which no weighted source repeats (its epochs at most 1).",
    )
    max_epochs: float = Field(
        4.0, gt=0, description="A source drawn more times than this stops the run, naming it (raise it to allow)."
    )
    seed: int = Field(0, description="Seed of the mix's shuffle (the packed loader's order over every source).")


class PartitionConfig(_Section):
    """How the input is cut into shards, the unit of work, retry and reuse (docs/inputs.md)."""

    shard_size: ByteSize | Literal["auto"] = Field(
        "auto",
        description="Target uncompressed text bytes per shard, e.g. 64MB or 1GiB; auto: the corpus over 8 shards "
        "per cluster thread, between 16 MB and 1 GB (docs/inputs.md).",
    )
    shuffle: bool = Field(
        False, description="Shuffle documents across all input files before tokenizing (on the Dask cluster)."
    )
    seed: int = Field(0, description="Seed of the global document shuffle.")

    @field_validator("shard_size")
    @classmethod
    def _some_bytes(cls, size: ByteSize | str) -> ByteSize | str:
        if size != "auto" and size <= 0:
            raise ValueError("a shard holds at least one byte: give a size such as 64MB, or auto")
        return size


class TrainConfig(_Section):
    """Training a tokenizer with HF `tokenizers` on a sample of the input (docs/tokenizers.md)."""

    algorithm: Literal["bpe", "unigram", "wordpiece"] = Field(
        "bpe",
        description="bpe: byte-level, GPT-2 style, never an unknown token; unigram: SentencePiece style (Metaspace); "
        "wordpiece: BERT style (## continuations). unigram and wordpiece map unseen characters to their unk token.",
    )
    vocab_size: int = Field(32000, ge=100, description="Including the special tokens (and, for bpe, the 256 bytes).")
    min_frequency: int = Field(2, ge=1, description="bpe, wordpiece: pairs seen fewer times are not merged.")
    special_tokens: list[str] = Field(
        default_factory=list, description="Special tokens to add besides tokenizer.eod, .bos and .pad."
    )
    normalization: Literal["none", "nfc", "nfkc", "nfd", "nfkd"] = Field(
        "none", description="Unicode normalization applied before training and encoding (none keeps bytes exact)."
    )
    lowercase: bool = Field(False, description="Lowercase before training and encoding.")
    sample_size: ByteSize = Field(ByteSize(50_000_000), description="Bytes of text to train on.")
    seed: int = Field(0, description="Which documents the sample (and the held-out sample) take.")
    stratify_by: str | None = Field(
        None, description="A record field (source, lang, meta.lang): every value gets at least min_group_size."
    )
    min_group_size: ByteSize = Field(
        ByteSize(64_000), description="With stratify_by: a group's minimum bytes in the sample (or all of it)."
    )


class HubConfig(_Section):
    """Resolving `tokenizer.path: hf:org/name` through huggingface_hub."""

    revision: str | None = Field(None, description="Branch, tag or commit; null: the default branch.")
    cache_dir: str | None = Field(None, description="huggingface_hub cache directory; null: its default.")
    token_env: str = Field("HF_TOKEN", description="Environment variable holding the access token, if any.")
    offline: bool = Field(False, description="Use only the local cache (as HF_HUB_OFFLINE=1 does).")
    timeout: float = Field(5.0, gt=0, description="Seconds to wait for the hub before falling back to the cache.")


class TiktokenConfig(_Section):
    """What a tiktoken rank file lacks; known files (OpenAI's, Llama-3's) need nothing here."""

    pattern: str | None = Field(None, description="The split regex (tiktoken's pat_str).")
    special_tokens: dict[str, int] | None = Field(None, description="Special token -> id.")


# The default is kept as a token string, not auto, so that the dataset hash of every config that leaves it unset is
# unchanged; which token it resolves to follows from the tokenizer's file, which the hash covers too.
DEFAULT_EOD = "<|endoftext|>"


class TokenizerConfig(_Section):
    """The tokenizer: a pretrained one or one trained on a sample, its special tokens, the encoder backend, and
    how validate re-checks its ids (docs/tokenizers.md)."""

    path: str | None = Field(
        None,
        description="A pretrained tokenizer: a tokenizer.json, a directory holding one (HF layout), "
        "a tiktoken rank file (.tiktoken, Llama-3's tokenizer.model), or hf:org/name on the Hugging Face hub.",
    )
    hub: HubConfig = Field(HubConfig(), description="For tokenizer.path hf:org/name: revision, cache, token, offline.")
    tiktoken: TiktokenConfig = Field(
        TiktokenConfig(),
        description="For a tiktoken rank file that is not a known one: its split pattern and specials.",
    )
    train: TrainConfig | None = Field(None, description="Train a tokenizer on a sample of the input instead.")
    eod: str = Field(
        DEFAULT_EOD,
        description="End-of-document token, or auto: the pretrained tokenizer's own EOS token. The default, "
        "<|endoftext|>, is the tokenizer's own EOS where its vocabulary has no <|endoftext|>.",
    )
    bos: str | None = Field(None, description="Beginning-of-document token, auto (the tokenizer's own BOS), or null.")
    pad: str | None = Field(None, description="A padding token to add when training (its id is in the manifest).")
    append_eod: bool = Field(True, description="Append the EOD token after each document.")
    prepend_bos: bool = Field(False, description="Put the BOS token before each document (needs tokenizer.bos).")
    encoder: Literal["auto", "hf", "gigatoken", "tiktoken"] = Field(
        "auto",
        description="auto: the fastest installed backend that reproduces HF tokenizers exactly on a verification "
        "sample (else hf); hf: HF tokenizers, the reference; gigatoken, tiktoken: that backend (checked the same way).",
    )
    # 1,000 documents (about 1.7 MB of Wikipedia) cost hf about 0.7 s of CPU; 4,000 cost 2.7 s of every run. The
    # code-point probes guard what differs in rare characters; these catch anything systematic.
    verify_documents: int = Field(
        1000, ge=0, description="Documents drawn across shards on which the encoder is verified before any shard runs."
    )
    # Bytes as well as documents: a thousand files of a code corpus can be hundreds of MB, and hf holds ~180 bytes
    # of memory per byte it encodes at once (a 24 MB file took it 4.4 GB). 2 MB costs hf about 1 s of CPU.
    verify_bytes: ByteSize | Literal["auto"] = Field(
        "auto",
        description="At most this much text in the encoder's verification sample (a long document gives an "
        "excerpt); auto: 2 MB, or 2% of a smaller run's input, at least 256 KiB.",
    )
    # hf encodes a few MB/s a core, gigatoken over 500: re-encoding 0.1% of the documents cost a 30 GB run 8 s of 89
    # (validate); 0.01% costs about 1% of the tokenize stage's CPU, with never fewer than check_min_documents.
    check_fraction: float = Field(
        0.0001, ge=0, le=1, description="validate: fraction of documents re-encoded with the reference and compared."
    )
    check_min_documents: int = Field(1000, ge=0, description="validate: re-encode at least this many documents.")
    check_bytes: ByteSize | Literal["auto"] = Field(
        "auto",
        description="validate: re-encode at most this much text (the documents drawn until they hold it; hf "
        "encodes a few MB a second a core); auto: 4 MB, or 2% of a smaller run's input, at least 256 KiB.",
    )
    reference_piece_bytes: ByteSize = Field(
        ByteSize(1 << 20),
        description="The most text the reference (hf) encodes at once: a longer document is verified and "
        "checked on an excerpt of at most this size (its shard's share of the sample, at least 16 KiB), cut where its "
        "tokens split alike (memory: ~200 bytes per byte).",
    )
    # The tokenize stage holds about 8 bytes a byte of the text it encodes at once (the parse, the ids as uint32, as
    # the files' dtype, with the EOD inserted): 65 MB at 8 MB. It bounds how much is held, never the tokens made.
    batch_bytes: ByteSize = Field(
        ByteSize(8 << 20),
        ge=4096,
        description="The text the tokenize stage reads and encodes at once: a longer document is encoded in pieces "
        "of this size, cut where its tokens split alike (the same ids). A task that runs out of memory is retried "
        "with half of it.",
    )
    # gigatoken keeps the ids of every distinct piece of text it has split off and drops none: on text with few
    # spaces (Chinese, Japanese) nearly every clause is a new piece, and a worker grew by 6.5 times the Chinese text
    # it encoded (56 MB: 368 MB) until its nanny killed it, again on each retry.
    encoder_cache_limit: ByteSize | Literal["auto"] = Field(
        "auto",
        description="When a worker process's memory passes this, the fast encoder's cache starts empty again "
        "(gigatoken keeps every distinct piece of text it splits off: on Chinese or Japanese, several times the "
        "text; about 0.15 s, the same ids); auto: half the worker's Dask memory limit (2 GiB without one).",
    )
    allowed_mismatch_rate: float = Field(
        0.0, ge=0, le=1, description="validate: fraction of re-encoded documents allowed to differ (0: none)."
    )

    @model_validator(mode="after")
    def _consistent(self) -> TokenizerConfig:
        if (self.path is None) == (self.train is None):
            raise ValueError("set exactly one of tokenizer.path (pretrained) or tokenizer.train")
        if self.prepend_bos and self.bos is None:
            raise ValueError("tokenizer.prepend_bos needs tokenizer.bos (a token, or auto for the tokenizer's own)")
        if self.train is not None:
            for key in ("eod", "bos"):
                if getattr(self, key) == "auto":
                    raise ValueError(
                        f"tokenizer.{key}: auto means a pretrained tokenizer's own token; "
                        "when training, give the token string to add (e.g. <|endoftext|>)"
                    )
        return self


class FertilityConfig(_Section):
    """The tokenizer report (`report/fertility.md` + `.json`): fertility on a held-out sample."""

    enabled: bool = Field(True, description="Write the report (for a pretrained tokenizer it costs one read pass).")
    holdout_size: ByteSize = Field(
        ByteSize(4_000_000),
        description="Bytes of held-out text, never in the training sample (up to 12% fewer: its fraction of the "
        "corpus is rounded down so that a grown corpus keeps its shards' samples).",
    )
    group_by: list[str] = Field(
        default_factory=list, description="Record fields (source, lang) to break the report down by."
    )
    baselines: list[str] = Field(
        default_factory=list, description="Other tokenizers to compare with (anything tokenizer.path accepts)."
    )


class PackConfig(_Section):
    """How each split's documents are packed into fixed-length rows (docs/outputs.md)."""

    mode: Literal["concat", "bfd", "window", "none"] = Field(
        "concat",
        description="concat: documents joined with EOD and cut into seq_len rows; bfd: whole documents "
        "best-fit into seq_len rows (longer ones cut), each row padded; window: each document split into "
        "seq_len windows overlapping by `stride` tokens, one window per row; none: no packing.",
    )
    seq_len: int = Field(2048, ge=2, description="Tokens per packed row (the training sequence length).")
    extra_token: bool = Field(
        False,
        description="concat only: rows are seq_len + 1 wide and consecutive rows share one token, so "
        "row[:-1] are seq_len inputs and row[1:] their next-token labels (Megatron's GPTDataset, nanoGPT).",
    )
    pad_id: int | None = Field(None, description="Id filling the padded tail of rows; default the EOD id.")
    stride: int = Field(0, ge=0, description="window only: tokens shared by consecutive windows of a document.")
    bos_id: int | None = Field(None, ge=0, description="window only: id put at the start of every window.")
    eos_id: int | None = Field(None, ge=0, description="window only: id put at the end of every window.")
    shuffle_seed: int = Field(0, description="Seed of the global shuffle index over each split's packed rows.")
    too_long: Literal["drop", "truncate", "split"] = Field(
        "drop",
        description="A conversation (input.chat) longer than seq_len: dropped, truncated to its first seq_len "
        "tokens, or split into seq_len pieces, each then a sequence of its own; counted in the report either way.",
    )

    @property
    def row_len(self) -> int:
        """Tokens per stored row: seq_len, plus the shared label token with `extra_token`."""
        return self.seq_len + self.extra_token

    @property
    def window_content(self) -> int:
        """Document tokens per window: seq_len less the BOS and EOS it carries."""
        return self.seq_len - (self.bos_id is not None) - (self.eos_id is not None)

    @model_validator(mode="after")
    def _options_fit_mode(self) -> PackConfig:
        if self.extra_token and self.mode != "concat":
            raise ValueError("pack.extra_token applies to pack.mode concat only")
        if self.mode != "window" and (self.stride or self.bos_id is not None or self.eos_id is not None):
            raise ValueError("pack.stride, pack.bos_id and pack.eos_id apply to pack.mode window only")
        if self.mode == "window" and not (self.window_content >= 1 and self.stride < self.window_content):
            raise ValueError(
                f"pack.stride must be below the {self.window_content} document tokens a window holds "
                "(seq_len less BOS and EOS)"
            )
        return self


class PublishConfig(_Section):
    """Where and under which version the finished dataset is published, and how many versions are kept."""

    path: str | None = Field(
        None,
        description="Root the finished dataset is published under, as <path>/<name>/<version>/ with a LATEST "
        "pointer beside the versions (local or s3://); null: output.path.",
    )
    version: str | None = Field(
        None,
        pattern=NAME,
        description="Version name; null: a hash of the config, the input files' fingerprints and the tokenizer "
        "(a changed input publishes a new version).",
    )
    keep_versions: int | None = Field(
        None,
        ge=1,
        description="After publishing, delete the versions older than the newest N of LATEST's lineage (never "
        "LATEST's); null: keep every version.",
    )
    storage: StorageConfig = Field(StorageConfig(), description="Credentials and endpoint for an s3:// publish path.")

    @field_validator("path")
    @classmethod
    def _absolute_if_local(cls, path: str | None) -> str | None:
        return path if path is None or "://" in path else str(Path(path).expanduser().absolute())


class OutputConfig(_Section):
    """Where the run builds the dataset, which formats it writes, and where it is published."""

    path: str = Field(description="Local directory or s3://bucket/prefix where the run builds the dataset.")
    storage: StorageConfig = Field(StorageConfig(), description="Credentials and endpoint for an s3:// output path.")
    publish: PublishConfig = Field(PublishConfig(), description="Where the finished dataset is published, versioned.")
    formats: list[Literal[NAMES]] = Field(
        default_factory=lambda: ["megatron", "packed"],
        description="; ".join(f"{name}: {format.description}" for name, format in FORMATS.items())
        + ". One folder per split each (docs/outputs.md).",
    )
    llmc_shard_tokens: int = Field(
        100_000_000, ge=1, lt=2**31, description="Most tokens per llm.c file (its header counts them in an int32)."
    )
    reuse_check: Literal["sha256", "stamp"] = Field(
        "sha256",
        description="How a run checks the files of the shards it keeps. sha256: reads every byte, each run (finds "
        "any change, a bit flip on the disk too; a nightly run reads the whole dataset). stamp: reads a file once, "
        "then only when its stamp changed (locally its inode, size, modification time and owner; an object's ETag "
        "and size): a write or a replacement is found, a flip under the file system is not (tokenmill inspect "
        "--verify reads every byte). docs/production.md.",
    )

    @field_validator("path")
    @classmethod
    def _absolute_if_local(cls, path: str) -> str:
        # Dask workers may run elsewhere: a relative path means the one seen from where the run starts.
        return path if "://" in path else str(Path(path).expanduser().absolute())

    def store(self) -> Store:
        """The build directory, where every stage writes."""
        from tokenmill.io.storage import Store

        return Store(self.path, self.storage.fsspec_options(), trusts_stamps=self.reuse_check == "stamp")

    @field_validator("formats")
    @classmethod
    def _megatron_always(cls, formats: list[str]) -> list[str]:
        if "megatron" not in formats:
            raise ValueError("output.formats must include megatron: the pack stage makes every other format from it")
        if (packing := made_while_packing(formats)) and "packed" not in formats:
            raise ValueError(
                f"output.formats {' and '.join(packing)} are made while conversations are packed: add packed"
            )
        return sorted(set(formats), key=formats.index)

    def trainers(self) -> tuple[str, ...]:
        """The trainers' own layouts asked for (`formats.table.TRAINERS`)."""
        return tuple(name for name in self.formats if name in TRAINERS)


NOT_HELD = {  # why a format cannot hold what an input is
    TEXT: "hold conversations or preference pairs: they need an input.chat or input.preference",
    CHAT: "hold text without a loss mask: not for an input.chat (its conversations go to trl, megatron_bridge or olmo)",
    PAIRS: "hold no preference pairs (input.preference): they go to megatron, packed and trl",
}


def made_while_packing(formats: list[str]) -> list[str]:
    """Those of `formats` that conversations or pairs are written in as they are packed (`formats.table`)."""
    return [name for name in formats if FORMATS[name].made_from == "packing"]


class AdaptiveConfig(_Section):
    """A cluster started for the run (a LocalCluster, SLURM jobs) that grows and shrinks with the load."""

    minimum: int = Field(1, ge=0, description="Fewest workers kept while idle.")
    maximum: int = Field(ge=1, description="Most workers started under load.")


class SlurmConfig(_Section):
    """Dask workers as SLURM batch jobs (dask-jobqueue's SLURMCluster), submitted by the run and cancelled once its
    shard work is done, before publish; the scheduler runs in the flow's process (docs/production.md, SLURM)."""

    partition: str | None = Field(None, description="sbatch -p; null: the cluster's default partition.")
    account: str | None = Field(None, description="sbatch -A; null: none given.")
    walltime: str = Field("01:00:00", description="sbatch -t of each worker job (HH:MM:SS).")
    cores: int = Field(1, ge=1, description="CPU cores of each job; its worker processes share them.")
    memory: str = Field("4GiB", description="Memory of each job (sbatch --mem); its worker processes share it.")
    processes: int = Field(1, ge=1, description="Dask worker processes per job, one thread each.")
    jobs: int = Field(2, ge=1, description="Worker jobs kept running (replaced if one ends); see dask.adaptive.")
    replace_after: str = Field(
        "10s", description="How long after a job's workers are gone (scancel, a node lost) a new job takes its place."
    )
    directives: list[str] = Field(
        default_factory=list, description="More #SBATCH lines, without the prefix (e.g. --qos=high, --gres=...)."
    )
    setup: list[str] = Field(
        default_factory=list,
        description="Shell lines each job runs before its workers start (e.g. module load, source venv/bin/activate).",
    )
    python: str | None = Field(None, description="The Python on the nodes; null: this process's interpreter.")
    scheduler_host: str | None = Field(
        None, description="The address the jobs reach the scheduler at; null: this host's name."
    )
    log_directory: str | None = Field(None, description="Where each job writes its output; null: the job's cwd.")
    shared_directory: str | None = Field(
        None,
        description="A directory this host and the nodes both see, for the run's own TLS certificates (made for "
        "each run, removed after it); null: ~/.tokenmill/slurm.",
    )
    environment: list[str] = Field(
        default_factory=lambda: ["PATH", "HOME", "LANG"],
        description="The variables of this environment the jobs get, by name (e.g. add AWS_ACCESS_KEY_ID, "
        "AWS_SECRET_ACCESS_KEY and AWS_ENDPOINT_URL where the workers read s3:// and the nodes have no credentials "
        "of their own). Nothing else of it reaches a job (sbatch --export=NONE); their values go in a file only "
        "you can read, in the run's directory under shared_directory, never in the job script or SLURM's records.",
    )


class DaskConfig(_Section):
    """Where the shard work runs: a Dask scheduler's address, SLURM jobs, or a LocalCluster started for the run."""

    address: str | None = Field(
        None,
        description="Scheduler address; null starts a LocalCluster here. It must be tls:// (see allow_plaintext).",
    )
    allow_plaintext: bool = Field(
        False,
        description="Accept a tcp:// scheduler address (TOKENMILL_DASK_ALLOW_PLAINTEXT=1 too): its traffic "
        "unencrypted, and anyone who reaches it (on loopback, every user of the host) able to send the scheduler code "
        "to run as you. Only where no one else can reach it; the run's log says so.",
    )
    n_workers: int | None = Field(None, ge=1, description="LocalCluster worker processes; null: one per core.")
    adaptive: AdaptiveConfig | None = Field(
        None, description="Scale the LocalCluster (or the SLURM jobs' workers) between minimum and maximum workers."
    )
    slurm: SlurmConfig | None = Field(
        None, description="Run the workers as SLURM jobs (needs the slurm extra: pip install -e '.[slurm]')."
    )
    memory_limit: str | None = Field(
        "auto", description="Per LocalCluster worker (e.g. 4GiB): a runaway shard is killed, not the node."
    )
    groups_per_stage: int | None = Field(
        None,
        ge=1,
        description="Most Prefect task runs per shard stage, each over a group of shards (every shard still runs "
        "as its own Dask task); null: one per cluster thread, at most 32. A task run costs ~50 ms of CPU in the "
        "flow and the Prefect server (docs/production.md), a shard's Dask task and files under 5 ms in all "
        "(docs/performance.md, orchestration).",
    )

    def scheduler(self) -> str | None:
        """The scheduler to use: `address`, else $TOKENMILL_DASK_ADDRESS; None means a cluster started for the run
        (SLURM jobs with `slurm`, which $TOKENMILL_DASK_ADDRESS does not override, else a LocalCluster)."""
        if self.slurm is not None:
            return None
        return self.address or os.environ.get("TOKENMILL_DASK_ADDRESS") or None

    @model_validator(mode="after")
    def _one_kind(self) -> DaskConfig:
        if self.slurm is not None and self.address:
            raise ValueError("dask.address and dask.slurm: give one (an existing scheduler, or SLURM jobs)")
        return self


class TokenmillConfig(_Section):
    """A tokenmill run: which corpus, how to tokenize and pack it, and where to put the result."""

    name: str = Field(pattern=NAME, description="Dataset name.")
    input: InputConfig | None = Field(None, description="The corpus, for a dataset of one source (else `sources`).")
    sources: list[SourceConfig] | None = Field(
        None, min_length=1, description="A mixture: every source's input and target, built in one run."
    )
    mix: MixConfig = Field(MixConfig(), description="How a mixture's targets resolve (with `sources`).")
    partition: PartitionConfig = Field(PartitionConfig(), description="How the input is cut into shards.")
    split: dict[str, float] = Field(
        default_factory=lambda: {"train": 1.0},
        description="Split name -> fraction, assigned by a stable hash of the document id.",
    )
    tokenizer: TokenizerConfig = Field(description="The tokenizer: pretrained (path) or trained on a sample (train).")
    fertility: FertilityConfig = Field(FertilityConfig(), description="The tokenizer report on a held-out sample.")
    pack: PackConfig = Field(PackConfig(), description="Packing into fixed-length rows.")
    output: OutputConfig = Field(description="Where the dataset is built and published, in which formats.")
    dask: DaskConfig = Field(DaskConfig(), description="Where the shard work runs.")

    @field_validator("split")
    @classmethod
    def _fractions_sum_to_one(cls, split: dict[str, float]) -> dict[str, float]:
        if not split or any(f < 0 for f in split.values()) or abs(sum(split.values()) - 1.0) > 1e-9:
            raise ValueError(f"split fractions must be >= 0 and sum to 1, got {split}")
        for name in split:
            if not name.isidentifier():
                raise ValueError(f"split name {name!r} must be a plain identifier")
        return split

    @model_validator(mode="after")
    def _one_corpus(self) -> TokenmillConfig:
        if (self.input is None) == (self.sources is None):
            raise ValueError("set exactly one of input (one corpus) or sources (a mixture)")
        names = [s.name for s in self.sources or ()]
        if duplicates := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"sources: each name once (repeated: {', '.join(duplicates)})")
        if self.sources and self.partition.shuffle:
            raise ValueError("partition.shuffle shuffles one corpus; a mixture is shuffled by its mix (mix.seed)")
        if self.has_chat() and self.tokenizer.train is not None:
            raise ValueError("a chat input is rendered with the model's own chat template: give tokenizer.path")
        for what in self.holds():
            if unfit := [f for f in self.output.formats if what not in FORMATS[f].holds]:
                raise ValueError(f"output.formats {', '.join(unfit)} {NOT_HELD[what]}")
        if self.has_chat() and self.pack.mode == "none" and "packed" in self.output.formats:
            raise ValueError("a chat input's conversations are packed whole: set pack.mode (any but none) for seq_len")
        if self.has_chat() and self.partition.shuffle:
            raise ValueError(
                "partition.shuffle: not for a chat input (the packed rows' shuffle index shuffles its conversations)"
            )
        for name, source in self.inputs().items():
            longest = source.preference.max_length if source.preference is not None else None
            if longest is not None and 2 * longest > self.pack.seq_len:
                where = f"sources.{name}.input" if name else "input"
                raise ValueError(
                    f"{where}.preference.max_length {longest}: a pair's two sides must fit a packed row of "
                    f"pack.seq_len {self.pack.seq_len} (at most {self.pack.seq_len // 2}, or null)"
                )
        return self

    def has_chat(self) -> bool:
        """Some input's records are conversations (`input.chat`) or preference pairs (`input.preference`): rendered
        with the model's own template, with a loss mask."""
        return any(source.chat is not None or source.preference is not None for source in self.inputs().values())

    def holds(self) -> set[str]:
        """What the inputs' records are (`formats.table`): text, conversations (`input.chat`), preference pairs
        (`input.preference`)."""
        return {PAIRS if s.preference else CHAT if s.chat else TEXT for s in self.inputs().values()}

    def has_pairs(self) -> bool:
        """Some input's records are preference pairs (`input.preference`)."""
        return any(source.preference is not None for source in self.inputs().values())

    def pair_streams(self) -> dict[str, tuple[int, str]]:
        """Each stream of preference pairs (`streams`) -> the max_length and too_long its pairs are fitted with."""
        return {
            stream: (source.preference.max_length or self.pack.seq_len // 2, source.preference.too_long)
            for name, source in self.inputs().items()
            if source.preference is not None
            for stream in self.streams(name)
        }

    def writes_fertility_report(self) -> bool:
        """The tokenizer report is written (`fertility.enabled`), of text: not where an input is conversations,
        whose tokens the model's own template decides."""
        return self.fertility.enabled and not self.has_chat()

    @property
    def mixture(self) -> bool:
        return self.sources is not None

    def secrets(self) -> list[str]:
        """Where this config holds a secret (`output.storage.key`, ...): recorded masked wherever tokenmill writes
        it, so a deployment's parameters cannot carry one."""
        storages = {
            f"{f'sources.{name}.' if name else ''}input.storage": source_input.storage
            for name, source_input in self.inputs().items()
        }
        storages |= {"output.storage": self.output.storage, "output.publish.storage": self.output.publish.storage}
        return [
            f"{where}.{key}"
            for where, storage in storages.items()
            for key in ("key", "secret")
            if getattr(storage, key)
        ]

    def inputs(self) -> dict[str, InputConfig]:
        """Each source's input by name; a dataset of one `input` is the source named ""."""
        return {"": self.input} if self.sources is None else {s.name: s.input for s in self.sources}

    def input_of(self, shard: Shard) -> InputConfig:
        """The input config a shard of the plan is read with: its source's."""
        return self.inputs()[shard.mix_source]

    def streams_of(self, shard: Shard) -> list[str]:
        """Where a shard of the plan puts its documents, in split order: its source's streams."""
        return self.streams(shard.mix_source)

    def streams(self, source: str | None = None) -> list[str]:
        """Where documents go, in split order: the split names (`<source>/<split>` in a mixture) of `source`, or
        of every source. Each is a directory of every format (megatron/<stream>/shard-NNNNN.bin...)."""
        sources = self.inputs() if source is None else [source]
        return [f"{name}/{split}" if name else split for name in sources for split in self.split]

    def dataset_config(self) -> dict:
        """The part of the config that defines the dataset's content (recorded in the manifest): not where it
        is read from or written to, nor how it is computed."""
        excluded = {
            "output": True, "dask": True, "input": {"storage"}, "sources": {"__all__": {"input": {"storage"}}},
            "tokenizer": {"batch_bytes", "encoder_cache_limit"},  # how much is held: the same tokens
        }  # fmt: skip
        config = self.model_dump(mode="json", exclude=excluded)
        if self.sources is None:  # a dataset of one input as it always was (its version hashes unchanged)
            del config["sources"], config["mix"]
        else:
            del config["input"]
        return config

    def dataset_hash(self) -> str:
        return self.section_hash(*self.dataset_config())

    def publish_root(self) -> Store:
        """`<publish path>/<name>`: the versions of this dataset and their LATEST pointer."""
        from tokenmill.io.storage import Store

        root = self.output.publish.path or self.output.path
        return Store(f"{root}/{self.name}", self.output.publish.storage.fsspec_options())

    def section_hash(self, *sections: str, checks: bool = True) -> str:
        """A short hash of the named config sections: the cache key of a stage that depends on them. Without
        `checks`, the settings that decide what is checked rather than what is made (CHECK_SETTINGS) are left out:
        the key of work (tokenize, the tokenizer's training), which retuning a check must not redo; the dataset's
        hash keeps them (a version is validated with them)."""
        config = self.dataset_config()
        if not checks:
            for section, names in CHECK_SETTINGS.items():
                for name in names:
                    config.get(section, {}).pop(name, None)
        # The input is what its files hold (the plan's fingerprints), not the patterns that found them: a
        # pattern that finds the same files keys the same work, and one more file listed redoes only its shards.
        # A mixture's input is its sources' inputs, not their targets: retuning the mix redoes no shard.
        inputs = [config.get("input", {})] if self.sources is None else [s["input"] for s in config["sources"]]
        for source_input in inputs:
            source_input.pop("paths", None)
        if self.sources is not None:
            config["input"] = {s["name"]: s["input"] for s in config["sources"]}
        chosen = {k: v for k, v in config.items() if k in sections}
        canonical = json.dumps(chosen, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


CHECK_SETTINGS = {
    "tokenizer": (
        "verify_documents", "verify_bytes", "check_fraction", "check_min_documents", "check_bytes",
        "reference_piece_bytes", "allowed_mismatch_rate",
    )
}  # fmt: skip


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
