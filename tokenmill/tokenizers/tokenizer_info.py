"""What every stage knows of the dataset's tokenizer: `TokenizerInfo` (its file's hash, vocabulary size and
special token ids), made once when the tokenizer is installed or trained (`tokenmill.stages.train_tokenizer`) and handed
to the shard tasks, which load the file itself once per worker process; and HF batch encoding with those ids."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from tokenmill.config import DEFAULT_EOD, TokenizerConfig, TokenmillConfig
from tokenmill.io.readers import ReadOptions
from tokenmill.tokenizers.chat import ChatTemplate


@dataclass(frozen=True)
class TokenizerInfo:
    sha256: str
    vocab_size: int  # the largest id + 1 (ids may have gaps, as cl100k's specials do)
    eod_id: int
    trained: bool
    bos_id: int | None = None
    pad_id: int | None = None
    # Each chat input's template (by source name, "" for a single input), probed when the tokenizer is installed
    chat: tuple[tuple[str, ChatTemplate], ...] = ()
    # The EOS token's text, where an input is preference pairs (TRL appends it to a plain-text completion)
    eos_token: str | None = None

    def chat_template(self, source: str) -> ChatTemplate | None:
        return dict(self.chat).get(source)


def reading(config: TokenmillConfig, tokenizer: TokenizerInfo) -> dict[str, ReadOptions]:
    """How each source's files are read ("" for a single input), a chat input's with its probed template."""
    return {
        name: source.read_options(template=tokenizer.chat_template(name), eos_token=tokenizer.eos_token)
        for name, source in config.inputs().items()
    }


def special_token_id(
    tokenizer: Tokenizer, config: TokenizerConfig, key: str, own: str | None = None, source: str = "the tokenizer"
) -> int | None:
    """The id of `tokenizer.<key>` (eod, bos or pad): a token string, or `auto` for the tokenizer's own
    (`own`); None when unset. The default EOD, where the vocabulary lacks it, is the tokenizer's own, as `auto`
    (Llama-3's, DeepSeek's and Granite's have none of GPT-2's <|endoftext|>). A token the vocabulary lacks is
    an error naming the key."""
    token = getattr(config, key)
    if token is None:
        return None
    role = {"eod": "EOS", "bos": "BOS", "pad": "PAD"}[key]
    if key == "eod" and token == DEFAULT_EOD and own is not None and tokenizer.token_to_id(token) is None:
        token = own
    if token == "auto":
        if own is None:
            raise ValueError(
                f"tokenizer.{key} is auto, but {source} does not say which token is its {role}; "
                f"set tokenizer.{key} to the token string"
            )
        token = own
    tid = tokenizer.token_to_id(token)
    if tid is None:
        hint = f" (its own {role} token is {own!r}: set tokenizer.{key}: auto)" if own else ""
        raise ValueError(f"tokenizer.{key} {token!r} is not in the vocabulary of {source}{hint}")
    return tid


def describe_tokenizer(
    data: bytes, config: TokenizerConfig, trained: bool, own_eos: str | None = None, own_bos: str | None = None,
    source: str = "the tokenizer", parsed: Tokenizer | None = None,
) -> TokenizerInfo:  # fmt: skip
    """The tokenizer's info for the run; `parsed`: `data` already read by HF tokenizers (reading it is 0.1 s of
    the flow's CPU for GPT-2)."""
    tok = parsed or Tokenizer.from_str(data.decode())
    return TokenizerInfo(
        sha256=hashlib.sha256(data).hexdigest(),
        vocab_size=max(tok.get_vocab(with_added_tokens=True).values()) + 1,
        eod_id=special_token_id(tok, config, "eod", own_eos, source),
        trained=trained,
        bos_id=special_token_id(tok, config, "bos", own_bos, source),
        pad_id=special_token_id(tok, config, "pad", None, source),
    )


def encode(
    tokenizer: Tokenizer, texts: list[str], eod_id: int | None, bos_id: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Encode a batch: (all ids as one flat int64 array, per-document lengths), each document's ids
    preceded by BOS and followed by EOD when given."""
    encodings = tokenizer.encode_batch_fast(texts, add_special_tokens=False)
    head = [np.array([bos_id], dtype=np.int64)] if bos_id is not None else []
    tail = [np.array([eod_id], dtype=np.int64)] if eod_id is not None else []
    docs = [np.asarray(e.ids, dtype=np.int64) for e in encodings]
    lengths = np.fromiter(map(len, docs), dtype=np.int64, count=len(docs)) + len(head) + len(tail)
    if not docs:
        return np.empty(0, dtype=np.int64), lengths
    return np.concatenate([part for ids in docs for part in (*head, ids, *tail)]), lengths
