"""tokenmill.tokenizers.chat against transformers itself: real conversations (tests/data/chat, examples/chat) rendered
with real chat templates (tests/data/tokenizers: phi3-mini, whose template has no `{% generation %}` tags, its tagged
twin from TRL, and Granite 3.1's) give apply_chat_template's text and ids; the assistant's spans, found without tags,
give the mask transformers computes from the tags; validate's check passes that mask and fails an all-ones or a shifted
one; a template whose spans cannot be told is refused by name."""

from __future__ import annotations

import dataclasses
import datetime
import functools
import gzip
import itertools
import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from tokenmill.core.packers import pack_conversations
from tokenmill.tokenizers import chat, encoders, pretrained

from .conftest import CHAT, EXAMPLES, TOKENIZERS
from .test_packing import targets, unpacked_targets

TODAY = datetime.date(2026, 1, 15)  # Granite's template writes the date: pinned on both sides
PER_CORPUS = 300  # the first conversations of each corpus; every one the repository holds: `make slow`
PHI3, GRANITE = TOKENIZERS / "phi3-mini", TOKENIZERS / "granite-3.1"
TEMPLATES = {  # name: (tokenizer directory, template source)
    "phi3": (PHI3, json.loads((PHI3 / "tokenizer_config.json").read_text())["chat_template"]),
    "phi3_training": (PHI3, (PHI3 / "phi3_training.jinja").read_text()),
    "granite": (GRANITE, (GRANITE / "granite_3_1_chat_template.jinja").read_text()),
}


ALPACA = chat.RecordFormat(
    kind="prompt_completion", prompt_fields=("instruction", "input"), completion_field="response"
)
GSM8K = chat.RecordFormat("prompt_completion", prompt_fields=("question",), completion_field="answer")
GLAIVE = dataclasses.replace(chat.SHAREGPT, tools_field="tools")


def records(path: str | Path, limit: int | None = None) -> list[dict]:
    """A corpus file's first `limit` records (None: all): JSON lines, or one JSON array; gzipped or not."""
    file = CHAT / path
    with gzip.open(file, "rt") if file.suffix == ".gz" else file.open() as f:
        if ".jsonl" in file.name:
            return [json.loads(line) for line in itertools.islice(f, limit)]
        return json.load(f)[:limit]


def conversations(limit: int | None = PER_CORPUS) -> list[list[dict]]:
    """The first `limit` conversations (None: all) of the multi-turn dialogues, and of two instruction corpora as a
    user's prompt and the assistant's completion."""
    corpora = [
        (EXAMPLES / "chat/sgd_dialogues_500.jsonl.gz", chat.RecordFormat()),
        ("gsm8k/train.jsonl.gz", GSM8K),
        ("gpteacher-alpaca/codegen-instruct.json.gz", ALPACA),
    ]
    return [chat.to_messages(r, format)[0] for path, format in corpora for r in records(path, limit)]


class _Today(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return cls(TODAY.year, TODAY.month, TODAY.day)


@pytest.fixture(scope="module")
def reference():
    """transformers' tokenizers (AutoTokenizer, as a trainer loads them), its clock pinned to TODAY."""
    import transformers.utils.chat_template_utils as rendering
    from transformers import AutoTokenizer

    clock, rendering.datetime = rendering.datetime, _Today  # strftime_now reads `datetime` when it runs
    yield {directory: AutoTokenizer.from_pretrained(str(directory)) for directory in (PHI3, GRANITE)}
    rendering.datetime = clock


def ours(name: str, reference) -> tuple[chat.ChatTemplate, Tokenizer]:
    """The template as tokenmill takes it, and the tokenizer as transformers builds it (for phi3 not the
    tokenizer.json as written: transformers 5 rebuilds Llama's pre-tokenizer, and every conversation's ids differ)."""
    directory, source = TEMPLATES[name]
    tokenizer = Tokenizer.from_str(reference[directory].backend_tokenizer.to_str())
    variables = chat.special_tokens(json.loads((directory / "tokenizer_config.json").read_text()))
    return chat.ChatTemplate.probe(name, source, variables, tokenizer, TODAY), tokenizer


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_the_text_and_ids_are_apply_chat_templates(name, reference):
    same_as_transformers(name, reference, conversations())


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TEMPLATES))
def test_every_conversation_of_the_corpora_renders_and_encodes_as_in_transformers(name, reference):
    same_as_transformers(name, reference, conversations(None))


def same_as_transformers(name: str, reference, sample: list[list[dict]]) -> None:
    template, tokenizer = ours(name, reference)
    theirs = reference[TEMPLATES[name][0]]
    for messages in sample:
        text = chat.render(template.template, messages, template.variables)
        assert text == theirs.apply_chat_template(messages, chat_template=TEMPLATES[name][1], tokenize=False)
        ids = theirs.apply_chat_template(messages, chat_template=TEMPLATES[name][1], tokenize=True)["input_ids"]
        assert tokenizer.encode(text, add_special_tokens=False).ids == ids


def test_the_assistant_spans_found_without_tags_give_the_mask_transformers_gets_from_them(reference):
    """phi3's template has no tags, its TRL twin wraps each assistant content and end-of-turn (and the final EOS) in
    them: the mask found in the first is the mask transformers computes from the second, on every conversation."""
    template, tokenizer = ours("phi3", reference)
    assert template.end_of_turn == "<|end|>\n"
    for messages in conversations():
        ids, mask, _ = chat.encode(tokenizer, chat.render_with_spans(template, messages))
        tagged = reference[PHI3].apply_chat_template(
            messages, chat_template=TEMPLATES["phi3_training"][1], tokenize=True, return_assistant_tokens_mask=True
        )
        assert ids.tolist() == tagged["input_ids"]
        assert mask.tolist() == tagged["assistant_masks"]
        assert 0 < mask.sum() < len(mask)


@functools.cache
def tagged_template(name: str) -> str:
    """The template with `{% generation %}` tags around each assistant content and its end-of-turn, from which
    transformers computes its assistant mask: TRL's phi3_training.jinja for phi3; for Granite, which has none, its
    template with the assistant's line so tagged (the same text: the tests check it)."""
    if name == "phi3":
        return (PHI3 / "phi3_training.jinja").read_text()
    line = "    {{- '<|start_of_role|>' + message['role'] + '<|end_of_role|>' + message['content'] + "
    line += "'<|end_of_text|>\\n' }}\n"
    assistant = (
        "    {%- if message['role'] == 'assistant' %}\n"
        "        {{- '<|start_of_role|>assistant<|end_of_role|>' }}\n"
        "        {%- generation %}{{- message['content'] + '<|end_of_text|>\\n' }}{%- endgeneration %}\n"
        "    {%- else %}\n" + line + "    {%- endif %}\n"
    )
    assert TEMPLATES["granite"][1].count(line) == 1
    return TEMPLATES["granite"][1].replace(line, assistant)


def transformers_mask(name: str, reference, messages: list[dict], tools=None) -> tuple[list[int], np.ndarray]:
    """apply_chat_template's ids and assistant mask, with the tagged template."""
    theirs = reference[TEMPLATES[name][0]].apply_chat_template(
        messages,
        tools=tools,
        chat_template=tagged_template(name),
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    return theirs["input_ids"], np.asarray(theirs["assistant_masks"], dtype=np.uint8)


def wrong_masks(mask: np.ndarray) -> list[np.ndarray]:
    """Masks that are not `mask`: all ones, shifted by a token either way, and each run of ones a token longer or
    shorter at either end."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    wrong = [np.ones_like(mask), np.roll(mask, 1), np.roll(mask, -1)]
    for start, stop in zip(edges[::2], edges[1::2], strict=True):
        for index, value in ((start - 1, 1), (stop, 1), (start, 0), (stop - 1, 0)):
            if 0 <= index < len(mask):
                planted = mask.copy()
                planted[index] = value
                wrong.append(planted)
    return [planted for planted in wrong if not np.array_equal(planted, mask)]


def turn(user: str, *answers: str) -> list[dict]:
    return [{"role": "user", "content": user}, *({"role": "assistant", "content": a} for a in answers)]


EDGES = [  # what real conversations hold and a check by decoding got wrong
    turn("Can you help?", "  Hey, sorry, I cannot."),  # begins with whitespace, which phi3's tokens around absorb
    turn("Can you help?", "Sure.  \n"),  # ends with it
    turn("And then?", "I write <|end|> and then stop"),  # a special token's text followed by a space
    turn("And then?", "I write <|end_of_text|> and then stop"),
    turn("Count.", "One.", "Two.", " Three "),  # assistant turns in a row: their masked runs touch
    [*turn("Hi", "\n\nx\n"), *turn("  again", "\t z")],
    [{"role": "system", "content": " Be brief. "}, *turn("Hi", "<|end|>", "<|endoftext|> ok")],
]


@pytest.mark.parametrize("name", ["phi3", "granite"])
def test_the_mask_check_passes_transformers_masks_and_fails_wrong_ones(name, reference):
    """The check is the documented rule (a token is in when its characters overlap a span): transformers' own
    masks pass, on conversations whose answers begin or end with whitespace, hold a special token's text, or follow
    each other, and on real ones; an all-ones, a shifted or a one-token-off mask fails."""
    template, tokenizer = ours(name, reference)
    for messages in EDGES + conversations(100):
        rendered = chat.render_with_spans(template, messages)
        ids, mask, offsets = chat.encode(tokenizer, rendered)
        their_ids, their_mask = transformers_mask(name, reference, messages)
        assert rendered.text == chat.render(compiled_tagged_template(name), messages, template.variables)
        assert ids.tolist() == their_ids and mask.tolist() == their_mask.tolist(), messages
        assert chat.mask_problems(tokenizer, rendered, ids, offsets, their_mask) == []
        planted = wrong_masks(their_mask)
        assert len(planted) >= 3 + 2 * len(rendered.spans)
        for wrong in planted:
            assert chat.mask_problems(tokenizer, rendered, ids, offsets, wrong), messages
        turns = [m["content"] for m in messages if m["role"] == "assistant"]
        assert [rendered.text[start:end] for start, end in rendered.contents] == turns  # each content, as it is


@functools.cache
def compiled_tagged_template(name: str):
    return chat.compile_template(tagged_template(name), TODAY)


def test_the_mask_check_names_the_tokens_that_are_wrong_and_what_they_decode_to(reference):
    """phi3's `<|assistant|>` absorbs the newline and the spaces an answer begins with: its characters overlap the
    answer's span, so it carries loss (as in transformers' mask), and a mask without it is named as wrong."""
    template, tokenizer = ours("phi3", reference)
    rendered = chat.render_with_spans(template, turn("Can you help?", "  Hey, sorry."))
    ids, mask, offsets = chat.encode(tokenizer, rendered)
    assert mask.tolist() == [0] * 6 + [1] * 8 and rendered.text[slice(*offsets[6])] == "<|assistant|>\n  "
    assert chat.mask_problems(tokenizer, rendered, ids, offsets, np.roll(mask, 1)) == [
        "tokens 0:1 ('<|user|>') are masked in but lie outside every span that carries loss",
        "tokens 6:7 ('<|assistant|>') are masked out but lie in a span that carries loss",
    ]
    assert chat.mask_problems(tokenizer, rendered, ids, offsets, np.ones_like(mask)) == [
        "tokens 0:6 ('<|user|>Can you help?<|end|>') are masked in but lie outside every span that carries loss"
    ]
    assert chat.mask_problems(tokenizer, rendered, ids, offsets, mask[:-1]) == ["13 mask bytes for 14 tokens"]


def every_conversation():
    """Every record of tests/data/chat's slices as a conversation (messages, tools), with its corpus's name."""
    formats = {
        "sgd-dialogues/sgd_train_messages.jsonl.gz": chat.RecordFormat(),
        "gsm8k/train.jsonl.gz": GSM8K,
        "gsm8k/test.jsonl.gz": GSM8K,
        "gpteacher-alpaca/codegen-instruct.json.gz": ALPACA,
        "gpteacher-alpaca/roleplay-simple-deduped-roleplay-instruct.json.gz": ALPACA,
        "gpteacher-alpaca/toolformer-dedupe-only-dataset.json.gz": ALPACA,
        "llamafactory-glaive-toolcall/glaive_toolcall_en_demo.json": GLAIVE,
        "llamafactory-glaive-toolcall/glaive_toolcall_zh_demo.json": GLAIVE,
        "fastchat-sharegpt/dummy_conversation.json": chat.SHAREGPT,
    }
    for path, format in formats.items():
        for record in records(path):
            yield (path, *chat.to_messages(record, format))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["phi3", "granite"])
def test_transformers_masks_pass_the_mask_check_on_every_conversation_of_the_corpora(name, reference):
    template, tokenizer = ours(name, reference)
    checked, refused = Counter(), Counter()
    for path, messages, tools in every_conversation():
        try:
            rendered = chat.render_with_spans(template, messages, tools)
        except chat.SpanError:  # phi3's template drops tool turns: such a record is quarantined by a run
            refused[path] += 1
            continue
        ids, offsets = (lambda e: (np.asarray(e.ids), np.asarray(e.offsets)))(
            tokenizer.encode(rendered.text, add_special_tokens=False)
        )
        their_ids, their_mask = transformers_mask(name, reference, messages, tools)
        assert ids.tolist() == their_ids
        assert chat.mask_problems(tokenizer, rendered, ids, offsets, their_mask) == [], (path, messages)
        checked[path] += 1
    assert sum(checked.values()) + sum(refused.values()) == 12_174 + 7_473 + 1_319 + 4_535 + 1_923 + 7_673 + 600 + 500
    assert all("glaive" in path for path in refused) and (name == "phi3" or not refused)


@pytest.mark.parametrize(("name", "backend"), [("phi3", "gigatoken"), ("granite", "hf")])
def test_a_fast_backends_ids_with_their_offsets_give_the_references_ids_and_masks(name, backend, reference):
    """The fast path: a backend's ids (gigatoken's for phi3; Granite's byte-level tokenizer, which no fast backend
    represents, with HF's ids alone), and where each token lies found from the ids alone (`TokenOffsets`), give
    the ids and masks HF tokenizers' offsets give, on every conversation and on texts made to be hard; texts whose
    tokens cannot be placed (whitespace that phi3's `<|end|>` strips, which only Unicode calls whitespace) go to
    the reference."""
    template, tokenizer = ours(name, reference)
    exact = encoders.HFEncoder(tokenizer)
    fast = encoders.new_backend(backend, tokenizer.to_str().encode())
    assert exact.token_offsets is not None
    rendered = [chat.render_with_spans(template, messages) for messages in conversations()]
    hard = [
        "Hello <|end|>  x",
        "  lead",
        "日本<|end|>\n\t <|user|> ok",
        "ꙮ 🙂 x<|end|>",
        "<|end|>",
        "a\u00a0<|end|>\u3000b",
    ]
    rendered += [chat.RenderedChat(text, [(0, len(text))], []) for text in hard]  # the whole text
    rendered += [chat.RenderedChat(text, [(1, len(text) - 1)], []) for text in hard]  # from its second character
    got = chat.encode_batch(tokenizer, rendered, fast, exact.token_offsets)
    wanted = chat.encode_batch(tokenizer, rendered)
    assert [x.tolist() for x in got] == [x.tolist() for x in wanted]
    _, tiles = exact.token_offsets.of_batch(got[0], got[1], [r.text.encode() for r in rendered])
    assert tiles[: -2 * len(hard)].all()  # no real conversation needed the reference
    untiled = [text for text, placed in zip(hard, tiles[-len(hard) :], strict=True) if not placed]
    assert untiled == (["a\u00a0<|end|>\u3000b"] if name == "phi3" else [])


def test_the_tokenizer_transformers_builds_is_kept_per_directory_and_rebuilt_when_a_file_changes(
    reference, tmp_path, monkeypatch
):
    monkeypatch.setenv("TOKENMILL_CACHE_DIR", str(tmp_path / "cache"))
    directory = tmp_path / "phi3"
    shutil.copytree(PHI3, directory)
    built = pretrained.as_transformers_builds_it(pretrained.load_pretrained(str(directory)))
    assert built.data == reference[PHI3].backend_tokenizer.to_str().encode()
    kept = list((tmp_path / "cache" / "transformers-tokenizers").iterdir())
    assert len(kept) == 1 and kept[0].read_bytes() == built.data
    kept[0].write_bytes(b"{}")  # what is kept is what a run takes
    assert pretrained.as_transformers_builds_it(pretrained.load_pretrained(str(directory))).data == b"{}"
    kept[0].chmod(0o666)  # a file another user could have written is not taken: built again (issue 58)
    assert pretrained.as_transformers_builds_it(pretrained.load_pretrained(str(directory))).data == built.data
    assert kept[0].stat().st_mode & 0o777 == 0o600
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 1}))
    again = pretrained.as_transformers_builds_it(pretrained.load_pretrained(str(directory)))
    assert again.data == built.data and len(list(kept[0].parent.iterdir())) == 2


PHI3_LIKE = "{% for m in messages %}<|{{ m['role'] }}|>\n{{ BODY }}<|end|>\n{% endfor %}{{ eos_token }}"


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("{{ m['content'] if m['role'] != 'assistant' else 'OK' }}", "an assistant content appears 0 times"),
        ("{{ m['content'] }}{{ m['content'] }}", "an assistant content appears 2 times"),
        ("{{ m['content'] | upper }}", "changes assistant message 1"),
    ],
)
def test_a_template_whose_assistant_spans_cannot_be_told_is_refused_by_name(body, why, reference):
    _, tokenizer = ours("phi3", reference)
    source = PHI3_LIKE.replace("{{ BODY }}", body)
    conversation = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    with pytest.raises(chat.SpanError, match=f"chat template broken.*{why}"):
        template = chat.ChatTemplate.probe("broken", source, {"eos_token": "<|endoftext|>"}, tokenizer, TODAY)
        chat.render_with_spans(template, conversation)


def test_a_conversation_renders_once_where_its_shape_is_known_and_is_placed_as_if_it_were_not(reference):
    """The layout of a shape of conversation is kept, so that the next one of that shape renders once. Its contents
    are placed by it only where its text is exactly that layout with them in place: a template whose text depends
    on the contents (a note after a user's question, which the sentinel, no question, does not get) is placed as
    by a template that has seen nothing."""
    _, tokenizer = ours("phi3", reference)
    body = "{{ m['content'] }}{% if m['role'] == 'user' and '?' in m['content'] %} (a question){% endif %}"
    source = PHI3_LIKE.replace("{{ BODY }}", body)

    def template() -> chat.ChatTemplate:
        return chat.ChatTemplate.probe("noting", source, {"eos_token": "<|endoftext|>"}, tokenizer, TODAY)

    seen = template()
    conversations = [
        [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        for user, answer in (("Good morning", "Hello."), ("Good evening", "Hi."), ("Hi?", "Hello."))
    ]
    first, second = (chat.render_with_spans(seen, c) for c in conversations[:2])
    assert len(seen.layouts) == 1 and [second.text[a:b] for a, b in second.contents] == ["Hi."]
    assert first == chat.render_with_spans(template(), conversations[0])
    assert second == chat.render_with_spans(template(), conversations[1])
    third = chat.render_with_spans(seen, conversations[2])  # not the layout's text: placed by its own rendering
    assert third == chat.render_with_spans(template(), conversations[2])
    assert third.text.startswith("<|user|>\nHi? (a question)<|end|>")
    assert third.text[slice(*third.contents[0])] == "Hello."


def test_a_message_the_template_drops_is_refused_not_left_out(reference):
    """phi3's template renders no `tool` message: the function's result would be silently missing."""
    template, _ = ours("phi3", reference)
    call = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "get_weather()"}]
    conversation = [*call, {"role": "tool", "content": "sunny"}, {"role": "assistant", "content": "Sunny."}]
    with pytest.raises(chat.SpanError, match=r"chat template phi3 renders message 2 \(tool\) 0 times, not once"):
        chat.render_with_spans(template, conversation)


def test_a_template_that_ends_no_turn_is_refused(reference):
    _, tokenizer = ours("phi3", reference)
    source = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{% endfor %}"
    with pytest.raises(chat.SpanError, match="chat template endless writes nothing that ends an assistant turn"):
        chat.ChatTemplate.probe("endless", source, {}, tokenizer, TODAY)


@pytest.mark.parametrize(
    ("messages", "said"),
    [
        ({"role": "user"}, r"^'messages' is an object, not a list of turns$"),
        ([], r"^'messages' is an empty list: no turns$"),
        (["hi"], r"^messages\[0\] is a string \('hi'\), not a turn \(\{role, content\}\)$"),
        ([{"content": "hi"}], r"^messages\[0\]: no 'role'$"),
        ([{"role": "user"}], r"^messages\[0\]: no 'content'$"),
        ([{"role": "robot", "content": "hi"}], r"^messages\[0\]: unknown role 'robot'"),
        ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": 3}], r"\[1\]: content is a number,"),
        ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}], r"\[1\]: content is null,"),
        ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": " "}], r"\[1\]: an empty assistant"),
        ([{"role": "user", "content": "hi"}], "no assistant turn"),
    ],
)
def test_messages_that_make_no_conversation_are_refused_naming_the_message(messages, said):
    with pytest.raises(chat.ChatError, match=said):
        chat.checked(messages)


def test_a_template_that_raises_on_a_record_names_itself_and_the_error(reference):
    template, _ = ours("phi3", reference)
    refusing = chat.ChatTemplate("strict", "{{ raise_exception('no system role here') }}", {}, template.end_of_turn)
    with pytest.raises(chat.ChatError, match="chat template strict refused the record: .*no system role here"):
        chat.render_with_spans(refusing, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}])


def test_records_of_every_layout_become_conversations_by_their_field_names():
    """Alpaca's instruction/input/response and gsm8k's question/answer as a user's prompt and the assistant's
    completion, ShareGPT's from/value turns with their roles renamed, and glaive's tools, for every record."""
    code = records("gpteacher-alpaca/codegen-instruct.json.gz")
    for record in code:
        messages, tools = chat.to_messages(record, ALPACA)
        prompt = record["instruction"] + (f"\n\n{record['input']}" if record["input"] else "")
        assert messages == [{"role": "user", "content": prompt}, {"role": "assistant", "content": record["response"]}]
        assert tools is None
    for record in records("gsm8k/test.jsonl.gz"):
        assert [m["content"] for m in chat.to_messages(record, GSM8K)[0]] == [record["question"], record["answer"]]
    sharegpt = records("fastchat-sharegpt/dummy_conversation.json")
    for record in sharegpt:
        messages, _ = chat.to_messages(record, chat.SHAREGPT)
        assert [m["content"] for m in messages] == [turn["value"] for turn in record["conversations"]]
        assert {m["role"] for m in messages} == {"user", "assistant"}
    for record in records("llamafactory-glaive-toolcall/glaive_toolcall_en_demo.json"):
        messages, tools = chat.to_messages(record, GLAIVE)
        assert tools == json.loads(record["tools"]) and {m["role"] for m in messages} <= {"user", "assistant", "tool"}


def test_tool_calls_render_with_a_template_that_takes_them(reference):
    """Granite's template renders the tools and every tool turn: its spans and mask check hold on glaive's calls."""
    template, tokenizer = ours("granite", reference)
    for record in records("llamafactory-glaive-toolcall/glaive_toolcall_en_demo.json", 100):
        messages, tools = chat.to_messages(record, GLAIVE)
        rendered = chat.render_with_spans(template, messages, tools)
        ids, mask, offsets = chat.encode(tokenizer, rendered)
        assert (
            ids.tolist()
            == reference[GRANITE].apply_chat_template(
                messages, tools=tools, chat_template=TEMPLATES["granite"][1], tokenize=True
            )["input_ids"]
        )
        assert chat.mask_problems(tokenizer, rendered, ids, offsets, mask) == []


@pytest.mark.parametrize(
    ("record", "format", "said"),
    [
        ({"instruction": "Add.", "response": 3}, ALPACA, "^'response' is a number, not a string: the assistant's"),
        ({"instruction": "Add.", "response": " "}, ALPACA, "^'response' is empty or only whitespace: the assistant"),
        ({"instruction": "Add."}, ALPACA, "^no 'response' \\(a string\\): the assistant's turn$"),
        ({"instruction": "Add.", "input": ["1", "2"], "response": "3"}, ALPACA, "'input' is a list, not a string"),
        ({"answer": "3"}, GSM8K, "^no 'question' \\(a string\\): the user's turn$"),
        ({"text": "hi"}, chat.RecordFormat(), "^no 'messages' \\(a list of turns\\)$"),
        ({"messages": "hi"}, chat.RecordFormat(), "^'messages' is a string \\('hi'\\), not a list of turns$"),
        ({"messages": {"role": "user"}}, chat.RecordFormat(), "^'messages' is an object, not a list of turns$"),
        ({"conversations": [{"from": "human"}]}, chat.SHAREGPT, "^conversations\\[0\\]: no 'value'$"),
        (
            {"conversations": [{"from": "bot", "value": "hi"}]},
            chat.SHAREGPT,
            "conversations\\[0\\]: unknown role 'bot'",
        ),
        ({"conversations": [{"from": "gpt", "value": "hi"}], "tools": "[{"}, GLAIVE, "'tools' is not JSON"),
    ],
)
def test_a_record_that_makes_no_conversation_is_refused_naming_its_field(record, format, said):
    with pytest.raises(chat.ChatError, match=said):
        chat.to_messages(record, format)


def test_real_conversations_packed_carry_the_objective_they_carry_unpacked(reference):
    """phi3's conversations with their assistant masks, packed best-fit into 2,048-token rows: the same targets,
    each with the token before it and its place in its conversation, as unpacked."""
    template, tokenizer = ours("phi3", reference)
    encoded = [chat.encode(tokenizer, chat.render_with_spans(template, m))[:2] for m in conversations()]
    encoded = [(ids, mask) for ids, mask in encoded if len(ids) <= 2048]
    tokens, masks = np.concatenate([ids for ids, _ in encoded]), np.concatenate([mask for _, mask in encoded])
    lengths = np.array([len(ids) for ids, _ in encoded])
    rows = pack_conversations(tokens, masks, lengths, 2048, pad_id=tokenizer.token_to_id("<|endoftext|>"))
    packed = sum(map(targets, np.asarray(rows.packed.rows), rows.loss, rows.positions), Counter())
    assert len(encoded) > 800 and packed == unpacked_targets(tokens, masks, lengths)
    assert rows.packed.real_tokens / rows.packed.rows.size > 0.95


def test_a_changed_template_makes_another_version_and_other_shards(reference):
    """Another template text (TRL's phi3_training.jinja: phi3's with {% generation %} tags): the tokenized shards'
    key and the published version both change with it, whatever the tokens turn out to be."""
    from types import SimpleNamespace

    from tokenmill.config import TokenmillConfig
    from tokenmill.core.commits import tokenize_key
    from tokenmill.stages.publish import dataset_version
    from tokenmill.tokenizers.tokenizer_info import TokenizerInfo

    template, _ = ours("phi3", reference)
    jinja = dataclasses.replace(template, source=(PHI3 / "phi3_training.jinja").read_text())
    config = TokenmillConfig.model_validate(
        {"name": "c", "input": {"paths": ["c.jsonl"], "chat": {}}, "tokenizer": {"path": str(PHI3)},
         "output": {"path": "/tmp/c"}}
    )  # fmt: skip
    plan = SimpleNamespace(shards=[], inputs="the same input")
    infos = [TokenizerInfo("0" * 64, 32011, 32000, False, chat=(("", t),)) for t in (template, jinja)]
    assert len({dataset_version(config, plan, info) for info in infos}) == 2
    assert len({tokenize_key(config, info) for info in infos}) == 2
