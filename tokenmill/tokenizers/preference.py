"""Preference pairs (DPO and its relatives): a prompt with a chosen and a rejected completion, read from TRL's
preference formats and tokenized exactly as TRL's DPO preprocessing tokenizes them with the same tokenizer and chat
template (trl 1.16: `DPOTrainer._prepare_dataset`, `trl.data_utils.extract_prompt`).

The formats (TRL's "preference" type; the field names are `PairFormat`'s):
- conversational, explicit prompt: `prompt` a list of messages, `chosen` and `rejected` the completions' messages;
- conversational, implicit prompt: no `prompt`; `chosen` and `rejected` are whole conversations, and the turns they
  share from the start are the prompt (`extract_prompt`);
- standard: `prompt`, `chosen` and `rejected` plain strings, or `chosen` and `rejected` alone, their common start
  (in characters, less a space it ends with) the prompt.

Tokenized as TRL does. A conversational prompt is rendered with the generation prompt, and the prompt followed by
each completion as one conversation, all encoded as apply_chat_template encodes (no special tokens added). Plain
text is encoded as the tokenizer's `__call__` encodes (its special tokens added), after the EOS is appended to each
completion that does not end with it. The completion is what follows the longest common start of the prompt's ids
and the prompt-and-completion's, taken over both sides; the prompt's ids are that start. A template that renders a
prompt alone otherwise than followed by a completion, or tokens that merge across the boundary, so move the
boundary as they do in TRL. The loss is on the completions only.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from tokenizers import Tokenizer

from tokenmill.tokenizers.chat import (
    ChatError,
    ChatTemplate,
    kind_of,
    normalized,
    render_normalized,
    tools_of,
    valid_turns,
    wrong_runs,
)


@dataclass(frozen=True)
class PairFormat:
    """Where a record keeps its pair. Without `prompt_field` in a record, its prompt is implicit (TRL's
    `extract_prompt`: the start that `chosen` and `rejected` share)."""

    prompt_field: str = "prompt"
    chosen_field: str = "chosen"
    rejected_field: str = "rejected"
    tools_field: str | None = None  # the tools the template is given: a list of JSON schemas, or its JSON text
    # auto: the prompt is `prompt_field` where a record has it, else implicit; explicit: every record has it;
    # implicit: always extracted from chosen and rejected (a `prompt_field` in a record is not read)
    form: Literal["auto", "explicit", "implicit"] = "auto"


@dataclass(frozen=True)
class Pair:
    """A prompt and its two completions: all three lists of messages (conversational) or all three strings."""

    prompt: list[dict] | str
    chosen: list[dict] | str
    rejected: list[dict] | str
    tools: list[dict] | None = None

    @property
    def conversational(self) -> bool:
        return isinstance(self.chosen, list)


@dataclass(frozen=True)
class TokenizedPair:
    """A pair's ids as TRL's DPO preprocessing gives them (`prompt_ids`, `chosen_ids`, `rejected_ids`): a trainer
    trains on `prompt + chosen` and `prompt + rejected`, the loss on the completion's tokens only."""

    prompt: np.ndarray
    chosen: np.ndarray
    rejected: np.ndarray


def to_pair(record: dict, format: PairFormat = PairFormat()) -> Pair:
    """The record's pair, its prompt extracted where it is implicit; ChatError names the field and what is wrong."""
    sides = {}
    for name, field in (("chosen", format.chosen_field), ("rejected", format.rejected_field)):
        if record.get(field) is None:
            raise ChatError(f"no {field!r} (the {name} completion: a list of messages or a string)")
        sides[name] = _side(record[field], field)
    chosen, rejected = sides["chosen"], sides["rejected"]
    if isinstance(chosen, list) != isinstance(rejected, list):
        raise ChatError(
            f"{format.chosen_field!r} is {kind_of(chosen)} but {format.rejected_field!r} is {kind_of(rejected)}"
        )
    if format.form == "explicit" and record.get(format.prompt_field) is None:
        raise ChatError(f"no {format.prompt_field!r} (the prompt: a list of messages or a string; form: explicit)")
    if format.form == "implicit" or record.get(format.prompt_field) is None:
        prompt, chosen, rejected = extract_prompt(chosen, rejected, format)
    else:
        prompt = _side(record[format.prompt_field], format.prompt_field)
        if isinstance(prompt, list) != isinstance(chosen, list):
            raise ChatError(
                f"{format.prompt_field!r} is {kind_of(prompt)} but {format.chosen_field!r} is {kind_of(chosen)}: "
                "all lists of messages, or all strings"
            )
    return Pair(prompt, chosen, rejected, tools_of(record, format.tools_field))


def _side(value: Any, field: str) -> list[dict] | str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return valid_turns(value, field)
    raise ChatError(f"{field!r} is {kind_of(value)}, not a list of messages or a string")


def extract_prompt(chosen, rejected, format: PairFormat = PairFormat()) -> tuple[Any, Any, Any]:
    """TRL's `extract_prompt`, exactly: (prompt, chosen, rejected) where the prompt is the longest start the two
    share (turns, or characters less a space that ends it); where one is the start of the other, all but the last
    item of the shorter. ChatError where they share nothing, or one is empty."""
    shortest = min(len(chosen), len(rejected))
    if shortest == 0:
        raise ChatError(f"{format.chosen_field!r} or {format.rejected_field!r} is empty: no prompt to extract")
    end = next((i for i in range(shortest) if chosen[i] != rejected[i]), None)
    if end is None:  # TRL's loop ends on its last index
        end = shortest - 1
    elif chosen[end - 1] == " ":  # a string: the space before the completion goes with it
        end -= 1
    if end <= 0:
        raise ChatError(
            f"{format.chosen_field!r} and {format.rejected_field!r} share no start, so no prompt "
            f"(and no {format.prompt_field!r} field)"
        )
    return chosen[:end], chosen[end:], rejected[end:]


@dataclass(frozen=True)
class PairTexts:
    """A pair as the texts its tokenization encodes (`pair_texts`): the prompt alone, the prompt with the chosen
    completion, the prompt with the rejected one; `special`: encoded with the tokenizer's own special tokens added
    (plain text), or not (a rendered conversation)."""

    prompt: str
    chosen: str
    rejected: str
    special: bool

    @property
    def text(self) -> str:
        """Its longest text, for what holds a document's text (a sample's size, the encoder's verification)."""
        return max(self.chosen, self.rejected, key=len)


@dataclass(frozen=True)
class PairReading:
    """How a preference input's records become pairs' texts: the reader's part of its `input.preference` config,
    with the template the tokenizer's install probed and the EOS that TRL appends to a plain completion."""

    format: PairFormat
    template: ChatTemplate | None
    eos_token: str

    def rendered(self, record: dict) -> PairTexts:
        """The record's pair as its texts; ChatError names what is wrong (a field, a turn, the template's refusal)."""
        return pair_texts(to_pair(record, self.format), self.template, self.eos_token)


def pair_texts(pair: Pair, chat: ChatTemplate | None, eos_token: str) -> PairTexts:
    """The texts TRL's DPO preprocessing encodes for `pair`: a conversational prompt rendered with the generation
    prompt, and followed by each completion as one conversation (`chat`); plain text as it is, `eos_token` appended
    to a completion that does not end with it."""
    if pair.conversational:
        if chat is None:
            raise ChatError(
                "a conversational pair needs a chat template: the tokenizer has none (name a .jinja file in "
                "input.preference.template)"
            )
        prompt = normalized(pair.prompt)  # once for its three renderings (transformers normalizes each message)
        return PairTexts(
            _rendered(chat, prompt, pair.tools, generation_prompt=True),
            _rendered(chat, prompt + normalized(pair.chosen), pair.tools),
            _rendered(chat, prompt + normalized(pair.rejected), pair.tools),
            special=False,
        )
    chosen, rejected = (c if c.endswith(eos_token) else c + eos_token for c in (pair.chosen, pair.rejected))
    return PairTexts(pair.prompt, pair.prompt + chosen, pair.prompt + rejected, special=True)


# How a batch of texts becomes ids: (the texts, whether the tokenizer's own special tokens are added) -> (every
# text's ids back to back, each text's number of ids)
EncodeTexts = Callable[[list[str], bool], tuple[np.ndarray, np.ndarray]]


def encode_pairs(pairs: list[PairTexts], encode: EncodeTexts) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each pair's sequences from its texts (`pair_texts`), as TRL's DPO preprocessing tokenizes them, with one
    batched `encode` per kind (plain text with the special tokens added, rendered conversations without) and no
    Python per pair or token: the prompt's ids are the longest common start of the prompt's and both sequences'
    ids, each completion's ids what follows. A pair's chosen sequence (prompt then chosen completion) is the ids of
    its prompt-and-chosen text, its rejected one likewise. (the sequences' ids back to back, chosen then rejected
    for each pair, as `pair_sequences` lays them out; their loss masks, 1 on the completions' ids; the sequences'
    lengths; each pair's prompt length)."""
    n = len(pairs)
    if not n:
        return np.empty(0, np.int64), np.empty(0, np.uint8), np.empty(0, np.int64), np.empty(0, np.int64)
    special = np.fromiter((p.special for p in pairs), bool, n)
    parts, order = [], []
    for kind in (False, True):
        of_kind = np.flatnonzero(special == kind)
        if len(of_kind):
            texts = [text for k in of_kind.tolist() for text in (pairs[k].prompt, pairs[k].chosen, pairs[k].rejected)]
            parts.append(encode(texts, kind))
            order.append(of_kind)
    flat = np.concatenate([f for f, _ in parts])
    lengths = np.concatenate([np.asarray(n_, np.int64) for _, n_ in parts]).reshape(-1, 3)
    if len(parts) > 1:  # back in the pairs' order
        where = np.argsort(np.concatenate(order), kind="stable")
        starts = (np.cumsum(lengths.ravel()) - lengths.ravel()).reshape(-1, 3)[where]
        lengths = lengths[where]
        firsts = np.cumsum(lengths.ravel()) - lengths.ravel()
        flat = flat[np.arange(len(flat)) + np.repeat(starts.ravel() - firsts, lengths.ravel())]
    # Each pair's texts are back to back in `flat`: its prompt (P), prompt and chosen (C), prompt and rejected (R).
    # Segments are picked out of it by a pattern repeated over their lengths (a byte per id), not by a loop.
    prompt, chosen, rejected = lengths.T
    most = np.minimum(prompt, chosen)
    shared = _common_starts(flat, [most, prompt - most, most, chosen - most, rejected], 0, 2)
    most = np.minimum(prompt, rejected)
    shared = np.minimum(shared, _common_starts(flat, [most, prompt - most, chosen, most, rejected - most], 0, 3))
    tokens = flat[_picked(lengths.T, [False, True, True])]  # the sequences: C and R of each pair
    masks = np.repeat(
        np.tile(np.uint8([0, 1]), 2 * n), np.stack([shared, chosen - shared, shared, rejected - shared], axis=1).ravel()
    )
    return tokens, masks, lengths[:, 1:].ravel(), shared


def _picked(segments: list[np.ndarray], pattern: list[bool]) -> np.ndarray:
    """Which ids of a flat array of segments (each pair's `segments`, in order, back to back) are in segments marked
    in `pattern`: a boolean per id."""
    sizes = np.stack(segments, axis=1).ravel()
    return np.repeat(np.tile(np.array(pattern), len(segments[0])), sizes)


def _common_starts(flat: np.ndarray, segments: list[np.ndarray], a: int, b: int) -> np.ndarray:
    """For each pair, how many ids its segments `a` and `b` (of `segments`, which tile `flat`; they are equally long)
    start with in common, all of them at most (TRL's `common_prefix_length`)."""
    most = segments[a]
    pattern = [False] * len(segments)
    first, second = list(pattern), list(pattern)
    first[a] = second[b] = True
    differ = np.flatnonzero(flat[_picked(segments, first)] != flat[_picked(segments, second)])
    common = most.copy()
    if len(differ):
        ends = np.cumsum(most)
        pair = np.searchsorted(ends, differ, side="right")
        pairs, at = np.unique(pair, return_index=True)  # the first difference of each pair that has one
        common[pairs] = differ[at] - (ends - most)[pairs]
    return common


def tokenizer_encode(tokenizer: Tokenizer) -> EncodeTexts:
    """`EncodeTexts` of HF tokenizers (as `tokenizer(text)` and apply_chat_template encode)."""

    def encode(texts: list[str], special: bool) -> tuple[np.ndarray, np.ndarray]:
        ids = [e.ids for e in tokenizer.encode_batch_fast(texts, add_special_tokens=special)]
        lengths = np.fromiter(map(len, ids), np.int64, len(ids))
        return np.fromiter(itertools.chain.from_iterable(ids), np.int64, int(lengths.sum())), lengths

    return encode


SPECIAL_PROBES = ("a", "Hello, world!\n  12 ü")  # texts whose ids with and without special tokens tell what is added


def special_ends(tokenizer: Tokenizer) -> tuple[np.ndarray, np.ndarray] | None:
    """The ids `tokenizer` puts before and after a text when it adds its special tokens (its post-processor's, e.g.
    a BOS), where they are the same for every probe text; None where they are not."""
    found = set()
    for text in SPECIAL_PROBES:
        added, bare = (tokenizer.encode(text, add_special_tokens=special).ids for special in (True, False))
        at = next((p for p in range(len(added) - len(bare) + 1) if added[p : p + len(bare)] == bare), None)
        if at is None:
            return None
        found.add((tuple(added[:at]), tuple(added[at + len(bare) :])))
    if len(found) != 1:
        return None
    before, after = found.pop()
    return np.array(before, np.int64), np.array(after, np.int64)


def encoder_encode(encoder, reference: Tokenizer) -> EncodeTexts:
    """`EncodeTexts` of a run's encoder (`tokenmill.tokenizers.encoders`: HF tokenizers' ids without special tokens,
    from the fastest exact backend): a plain text also gets the special tokens `reference` puts around every text
    (`special_ends`); where those depend on the text, plain texts are encoded by `reference` itself."""
    ends, by_reference = special_ends(reference), tokenizer_encode(reference)

    def encode(texts: list[str], special: bool) -> tuple[np.ndarray, np.ndarray]:
        if special and ends is None:
            return by_reference(texts, True)
        flat, lengths = encoder.encode_batch(texts)
        return _around(flat, lengths, *ends) if special else (flat, lengths)

    return encode


def _around(flat: np.ndarray, lengths: np.ndarray, before: np.ndarray, after: np.ndarray):
    """Each text's ids (`flat`, `lengths`) with `before` and `after` around them."""
    n = len(lengths)
    segments = [np.full(n, len(before)), lengths, np.full(n, len(after))]
    out = np.empty(int(lengths.sum()) + n * (len(before) + len(after)), flat.dtype)
    out[_picked(segments, [False, True, False])] = flat
    out[_picked(segments, [True, False, False])] = np.tile(before, n)
    out[_picked(segments, [False, False, True])] = np.tile(after, n)
    return out, lengths + len(before) + len(after)


def tokenize_texts(tokenizer: Tokenizer, pairs: list[PairTexts]) -> list[TokenizedPair]:
    """`encode_pairs` with HF tokenizers, each pair's prompt, chosen and rejected ids apart (TRL's columns)."""
    tokens, _, lengths, prompts = encode_pairs(pairs, tokenizer_encode(tokenizer))
    tokens, ends = tokens.astype(np.int64), np.cumsum(lengths)
    tokenized = []
    for k, shared in enumerate(prompts.tolist()):
        chosen, rejected = tokens[ends[2 * k] - lengths[2 * k] : ends[2 * k]], tokens[ends[2 * k] : ends[2 * k + 1]]
        tokenized.append(TokenizedPair(chosen[:shared], chosen[shared:], rejected[shared:]))
    return tokenized


def tokenize_pair(pair: Pair, tokenizer: Tokenizer, chat: ChatTemplate | None, eos_token: str) -> TokenizedPair:
    """The pair's ids as TRL's DPO preprocessing makes them with `tokenizer` (as transformers builds it) and the
    template `chat` (needed for a conversational pair). `eos_token` is appended to a plain completion that does not
    end with it."""
    return tokenize_texts(tokenizer, [pair_texts(pair, chat, eos_token)])[0]


def _rendered(chat: ChatTemplate, messages: list[dict], tools, generation_prompt: bool = False) -> str:
    """`chat.render` of messages already `normalized`."""
    try:
        return render_normalized(chat.template, messages, chat.variables, tools, generation_prompt)
    except Exception as e:  # the template's raise_exception, or an error in its own code on this pair
        raise ChatError(f"chat template {chat.name} refused the pair: {type(e).__name__}: {e}") from None


def fit_pair(pair: TokenizedPair, max_length: int | None, policy: Literal["drop", "truncate"]) -> TokenizedPair | None:
    """The pair within `max_length` tokens a side (prompt and completion), as TRL's `max_length` with
    `truncation_mode="keep_start"` fits it, or None where it is dropped; never one side only. A prompt of
    `max_length` tokens or more leaves no completion token, and its pair is dropped whatever `policy` says (TRL's
    filter). Else a side longer than `max_length` is cut to its first `max_length` tokens (`truncate`: TRL's
    collator, each side on its own), or the whole pair is dropped (`drop`)."""
    if max_length is None:
        return pair
    if len(pair.prompt) >= max_length:
        return None
    room = max_length - len(pair.prompt)
    if max(len(pair.chosen), len(pair.rejected)) <= room:
        return pair
    if policy == "drop":
        return None
    return TokenizedPair(pair.prompt, pair.chosen[:room], pair.rejected[:room])


def pair_sequences(pairs: list[TokenizedPair]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pairs as the sequences a trainer runs, for `packers.pack_pairs`: per pair its prompt and chosen
    completion, then its prompt and rejected completion (the prompt repeated, so that each is a sequence of its
    own), back to back; their loss masks (1 on the completions' tokens, 0 on the prompts'); their lengths."""
    sides = [(pair.prompt, completion) for pair in pairs for completion in (pair.chosen, pair.rejected)]
    if not sides:
        return np.empty(0, np.int64), np.empty(0, np.uint8), np.empty(0, np.int64)
    tokens = np.concatenate([part for side in sides for part in side])
    masks = np.concatenate([np.repeat(np.uint8([0, 1]), [len(prompt), len(c)]) for prompt, c in sides])
    lengths = np.array([len(prompt) + len(c) for prompt, c in sides], dtype=np.int64)
    return tokens.astype(np.int64), masks, lengths


def pair_problems(
    tokenizer: Tokenizer, expected: TokenizedPair, stored: list[tuple[np.ndarray, np.ndarray]]
) -> list[str]:
    """What is wrong with a pair as stored (empty: nothing), for validate: `stored` is its chosen then its rejected
    sequence (ids and loss mask each). Each must be the prompt's ids and then its completion's, as `expected` (the
    pair tokenized again), with the loss on exactly the completion's tokens (none on the sequence's first token):
    an all-ones mask, one that reaches into the prompt or one shifted by a token fails. Each wrong run of tokens is
    named with what it decodes to."""
    if len(stored) != 2:
        return [f"{len(stored)} sequences, not a pair's two (chosen, rejected)"]
    problems = []
    completions = (expected.chosen, expected.rejected)
    for side, completion, (ids, mask) in zip(("chosen", "rejected"), completions, stored, strict=True):
        wanted = np.concatenate([expected.prompt, completion])
        if len(ids) != len(wanted) or not np.array_equal(ids, wanted):
            problems.append(f"{side}: its {len(ids)} ids are not the prompt's and the completion's ({len(wanted)})")
            continue
        if len(mask) != len(ids):
            problems.append(f"{side}: {len(mask)} mask values for {len(ids)} tokens")
            continue
        loss = np.repeat(np.uint8([0, 1]), [len(expected.prompt), len(completion)])
        loss[:1] = 0
        for first, stop, should, text in wrong_runs(tokenizer, ids, mask, loss):
            where = "in the completion" if should else "outside the completion (the prompt)"
            state = "without loss" if should else "with loss"
            problems.append(f"{side}: tokens {first}:{stop} ({text!r}) are {where} but {state}")
    return problems


def fit_stored(
    lengths: np.ndarray, prompts: np.ndarray, max_length: int, policy: Literal["drop", "truncate"]
) -> tuple[np.ndarray, np.ndarray]:
    """`fit_pair` on stored pairs at once: `lengths` each pair's chosen then rejected sequence (`pair_sequences`),
    `prompts` each pair's prompt length. (which pairs are kept, each kept sequence's length): a kept sequence is its
    first tokens, so cutting it is keeping fewer of them."""
    lengths = np.asarray(lengths, dtype=np.int64)
    chosen, rejected, prompts = lengths[0::2], lengths[1::2], np.asarray(prompts, dtype=np.int64)
    fits = np.maximum(chosen, rejected) <= max_length
    keep = prompts < max_length if policy == "truncate" else fits & (prompts < max_length)
    return keep, np.minimum(lengths, max_length)[np.repeat(keep, 2)]
