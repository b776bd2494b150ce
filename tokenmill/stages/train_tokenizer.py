"""Tokenizers: the dataset's tokenizer (pretrained, or trained on the sample), its special tokens, and
batch encoding.

The tokenizer is installed once as `tokenizer/tokenizer.json` in the output, whatever its source (a
tiktoken rank file is converted first); its EOD/BOS/PAD ids are resolved there, before any shard runs, so
a missing token is an error naming the config key, never a silently disabled EOD. Shard tasks receive a
small `TokenizerInfo` and each worker process loads the file once (cached by URL and content hash),
never receiving the tokenizer object itself.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict, replace

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from tokenmill.config import ChatConfig, PreferenceConfig, TokenizerConfig, TokenmillConfig, TrainConfig
from tokenmill.core import layout
from tokenmill.core.commits import commit, committed
from tokenmill.core.samples import Sampled, training_files, training_texts
from tokenmill.io.storage import Store
from tokenmill.tokenizers import chat as chats
from tokenmill.tokenizers.pretrained import (
    Pretrained,
    TokenizerSourceError,
    as_transformers_builds_it,
    chat_template_source,
    load_pretrained,
)
from tokenmill.tokenizers.tokenizer_info import TokenizerInfo, describe_tokenizer

UNK_TOKENS = {"unigram": "<unk>", "wordpiece": "[UNK]"}  # bpe is byte-level: nothing is ever unknown


def install(store: Store, data: bytes) -> None:
    if not store.exists(layout.TOKENIZER) or store.sha256(layout.TOKENIZER) != hashlib.sha256(data).hexdigest():
        store.write_bytes(layout.TOKENIZER, data)


def install_pretrained(config: TokenmillConfig) -> TokenizerInfo:
    """Put the pretrained tokenizer into the output as tokenizer.json (so the dataset carries it) and
    resolve its special tokens; any problem is raised here, before a shard runs."""
    cfg = config.tokenizer
    pretrained = load_pretrained(cfg.path, cfg.hub, cfg.tiktoken)
    chat_inputs = {  # conversations and preference pairs are both rendered with a chat template
        name: source.chat or source.preference
        for name, source in config.inputs().items()
        if source.chat is not None or source.preference is not None
    }
    if chat_inputs:
        pretrained = as_transformers_builds_it(pretrained)
    info = describe_tokenizer(
        pretrained.data, cfg, False, pretrained.eos, pretrained.bos, repr(cfg.path), pretrained.parsed
    )
    install(config.output.store(), pretrained.data)
    if not chat_inputs:
        return info
    tokenizer = pretrained.parsed or Tokenizer.from_str(pretrained.data.decode())
    templates = []
    for name, chat in chat_inputs.items():
        try:
            templates.append((name, chat_template(pretrained, name, chat, tokenizer)))
        except TokenizerSourceError:
            if not isinstance(chat, PreferenceConfig) or chat.template is not None:
                raise
            # Plain-text pairs need no template (TRL appends the tokenizer's EOS); conversational ones are refused
    for name, template in templates:  # the dataset carries what its conversations were rendered with
        config.output.store().write_bytes(layout.chat_template_file(name), template.source.encode())
    info = replace(info, chat=tuple(templates))
    if config.has_pairs():  # the EOS TRL appends to a plain-text completion: the tokenizer's own, else tokenizer.eod
        eod = cfg.eod if cfg.eod not in (None, "auto") else None
        info = replace(info, eos_token=pretrained.eos or eod)
    return info


def chat_template(
    pretrained: Pretrained, source: str, chat: ChatConfig | PreferenceConfig, tokenizer: Tokenizer
) -> chats.ChatTemplate:
    """A chat (or preference) input's template, probed for its end-of-turn (`ChatTemplate.probe`), before any shard
    runs."""
    name, text, tokenizer_config = chat_template_source(pretrained, chat.template)
    section = "chat" if isinstance(chat, ChatConfig) else "preference"
    where = f"sources.{source}.input.{section}" if source else f"input.{section}"
    if chat.date is None and "strftime_now" in text:
        raise ValueError(
            f"chat template {name} writes today's date (strftime_now), so its tokens would change every day: set "
            f"{where}.date to the date it should write (e.g. {datetime.date.today().isoformat()})"
        )
    return chats.ChatTemplate.probe(name, text, chats.special_tokens(tokenizer_config), tokenizer, chat.date)


def train_on_sample(config: TokenmillConfig, samples: list[Sampled]) -> TokenizerInfo:
    """Train on the sample (in shard order); reuse the trained file if the sample and config are unchanged."""
    store, cfg = config.output.store(), config.tokenizer
    sample_digest = hashlib.sha256("".join(store.sha256(rel) for rel in training_files(samples)).encode())
    key = f"{sample_digest.hexdigest()[:16]}-{config.section_hash('tokenizer', checks=False)}"
    done = committed(store, "train_tokenizer", 0, key)
    if done is not None and store.exists(layout.TOKENIZER) and store.sha256(layout.TOKENIZER) == done["sha256"]:
        return TokenizerInfo(**done)  # its signed marker, and the very file it trained (one put in its place: trained)
    tokenizer = train_from_texts(training_texts(config, samples), cfg.train, special_tokens(cfg))
    data = tokenizer.to_str().encode()
    info = describe_tokenizer(data, cfg, trained=True, source="the trained tokenizer")
    install(store, data)
    trained = {name: value for name, value in asdict(info).items() if name != "chat"}  # chat inputs: pretrained only
    return TokenizerInfo(**commit(store, "train_tokenizer", 0, key, trained))


def special_tokens(config: TokenizerConfig) -> list[str]:
    """A trained tokenizer's special tokens, ids 0, 1, ... in this order: EOD, BOS, PAD, the configured
    extra ones, and the unknown token of unigram / wordpiece."""
    tokens = [config.eod, config.bos, config.pad, *config.train.special_tokens, UNK_TOKENS.get(config.train.algorithm)]
    return list(dict.fromkeys(t for t in tokens if t is not None))


def _normalizer(train: TrainConfig) -> normalizers.Normalizer | None:
    steps = []
    if train.normalization != "none":
        steps.append(getattr(normalizers, train.normalization.upper())())
    if train.lowercase:
        steps.append(normalizers.Lowercase())
    return normalizers.Sequence(steps) if steps else None


def new_tokenizer(train: TrainConfig, special_tokens: list[str]) -> tuple[Tokenizer, trainers.Trainer]:
    """An untrained tokenizer of the configured algorithm and its trainer."""
    common = {"vocab_size": train.vocab_size, "special_tokens": special_tokens, "show_progress": False}
    if train.algorithm == "bpe":
        # GPT-2 style: every byte is in the alphabet, so no text is ever unknown and decoding is exact.
        if train.vocab_size < 256 + len(special_tokens):
            raise ValueError(
                f"tokenizer.train.vocab_size {train.vocab_size} is too small for a byte-level BPE: "
                f"it needs at least 256 bytes + {len(special_tokens)} special tokens"
            )
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            min_frequency=train.min_frequency, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), **common
        )
    elif train.algorithm == "unigram":
        # SentencePiece style: words carry their leading space as "▁".
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(unk_token=UNK_TOKENS["unigram"], **common)
    else:
        # BERT style: whitespace and punctuation split words, "##" marks a continuation.
        tokenizer = Tokenizer(models.WordPiece(unk_token=UNK_TOKENS["wordpiece"]))
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(min_frequency=train.min_frequency, **common)
    if (normalizer := _normalizer(train)) is not None:
        tokenizer.normalizer = normalizer
    return tokenizer, trainer


def train_from_texts(texts: Iterable[str], train: TrainConfig, special_tokens: list[str]) -> Tokenizer:
    """Train a tokenizer on `texts` (deterministic for the same texts in the same order)."""
    tokenizer, trainer = new_tokenizer(train, special_tokens)
    seen = 0

    def counted() -> Iterable[str]:
        nonlocal seen
        for text in texts:
            seen += 1
            yield text

    try:
        tokenizer.train_from_iterator(counted(), trainer=trainer)
    except Exception as e:  # the Rust trainers raise bare Exceptions, e.g. a vocabulary too large for the sample
        raise ValueError(f"training the {train.algorithm} tokenizer (tokenizer.train) failed: {e}") from e
    if not seen:
        raise ValueError("tokenizer.train: the sample is empty (no document was sampled); raise sample_size")
    return canonical_ids(tokenizer, special_tokens) if train.algorithm != "bpe" else tokenizer


def canonical_ids(tokenizer: Tokenizer, special_tokens: list[str]) -> Tokenizer:
    """The same unigram / wordpiece vocabulary with ids in an order that does not depend on the process.

    Their trainers (tokenizers 0.23) number some tokens in Rust HashMap order, which is seeded per process:
    two runs on the same sample give the same tokens (and scores) under different ids. Neither model's
    encoding depends on the ids (unigram scores pieces, wordpiece takes the longest match), so renumbering
    changes nothing but the ids: special tokens first, then unigram pieces by score, wordpiece tokens by
    length and text. (BPE needs no fix: its ids are its merge order, and its training is deterministic.)
    """
    spec = json.loads(tokenizer.to_str())
    model = spec["model"]
    rank = {token: i for i, token in enumerate(special_tokens)}
    if model["type"] == "Unigram":
        unk = model["vocab"][model["unk_id"]][0] if model.get("unk_id") is not None else None
        model["vocab"].sort(key=lambda p: (rank.get(p[0], len(rank)), -p[1], p[0]))
        if unk is not None:
            model["unk_id"] = next(i for i, (piece, _) in enumerate(model["vocab"]) if piece == unk)
        ids = {piece: i for i, (piece, _) in enumerate(model["vocab"])}
    else:
        order = sorted(model["vocab"], key=lambda t: (rank.get(t, len(rank)), len(t.removeprefix("##")), t))
        ids = model["vocab"] = {token: i for i, token in enumerate(order)}
    for added in spec["added_tokens"]:
        added["id"] = ids[added["content"]]
    return Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))
