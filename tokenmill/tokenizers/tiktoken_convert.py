"""Converting a tiktoken rank file (`.tiktoken`, Llama-3's `tokenizer.model`) into an equivalent HF `tokenizer.json`.

A rank file lists `base64(token bytes) rank` per line; the encoding also needs a split pattern and special
tokens, which the file does not hold. They come from the config, or from the presets below for the files
we know (recognised by their sha256, so a renamed copy is still recognised). The merges are rebuilt from the
ranks as transformers' `TikTokenConverter` does: a token of rank r is the merge of any two tokens whose ranks
are lower and whose concatenation it is, ordered by r. `ignore_merges` makes a pre-token that is itself in
the vocabulary one token, as tiktoken does. Equivalence is tested id for id against `tiktoken.Encoding`.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import re
from dataclasses import dataclass, field

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

_GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
_CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|"""
    r"""\s+(?!\S)|\s"""
)
_O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
_LLAMA3_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"""
    r"""\s+(?!\S)|\s+"""
)


def _llama3_specials() -> dict[str, int]:
    """Meta's llama3 tokenizer.py: 256 special tokens after the 128,000 ranks, most of them reserved."""
    named = ["<|begin_of_text|>", "<|end_of_text|>", *(f"<|reserved_special_token_{i}|>" for i in range(4)),
             "<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_4|>", "<|eot_id|>"]  # fmt: skip
    reserved = [f"<|reserved_special_token_{i}|>" for i in range(5, 256 - 5)]
    return {token: 128_000 + i for i, token in enumerate(named + reserved)}


@dataclass(frozen=True)
class Preset:
    """What a known rank file needs besides its ranks: split pattern, special tokens, its own EOS/BOS."""

    name: str
    pattern: str
    special_tokens: dict[str, int] = field(default_factory=dict)
    eos: str | None = None
    bos: str | None = None


_ENDOFTEXT = "<|endoftext|>"
PRESETS: dict[str, Preset] = {  # sha256 of the rank file -> preset (OpenAI's and Meta's published files)
    "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930": Preset(
        "r50k_base", _GPT2_PATTERN, {_ENDOFTEXT: 50256}, eos=_ENDOFTEXT
    ),
    "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069": Preset(
        "p50k_base", _GPT2_PATTERN, {_ENDOFTEXT: 50256}, eos=_ENDOFTEXT
    ),
    "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7": Preset(
        "cl100k_base",
        _CL100K_PATTERN,
        {
            _ENDOFTEXT: 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            "<|endofprompt|>": 100276,
        },  # fmt: skip
        eos=_ENDOFTEXT,
    ),
    "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d": Preset(
        "o200k_base", _O200K_PATTERN, {_ENDOFTEXT: 199999, "<|endofprompt|>": 200018}, eos=_ENDOFTEXT
    ),
    "82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55": Preset(
        "llama3", _LLAMA3_PATTERN, _llama3_specials(), eos="<|end_of_text|>", bos="<|begin_of_text|>"
    ),
}


def is_rank_file(data: bytes) -> bool:
    """Whether `data` looks like a tiktoken rank file (its first line is `base64 rank`)."""
    first = data[:1024].split(b"\n", 1)[0].split()
    if len(first) != 2 or not first[1].isdigit():
        return False
    try:
        base64.b64decode(first[0], validate=True)
    except ValueError:
        return False
    return True


def parse_ranks(data: bytes, source: str) -> dict[bytes, int]:
    """The ranks of a `.tiktoken` file, or a ValueError naming the file and line."""
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError as e:
            raise ValueError(f"{source}: line {number} is not `base64-token rank`: {line[:80]!r}") from e
    return ranks


@functools.cache
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters, in which byte-level vocabularies are written (in
    byte order)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def _as_vocab_string(token: bytes) -> str:
    table = byte_to_unicode()
    return "".join(table[b] for b in token)


def merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Every (left, right) pair whose concatenation is a token, ordered by that token's rank (then by the
    ranks of the parts), as tiktoken's BPE merges the lowest-ranked concatenation first."""
    found = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ranks and right in ranks:
                found.append((rank, ranks[left], ranks[right], left, right))
    found.sort()
    return [(left, right) for *_, left, right in found]


def onig_pattern(pattern: str) -> str:
    r"""The pattern as HF tokenizers' Oniguruma engine must read it. In Oniguruma (Ruby syntax) `X{1,3}+` is not
    possessive but `(X{1,3})+`, which would make `\p{N}{1,3}+` take a whole run of digits; where nothing follows
    it in its alternative (cl100k's case), possessive and greedy match the same text, so drop the `+`."""
    return re.sub(r"(\{\d+(?:,\d*)?\})\+", r"\1", pattern)


# The same splits as gigatoken spells them: it knows a split pattern by its text, and refuses these as `convert`
# writes them (tiktoken's r50k/p50k and cl100k patterns, as Oniguruma must read them), which left a run with the
# reference alone, `hf`, at a few MB/s a core. tests/test_tokenizer_sources.py finds tiktoken's ids in gigatoken's
# on every document it encodes; a run checks the backend as any other (`encoders.choose_encoder`).
GIGATOKEN_SPELLINGS = {
    onig_pattern(_GPT2_PATTERN): r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
    onig_pattern(_CL100K_PATTERN): (
        r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|"""
        r"""\s+(?!\S)|\s+"""
    ),
}


def in_gigatoken_spelling(tokenizer_json: bytes) -> bytes:
    """`tokenizer_json` with its split pattern as gigatoken spells it, where it is one of GIGATOKEN_SPELLINGS."""
    for written, spelled in GIGATOKEN_SPELLINGS.items():
        tokenizer_json = tokenizer_json.replace(json.dumps(written).encode(), json.dumps(spelled).encode())
    return tokenizer_json


def convert(ranks: dict[bytes, int], pattern: str, special_tokens: dict[str, int]) -> Tokenizer:
    """A byte-level BPE `Tokenizer` that gives the ids `tiktoken.Encoding(pattern, ranks, special_tokens)` gives."""
    if missing := [b for b in range(256) if bytes([b]) not in ranks]:
        raise ValueError(f"the rank file lacks {len(missing)} single bytes (e.g. {missing[0]}): not a byte-level BPE")
    taken = set(ranks.values())
    if clash := {t: i for t, i in special_tokens.items() if i in taken}:
        raise ValueError(f"special token ids collide with ranks: {clash}")
    vocab = {_as_vocab_string(token): rank for token, rank in ranks.items()}
    # Special tokens sit in the model's vocabulary at their own ids (gaps allowed, as in cl100k), and are
    # also registered as added tokens so that the text "<|endoftext|>" is matched whole, never split.
    vocab |= special_tokens
    merges = [(_as_vocab_string(a), _as_vocab_string(b)) for a, b in merges_from_ranks(ranks)]
    tokenizer = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, ignore_merges=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(onig_pattern(pattern)), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special_tokens])
    return tokenizer


def rank_file_preset(data: bytes, source: str, pattern: str | None, special_tokens: dict[str, int] | None) -> Preset:
    """What converting a rank file uses: the pattern and special tokens given, else the preset of a known file
    (required for any other), with a known file's own EOS and BOS."""
    preset = PRESETS.get(hashlib.sha256(data).hexdigest())
    if preset is None and pattern is None:
        known = ", ".join(p.name for p in PRESETS.values())
        raise ValueError(
            f"{source} is a tiktoken rank file tokenmill does not know (known: {known}): "
            "set tokenizer.tiktoken.pattern (its split regex) and tokenizer.tiktoken.special_tokens"
        )
    return Preset(
        name=preset.name if preset else source,
        pattern=pattern if pattern is not None else preset.pattern,
        special_tokens=special_tokens if special_tokens is not None else preset.special_tokens,
        eos=preset.eos if preset else None,
        bos=preset.bos if preset else None,
    )


def rank_file_to_tokenizer_json(data: bytes, source: str, preset: Preset) -> bytes:
    """The tokenizer.json of a rank file, converted with `preset` (`rank_file_preset`)."""
    return convert(parse_ranks(data, source), preset.pattern, preset.special_tokens).to_str().encode()
