"""Conversations as the model's chat template renders them, and the loss mask on the assistant's turns.

Rendering is transformers' `apply_chat_template`'s: the same Jinja sandbox, globals and message normalization, so
the text (and, encoded with `add_special_tokens=False`, the ids) are the ones transformers gives. The assistant's
spans are found without `{% generation %}` tags, by rendering each conversation twice: as it is, and with every
message's content replaced by a sentinel. The template's own text lies between the sentinels; the real rendering is
that text with each content in its place, which tells where each content is. What the template writes after an
assistant content whatever follows it (its end-of-turn, e.g. phi3's `<|end|>\\n`) is found once per template. A
template whose spans cannot be told raises `SpanError` naming it: nothing ever falls back to a mask of all ones.

`mask_problems` is validate's check: a stored mask must be exactly the documented rule's (a token is in when its
characters overlap a span), computed from the spans and the reference's offsets, never from the mask (an all-ones,
a shifted or a one-token-longer mask fails it)."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, Literal

import jinja2
import jinja2.ext
import jinja2.nodes
import numpy as np
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from tokenmill.tokenizers.encoders import TokenOffsets, splice

ROLES = ("system", "user", "assistant", "tool")
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # transformers' _REASONING_FIELDS, in its order
REASONING = frozenset(REASONING_FIELDS)
# The special tokens apply_chat_template passes to the template, by name (its special_tokens_map).
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
SENTINEL = "\U0010fff0{}\U0010fff1"  # private-use code points: no tokenizer or text uses them
SENTINELS = re.compile("\U0010fff0(\\d+)\U0010fff1")
Mask = Literal["assistant", "last_assistant", "all"]


class ChatError(ValueError):
    """A record that cannot become a conversation, or that its template refuses: the message says which field."""


class SpanError(ValueError):
    """The template makes the assistant's spans impossible to locate (in every record, or in this one)."""


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` renders its body unchanged, as in transformers."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.CallBlock:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


class _Namespace(jinja2.utils.Namespace):
    """transformers' TemplateNamespace: no attribute whose name starts with an underscore."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, args = args[0], args[1:]
        attributes = dict(*args, **kwargs)
        for name in attributes:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attributes)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a namespace attribute may not start with '_' ({name!r})")


class _Dict:
    """transformers' TemplateDict: dict() and dict.fromkeys, nothing else of the type."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def compile_template(source: str, today: date | None = None) -> jinja2.Template:
    """`source` compiled as transformers compiles a chat template. `today` is what `strftime_now` formats (a
    template may write today's date, as Granite's does): a dataset pins it, so that a rerun renders the same
    tokens; None is the clock, as in transformers."""
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    now = datetime.now if today is None else (lambda: datetime.combine(today, datetime.min.time()))
    environment.filters["tojson"] = _tojson
    environment.globals |= {
        "raise_exception": _raise_exception,
        "strftime_now": lambda format: now().strftime(format),
        "dict": _Dict(),
        "namespace": _Namespace,
    }
    return environment.from_string(source)


def special_tokens(tokenizer_config: dict) -> dict[str, str]:
    """The template variables apply_chat_template adds: the named special tokens of `tokenizer_config.json`."""
    tokens = {}
    for name in SPECIAL_TOKENS:
        value = tokenizer_config.get(name)
        value = value.get("content") if isinstance(value, dict) else value  # an AddedToken as transformers saves it
        if isinstance(value, str):
            tokens[name] = value
    return tokens


def normalized(messages: list[dict]) -> list[dict]:
    """Messages as transformers hands them to the template: keys whose value is None dropped, and a reasoning
    field under each of the names templates read it by."""
    out = []
    for message in messages:  # most are {role, content}, handed on as they are (a template cannot change them)
        if None in message.values():
            message = {key: value for key, value in message.items() if value is not None}
        if not REASONING.isdisjoint(message):
            reasoning = next((message[key] for key in REASONING_FIELDS if key in message), None)
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


@dataclass(frozen=True)
class ChatTemplate:
    """A model's chat template, with its special tokens, the date it writes as today's, and the end-of-turn it
    writes after an assistant turn (found once, by `probe`). Sent to workers as its source: each compiles it once."""

    name: str  # where it came from, for messages
    source: str
    variables: dict[str, str]
    end_of_turn: str
    today: date | None = None

    @functools.cached_property
    def template(self) -> jinja2.Template:
        return compile_template(self.source, self.today)

    @functools.cached_property
    def layouts(self) -> dict[str, tuple[list[int], list[str]]]:
        """The template's text around the contents of conversations of each shape seen (`_shape`), as `_layout`
        found it: a conversation of a known shape is rendered once, not twice, where that text is its own."""
        return {}

    def __getstate__(self) -> dict:
        return {key: value for key, value in self.__dict__.items() if key not in ("template", "layouts")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def digest(self) -> str:
        """What the tokens depend on: the template as read, its variables, its date and end-of-turn."""
        parts = [self.source, sorted(self.variables.items()), str(self.today), self.end_of_turn]
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]

    @classmethod
    def probe(
        cls, name: str, source: str, variables: dict[str, str], tokenizer: Tokenizer, today: date | None = None
    ) -> ChatTemplate:
        """The template `source`, and its end-of-turn: what follows an assistant content in each of three small
        conversations (the turn last, followed by a user turn, followed by a user and an assistant turn), their
        common start cut back to a token boundary (phi3's `<|end|>\\n<|` is `<|end|>\\n`). SpanError, naming the
        template, where the content does not appear once or nothing ends the turn."""
        template = compile_template(source, today)
        content = SENTINEL.format(0)
        turn = [{"role": "user", "content": "Hello there."}, {"role": "assistant", "content": content}]
        probes = [turn, [*turn, {"role": "user", "content": "Thanks."}]]
        probes.append([*probes[1], {"role": "assistant", "content": "Bye."}])
        after, boundaries = [], []
        for messages in probes:
            try:
                text = render(template, messages, variables)
            except Exception:  # a template may refuse a shape (raise_exception, or its own error): the others decide
                continue
            if text.count(content) != 1:
                raise SpanError(
                    f"chat template {name}: an assistant content appears {text.count(content)} times in its "
                    "rendering, not once, so the assistant's tokens cannot be told from the rest"
                )
            end = text.index(content) + len(content)
            after.append(text[end:])
            real = text.replace(content, "Sure.")  # token boundaries as a real content makes them
            shift = end + len("Sure.") - len(content)
            boundaries.append({stop - shift for _, stop in tokenizer.encode(real, add_special_tokens=False).offsets})
        if not after:
            raise SpanError(f"chat template {name} raises on every conversation of a user and an assistant turn")
        common = _common_start(after)
        length = max((n for n in range(len(common) + 1) if all(n in b for b in boundaries)), default=0)
        if length == 0:
            raise SpanError(
                f"chat template {name} writes nothing that ends an assistant turn (after the content: "
                f"{[text[:40] for text in after]!r}): a model trained on it would not learn to stop"
            )
        return cls(name, source, variables, common[:length], today)


@dataclass(frozen=True)
class RecordFormat:
    """Where a record keeps its conversation. `messages`: a list of turns (HF's and OpenAI's {role, content};
    ShareGPT's {from, value} with `SHAREGPT`), its roles renamed by `roles`. `prompt_completion`: the user's turn
    made of `prompt_fields` (those present, joined by a blank line) and the assistant's of `completion_field`:
    Alpaca's instruction/input/output, dolly's instruction/context/response, gsm8k's question/answer."""

    kind: Literal["messages", "prompt_completion"] = "messages"
    messages_field: str = "messages"
    role_field: str = "role"
    content_field: str = "content"
    roles: tuple[tuple[str, str], ...] = ()  # (a record's role, the chat role), e.g. ("human", "user")
    prompt_fields: tuple[str, ...] = ("instruction", "input")
    completion_field: str = "output"
    system_field: str | None = None  # prompt_completion: a field holding a system turn, if any
    tools_field: str | None = None  # the tools the template is given: a list of JSON schemas, or its JSON text


SHAREGPT = RecordFormat(
    messages_field="conversations",
    role_field="from",
    content_field="value",
    roles=(
        ("human", "user"),
        ("gpt", "assistant"),
        ("system", "system"),
        ("function_call", "assistant"),
        ("observation", "tool"),
    ),
)


@dataclass(frozen=True)
class ChatReading:
    """How a chat input's records become conversations with spans that carry loss: the reader's part of its
    `input.chat` config, with the template the tokenizer's install probed."""

    format: RecordFormat
    template: ChatTemplate
    mask: Mask = "assistant"
    trailer: bool = True

    def rendered(self, record: dict) -> RenderedChat:
        messages, tools = to_messages(record, self.format)
        return render_with_spans(self.template, messages, tools, self.mask, self.trailer)


def to_messages(record: dict, format: RecordFormat) -> tuple[list[dict], list[dict] | None]:
    """The record's conversation (`checked`) and the tools its template is given; ChatError names the field and
    what is wrong with it."""
    if format.kind == "prompt_completion":
        return checked(_prompt_and_completion(record, format)), tools_of(record, format.tools_field)
    field, roles = format.messages_field, dict(format.roles)
    if field not in record or record[field] is None:
        raise ChatError(f"no {field!r} (a list of turns)")
    turns = record[field]
    if not isinstance(turns, list):
        raise ChatError(f"{field!r} is {kind_of(turns)}, not a list of turns")
    messages = []
    for i, turn in enumerate(turns):
        if isinstance(turn, dict):  # as {role, content}, its role renamed
            for name in (format.role_field, format.content_field):
                if name not in turn:
                    raise ChatError(f"{field}[{i}]: no {name!r}")
            role = turn[format.role_field]
            turn = {
                "role": roles.get(role, role) if isinstance(role, str) else role,
                "content": turn[format.content_field],
            }
        messages.append(turn)
    return checked(messages, field), tools_of(record, format.tools_field)


def kind_of(value: Any) -> str:
    """What a value is, for a message: its JSON type, and a string's start."""
    if isinstance(value, str):
        return f"a string ({value[:30]!r})" if value else "an empty string"
    names = {dict: "an object", list: "a list", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _prompt_and_completion(record: dict, format: RecordFormat) -> list[dict]:
    """The user's turn of the prompt fields, the assistant's of the completion field."""
    first, completion = format.prompt_fields[0], format.completion_field
    for field, turn in ((first, "the user's turn"), (completion, "the assistant's turn")):
        if record.get(field) is None:
            raise ChatError(f"no {field!r} (a string): {turn}")
        if not isinstance(record[field], str):
            raise ChatError(f"{field!r} is {kind_of(record[field])}, not a string: {turn}")
        if not record[field].strip():
            raise ChatError(f"{field!r} is empty or only whitespace: {turn}")
    for field in format.prompt_fields:
        if record.get(field) is not None and not isinstance(record[field], str):
            raise ChatError(f"{field!r} is {kind_of(record[field])}, not a string")
    prompt = "\n\n".join(record[field] for field in format.prompt_fields if record.get(field))
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": record[completion]}]
    if format.system_field and record.get(format.system_field):
        messages.insert(0, {"role": "system", "content": record[format.system_field]})
    return messages


def tools_of(record: dict, field: str | None) -> list[dict] | None:
    """The tools the record's `field` holds for the template (a list of JSON schemas, or its JSON text), if any."""
    if field is None or not record.get(field):
        return None
    tools = record[field]
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except ValueError as e:
            raise ChatError(f"{field!r} is not JSON ({e})") from None
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise ChatError(f"{field!r} is not a list of tool schemas")
    return tools


def checked(messages: Any, field: str = "messages") -> list[dict]:
    """`messages` if they make a conversation to train on, else ChatError naming the message and what is wrong:
    not a list of {role, content} (`valid_turns`), an empty assistant turn (one whose content is empty or only
    whitespace: it would teach the model to end its turn without answering), no assistant turn."""
    for i, message in enumerate(valid_turns(messages, field)):
        if message["role"] == "assistant" and not message["content"].strip():
            raise ChatError(f"{field}[{i}]: an empty assistant turn (its content is empty or only whitespace)")
    if not any(message["role"] == "assistant" for message in messages):
        raise ChatError(f"{field!r}: no assistant turn, so nothing would carry loss")
    return messages


def valid_turns(messages: Any, field: str = "messages") -> list[dict]:
    """`messages` if they are a list of turns a template renders, else ChatError naming the turn and what is wrong:
    not a list, empty, a turn that is not {role, content}, an unknown role, a content that is not a string."""
    if not isinstance(messages, list):
        raise ChatError(f"{field!r} is {kind_of(messages)}, not a list of turns")
    if not messages:
        raise ChatError(f"{field!r} is an empty list: no turns")
    for i, message in enumerate(messages):
        where = f"{field}[{i}]"
        if not isinstance(message, dict):
            raise ChatError(f"{where} is {kind_of(message)}, not a turn ({{role, content}})")
        if "role" not in message:
            raise ChatError(f"{where}: no 'role'")
        if message["role"] not in ROLES:
            raise ChatError(f"{where}: unknown role {message['role']!r} (known: {', '.join(ROLES)})")
        if "content" not in message:
            raise ChatError(f"{where}: no 'content'")
        if not isinstance(message["content"], str):
            raise ChatError(f"{where}: content is {kind_of(message['content'])}, not a string")
    return messages


def render(
    template: jinja2.Template, messages: list[dict], variables: dict[str, str], tools=None, generation_prompt=False
) -> str:
    """apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt)."""
    return render_normalized(template, normalized(messages), variables, tools, generation_prompt)


def render_normalized(
    template: jinja2.Template, messages: list[dict], variables: dict[str, str], tools, generation_prompt=False
) -> str:
    """`render` of messages already `normalized`."""
    return template.render(
        messages=messages, tools=tools, documents=None, add_generation_prompt=generation_prompt, **variables
    )


def _common_start(texts: list[str]) -> str:
    shortest = min(texts, key=len)
    for i, character in enumerate(shortest):
        if any(text[i] != character for text in texts):
            return shortest[:i]
    return shortest


@dataclass(frozen=True)
class RenderedChat:
    """A conversation's text and its character spans that carry loss (sorted, disjoint), each with where the
    assistant content itself lies in it (the rest of a span is the template's end-of-turn)."""

    text: str
    spans: list[tuple[int, int]]
    contents: list[tuple[int, int]]


def render_with_spans(
    chat: ChatTemplate, messages: list[dict], tools=None, mask: Mask = "assistant", trailer: bool = True
) -> RenderedChat:
    """The conversation rendered, and the spans that carry loss: each assistant content as the template placed it
    and the end-of-turn after it (`last_assistant`: the last one only; `all`: the whole text). With `trailer`, a
    conversation that ends with the assistant's turn also has what the template writes after it (phi3's final
    `<|endoftext|>`) in its last span, as TRL's generation-tagged templates do."""
    given = normalized(messages)
    try:
        text = render_normalized(chat.template, given, chat.variables, tools)
    except Exception as e:  # the template's raise_exception, or an error in its own code on this record
        raise ChatError(f"chat template {chat.name} refused the record: {type(e).__name__}: {e}") from None
    if mask == "all":
        return RenderedChat(text, [(0, len(text))], [(0, len(text))])
    shape = _shape(given, tools)
    placed = _placed_as(chat.layouts.get(shape), text, messages)
    if placed is None:
        marked = [{**message, "content": SENTINEL.format(i)} for i, message in enumerate(given)]
        layout = _layout(chat.name, render_normalized(chat.template, marked, chat.variables, tools), messages)
        placed = _placed_as(layout, text, messages)
        if placed is None:
            placed = _matched(chat.name, layout, text, messages)
        elif len(chat.layouts) < MAX_LAYOUTS:
            chat.layouts[shape] = layout
    turns = [i for i, message in enumerate(messages) if message["role"] == "assistant"]
    spans, contents = [], []
    for i in turns[-1:] if mask == "last_assistant" else turns:
        start, end = placed[i]
        if not text.startswith(chat.end_of_turn, end):
            raise SpanError(
                f"chat template {chat.name}: assistant message {i} is not followed by the end-of-turn "
                f"{chat.end_of_turn!r} (but {text[end : end + 40]!r})"
            )
        stop = len(text) if trailer and i == len(messages) - 1 else end + len(chat.end_of_turn)
        spans.append((start, stop))
        contents.append((start, end))
    return RenderedChat(text, spans, contents)


MAX_LAYOUTS = 10_000  # shapes of conversation whose layout a template keeps (a few hundred bytes each)


def _shape(messages: list[dict], tools) -> str:
    """What the template's text around the contents may depend on besides them: the messages' other fields (the
    roles, in order), and the tools."""
    return json.dumps([[(k, v) for k, v in m.items() if k != "content"] for m in messages] + [tools], default=str)


def _layout(name: str, marked: str, messages: list[dict]) -> tuple[list[int], list[str]]:
    """The order in which the template writes the messages, and its text between them, from the rendering `marked`
    of the conversation with sentinels for contents. Each sentinel must appear once: a template that drops a
    message (phi3 drops `tool` turns) is an error, not a conversation with a hole."""
    order = [int(i) for i in SENTINELS.findall(marked)]
    for i, message in enumerate(messages):
        if order.count(i) != 1:
            raise SpanError(
                f"chat template {name} renders message {i} ({message['role']}) {order.count(i)} times, not once"
            )
    return order, SENTINELS.split(marked)[::2]


def _placed_as(layout, text: str, messages: list[dict]) -> dict[int, tuple[int, int]] | None:
    """Where each message's content lies in `text`, if `text` is the layout's text with the contents in place
    (a template that writes them as they are), else None."""
    if layout is None or len(layout[0]) != len(messages):
        return None
    order, between = layout
    contents = [messages[i]["content"] for i in order]
    if "".join(part for pair in zip(between, [*contents, ""], strict=True) for part in pair) != text:
        return None
    return _positions(order, between, contents)


def _matched(name: str, layout, text: str, messages: list[dict]) -> dict[int, tuple[int, int]]:
    """`_placed_as` for a template that changes the contents it writes (one that trims them): the template's text
    between them matched in `text`, and an assistant content there as it is or stripped."""
    order, between = layout
    found = re.fullmatch("(.*?)".join(map(re.escape, between)), text, flags=re.DOTALL)
    if found is None:
        raise SpanError(f"chat template {name}: its text around the messages depends on their contents")
    for i, got in zip(order, found.groups(), strict=True):
        wanted = messages[i]["content"]
        if messages[i]["role"] == "assistant" and got not in (wanted, wanted.strip()):
            raise SpanError(f"chat template {name} changes assistant message {i} ({wanted[:40]!r}: {got[:40]!r})")
    return _positions(order, between, list(found.groups()))


def _positions(order: list[int], between: list[str], contents: list[str]) -> dict[int, tuple[int, int]]:
    placed, position = {}, len(between[0])
    for i, content, following in zip(order, contents, between[1:], strict=True):
        placed[i] = (position, position + len(content))
        position += len(content) + len(following)
    return placed


def token_mask(offsets: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    """1 for each token whose characters overlap a span (transformers' rule for its assistant mask), else 0."""
    if not spans or not len(offsets):
        return np.zeros(len(offsets), dtype=np.uint8)
    starts, ends = np.array(spans).T
    nearest = np.searchsorted(ends, offsets[:, 0], side="right")  # the first span that ends after the token starts
    hit = nearest < len(spans)
    hit[hit] = starts[nearest[hit]] < offsets[hit, 1]
    return hit.astype(np.uint8)


def _mask_of(encoding, spans: list[tuple[int, int]]) -> np.ndarray:
    """`token_mask` of an encoding: the tokens from the one holding a span's first character to the one holding
    its last (a tenth of the time of reading every token's offsets), or where a character is in no token (a
    normalizer dropped it), by the offsets."""
    mask = np.zeros(len(encoding.ids), dtype=np.uint8)
    for start, end in spans:
        first, last = encoding.char_to_token(start), encoding.char_to_token(end - 1)
        if first is None or last is None:
            return token_mask(np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2), spans)
        mask[first : last + 1] = 1
    return mask


def encode(tokenizer: Tokenizer, chat: RenderedChat) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The token ids (as apply_chat_template's: add_special_tokens=False), the loss mask (as `encode_batch` makes
    it) and the tokens' offsets."""
    encoding = tokenizer.encode(chat.text, add_special_tokens=False)
    offsets = np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2)
    return np.asarray(encoding.ids, dtype=np.int64), _mask_of(encoding, chat.spans), offsets


def encode_batch(
    tokenizer: Tokenizer, chats: list[RenderedChat], fast: Any = None, offsets: TokenOffsets | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`encode` for a batch: (every conversation's ids back to back, their lengths, their loss masks back to
    back). With a fast backend (`fast`, the run's choice, which gives ids only) and `offsets` (where its tokens
    lie), the masks come from the ids; a conversation whose tokens do not tile its text is encoded by `tokenizer`
    (the reference, in its threads), as every conversation is without them."""
    texts = [rendered.text for rendered in chats]
    if fast is None or offsets is None or not chats:
        return _encoded_by(tokenizer, chats)
    ids, lengths = fast.encode_batch(texts)
    ids = ids.astype(np.int64)
    encoded = [text.encode() for text in texts]
    where, tiles = offsets.of_batch(ids, lengths, encoded)
    text_lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
    text_starts = np.cumsum(text_lengths) - text_lengths
    spans = np.array(
        [
            (c, *span)
            for c, (rendered, text) in enumerate(zip(chats, encoded, strict=True))
            for span in _in_bytes(rendered, text)
        ],
        np.int64,
    ).reshape(-1, 3)
    conversation = np.repeat(np.arange(len(chats)), lengths)
    token_starts = np.clip(where[:, 0] + text_starts[conversation], text_starts[conversation], None)
    token_ends = where[:, 1] + text_starts[conversation]
    # each span's tokens: from the first that ends after it starts to the first that starts at or after its end
    first = np.searchsorted(token_ends, spans[:, 1] + text_starts[spans[:, 0]], side="right")
    stop = np.searchsorted(token_starts, spans[:, 2] + text_starts[spans[:, 0]], side="left")
    edges = np.zeros(len(ids) + 1, np.int64)
    np.add.at(edges, first, 1)
    np.add.at(edges, stop, -1)
    masks = (np.cumsum(edges[:-1]) > 0).astype(np.uint8)
    redo = np.flatnonzero(~tiles)
    if len(redo):
        exact_ids, exact_lengths, exact_masks = _encoded_by(tokenizer, [chats[i] for i in redo])
        masks, _ = splice(masks, lengths, redo, exact_masks, exact_lengths)
        ids, lengths = splice(ids, lengths, redo, exact_ids, exact_lengths)
    return ids, lengths, masks


def _encoded_by(tokenizer: Tokenizer, chats: list[RenderedChat]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    encodings = tokenizer.encode_batch([rendered.text for rendered in chats], add_special_tokens=False)
    ids = [np.asarray(encoding.ids, dtype=np.int64) for encoding in encodings]
    masks = [_mask_of(encoding, rendered.spans) for encoding, rendered in zip(encodings, chats, strict=True)]
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    if not ids:
        return np.empty(0, np.int64), lengths, np.empty(0, np.uint8)
    return np.concatenate(ids), lengths, np.concatenate(masks)


def _in_bytes(rendered: RenderedChat, text: bytes) -> list[tuple[int, int]]:
    """The spans that carry loss, in the UTF-8 bytes `text` of the conversation."""
    if len(text) == len(rendered.text):  # ASCII: the same positions
        return rendered.spans
    at = functools.cache(lambda i: len(rendered.text[:i].encode()))
    return [(at(start), at(end)) for start, end in rendered.spans]


def wrong_runs(
    tokenizer: Tokenizer, ids: np.ndarray, mask: np.ndarray, expected: np.ndarray
) -> list[tuple[int, int, bool, str]]:
    """Each run of consecutive tokens whose mask differs from `expected`, all masked in or all masked out where they
    should not be: (first, stop, whether they should carry loss, the start of what they decode to)."""
    wrong = np.flatnonzero(np.asarray(mask) != expected)
    breaks = np.flatnonzero((np.diff(wrong) != 1) | (np.diff(np.asarray(expected)[wrong].astype(np.int8)) != 0)) + 1
    runs = [(int(run[0]), int(run[-1]) + 1) for run in np.split(wrong, breaks)] if len(wrong) else []
    return [
        (first, stop, bool(expected[first]), tokenizer.decode(ids[first:stop].tolist(), skip_special_tokens=False)[:40])
        for first, stop in runs
    ]


def mask_problems(
    tokenizer: Tokenizer, chat: RenderedChat, ids: np.ndarray, offsets: np.ndarray, mask: np.ndarray
) -> list[str]:
    """What is wrong with `mask` (empty: nothing), a conversation's stored loss mask of the tokens `ids` at
    `offsets` (the reference's, in characters of `chat.text`): it must be exactly the documented rule's mask, 1 for
    each token whose characters overlap a span that carries loss and 0 for every other (`token_mask`, the rule of
    transformers' `return_assistant_tokens_mask`). The expected mask comes from the rendering and the offsets,
    never from the stored one, so an all-ones, a shifted or a one-token-longer mask fails, whatever the template
    does with whitespace around its special tokens or with turns that follow each other. Each wrong run of tokens
    is named with what it decodes to."""
    if len(mask) != len(ids):
        return [f"{len(mask)} mask bytes for {len(ids)} tokens"]
    expected = token_mask(np.asarray(offsets, dtype=np.int64).reshape(-1, 2), chat.spans)
    problems = []
    for first, stop, should, text in wrong_runs(tokenizer, ids, mask, expected):
        where = "in a span that carries loss" if should else "outside every span that carries loss"
        state = "masked out" if should else "masked in"
        problems.append(f"tokens {first}:{stop} ({text!r}) are {state} but lie {where}")
    return problems
