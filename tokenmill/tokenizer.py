"""Tokenizers: the dataset's tokenizer (pretrained or trained on the sample), and batch encoding.

The tokenizer is installed once as `tokenizer/tokenizer.json` in the output; shard tasks receive a
small `TokenizerInfo` and each worker process loads the file once (cached by URL and content hash),
never receiving the tokenizer object itself.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import fsspec
import numpy as np
import orjson
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tokenmill import layout
from tokenmill.commits import commit, committed
from tokenmill.config import TokenmillConfig, TrainConfig
from tokenmill.storage import Store


@dataclass(frozen=True)
class TokenizerInfo:
    sha256: str
    vocab_size: int
    eod_id: int
    trained: bool


@functools.lru_cache(maxsize=4)
def load_tokenizer(url: str, sha256: str) -> Tokenizer:
    """The tokenizer at `url`, loaded once per process and content (a retrained file is reloaded)."""
    with fsspec.open(url, "rb") as f:
        data = f.read()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise RuntimeError(f"{url} changed while the run was using it (sha256 differs)")
    return Tokenizer.from_str(data.decode())


def describe_tokenizer(data: bytes, eod: str, trained: bool) -> TokenizerInfo:
    tok = Tokenizer.from_str(data.decode())
    return TokenizerInfo(
        sha256=hashlib.sha256(data).hexdigest(),
        vocab_size=tok.get_vocab_size(with_added_tokens=True),
        eod_id=token_id(tok, eod),
        trained=trained,
    )


def install_pretrained(config: TokenmillConfig) -> TokenizerInfo:
    """Copy the pretrained tokenizer into the output (so the dataset carries it) and describe it."""
    source = config.tokenizer.path
    try:
        with fsspec.open(source, "rb") as f:
            data = f.read()
        info = describe_tokenizer(data, config.tokenizer.eod, trained=False)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"tokenizer.path {source!r}: no such file") from e
    except Exception as e:  # tokenizers raises a bare Exception on a malformed file
        if isinstance(e, ValueError) and "EOD" in str(e):
            raise
        raise ValueError(f"tokenizer.path {source!r} is not a readable tokenizer.json: {e}") from e
    store = Store(config.output.path)
    if not store.exists(layout.TOKENIZER) or store.sha256(layout.TOKENIZER) != info.sha256:
        store.write_bytes(layout.TOKENIZER, data)
    return info


def train_on_sample(config: TokenmillConfig, sample_files: list[str]) -> TokenizerInfo:
    """Train on the sample files (in shard order); reuse the trained file if sample and config are unchanged."""
    store, train = Store(config.output.path), config.tokenizer.train
    sample_digest = hashlib.sha256("".join(store.sha256(rel) for rel in sample_files).encode()).hexdigest()
    key = f"{sample_digest[:16]}-{config.section_hash('tokenizer')}"
    if (done := committed(store, "train_tokenizer", 0, key)) is not None and store.exists(layout.TOKENIZER):
        return TokenizerInfo(**done)

    def texts():
        for rel in sample_files:
            with store.open(rel) as f:
                for line in f:
                    yield orjson.loads(line)

    tokenizer = train_bpe(texts(), train, special_tokens=[config.tokenizer.eod])
    data = tokenizer.to_str().encode()
    store.write_bytes(layout.TOKENIZER, data)
    info = describe_tokenizer(data, config.tokenizer.eod, trained=True)
    return TokenizerInfo(**commit(store, "train_tokenizer", 0, key, asdict(info)))


def token_id(tokenizer: Tokenizer, token: str, role: str = "EOD") -> int:
    """The id of a special token, or a clear error before any shard runs."""
    tid = tokenizer.token_to_id(token)
    if tid is None:
        raise ValueError(
            f"{role} token {token!r} is not in the tokenizer's vocabulary; "
            f"set tokenizer.eod to a token it has (e.g. its EOS token)"
        )
    return tid


def encode(tokenizer: Tokenizer, texts: list[str], eod_id: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Encode a batch: (all ids as one flat int64 array, per-document lengths), EOD appended if given."""
    encodings = tokenizer.encode_batch_fast(texts, add_special_tokens=False)
    lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
    if eod_id is None:
        flat = np.fromiter((t for e in encodings for t in e.ids), dtype=np.int64, count=int(lengths.sum()))
        return flat, lengths
    lengths += 1
    flat = np.full(int(lengths.sum()), eod_id, dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    for start, e in zip(starts, encodings, strict=True):
        flat[start : start + len(e.ids)] = e.ids
    return flat, lengths


def train_bpe(texts: Iterable[str], train: TrainConfig, special_tokens: list[str]) -> Tokenizer:
    """A GPT-2 style byte-level BPE: every byte is in the alphabet, so no text is ever unknown."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=train.vocab_size,
        min_frequency=train.min_frequency,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer
