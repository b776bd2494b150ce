"""The configuration reference, docs/configuration.md, generated from `TokenmillConfig`.

Every field of the model and of every section under it (nested sections, optional ones, lists of them such as
`sources`) with its type, default and the description of its pydantic `Field`; a section's class docstring is
its introduction. A section class used at several places (`StorageConfig`) is described once, where it first
appears, and linked from the others. `tests/test_docs.py` checks that the committed page is what this writes:

    python -m tokenmill.commands.config_reference > docs/configuration.md

Fields without a description are listed on stderr (the page keeps their row, with an empty description).
"""

from __future__ import annotations

import html
import inspect
import json
import re
import sys
import types
import typing
from dataclasses import dataclass, field

import annotated_types
from pydantic import BaseModel, ByteSize, SecretStr
from pydantic.fields import FieldInfo

from tokenmill.config import TokenmillConfig

COMMAND = "python -m tokenmill.commands.config_reference > docs/configuration.md"

INTRO = f"""\
# Configuration reference

A run is configured by one YAML file, validated by the pydantic model `tokenmill.config.TokenmillConfig`, which
is also the flow's parameter (the Prefect UI shows it as a form). `tokenmill check CONFIG.yaml` prints a config
with every default filled in; `tokenmill run CONFIG.yaml --set pack.seq_len=4096` overrides any key (the value
is YAML). Unknown keys are refused. `output` and `dask` say where a dataset is written and computed: they are
not part of its identity (the manifest's `dataset_hash` covers the rest).

Generated from the model; do not edit by hand. To change it, edit the `Field` descriptions and the sections'
docstrings in `tokenmill/config.py`, then run `{COMMAND}`.
"""

_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}
_BOUNDS = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}


@dataclass
class Section:
    """One model class as the page shows it: the key path it is described at, and the others that use it."""

    model: type[BaseModel]
    path: str
    also: list[str] = field(default_factory=list)

    @property
    def anchor(self) -> str:
        return slug(self.path)


def slug(heading: str) -> str:
    """The anchor both GitHub and MkDocs give a heading made of words and punctuation (`input.storage`)."""
    return re.sub(r"[\s-]+", "-", re.sub(r"[^\w\s-]", "", heading).strip().lower())


def sections(root: type[BaseModel] = TokenmillConfig) -> dict[type[BaseModel], Section]:
    """Every model class under `root`, in the order a reader meets them (depth first), each at its first path."""
    found: dict[type[BaseModel], Section] = {}

    def walk(model: type[BaseModel], path: str) -> None:
        if model in found:
            found[model].also.append(path)
            return
        found[model] = Section(model, path)
        for name, info in model.model_fields.items():
            for sub, suffix in _models_in(info.annotation):
                walk(sub, f"{path}.{name}{suffix}" if path else f"{name}{suffix}")

    walk(root, "")
    return found


def _models_in(annotation) -> list[tuple[type[BaseModel], str]]:
    """The model classes a field's type holds, each with the suffix its key path takes (`[]` in a list)."""
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return [(annotation, "")]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _models_in(args[0])
    if origin in (list, tuple, set, frozenset):
        return [(m, "[]" + s) for a in args if a is not Ellipsis for m, s in _models_in(a)]
    if origin is dict:
        return [(m, "[key]" + s) for m, s in _models_in(args[1])] if len(args) == 2 else []
    return [found for a in args for found in _models_in(a)]


def type_text(annotation, index: dict[type[BaseModel], Section]) -> str:
    """A field's type in words, sections linked: `list of [SourceConfig](#sources) or null`."""
    if annotation in _SCALARS:
        return _SCALARS[annotation]
    if annotation is ByteSize:
        return "bytes (`64MB`, `1GiB` or a number)"
    if annotation is SecretStr:
        return "secret string"
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{index[annotation].anchor})" if annotation in index else annotation.__name__
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_text(args[0], index)
    if origin is typing.Literal:
        return "one of " + ", ".join(code(v) for v in args) if len(args) > 1 else code(args[0])
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_text(a, index) for a in args)
    if origin in (list, tuple, set, frozenset):
        return "list of " + " or ".join(type_text(a, index) for a in args if a is not Ellipsis)
    if origin is dict:
        return f"mapping of {type_text(args[0], index)} to {type_text(args[1], index)}" if args else "mapping"
    return code(getattr(annotation, "__name__", str(annotation)))


def constraints(info: FieldInfo) -> str:
    """The bounds and patterns pydantic checks: `≥ 1`, `at least 1 item`, `matching ^[A-Z]...$`."""
    said = []
    for item in info.metadata:
        for bound, sign in _BOUNDS.items():
            if isinstance(item, annotated_types.BaseMetadata) and getattr(item, bound, None) is not None:
                said.append(f"{sign} {getattr(item, bound)}")
        if isinstance(item, annotated_types.MinLen) and item.min_length:
            said.append(f"at least {item.min_length} item" + "s" * (item.min_length != 1))
        if isinstance(item, annotated_types.MaxLen):
            said.append(f"at most {item.max_length}")
        if pattern := getattr(item, "pattern", None):
            said.append(f"matching {code(pattern)}")
    return ", ".join(said)


def default_text(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "its defaults" if value == type(value)() else code(value.model_dump_json())
    if isinstance(value, ByteSize):
        return code(_bytes(int(value)))
    if isinstance(value, SecretStr):
        return code("**********")
    if isinstance(value, str):
        return code(value)
    return code(json.dumps(value, ensure_ascii=False))


def _bytes(n: int) -> str:
    """A byte count as a config would write it: `50MB` for 50,000,000 (ByteSize reads it back the same)."""
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if n and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def code(value) -> str:
    """A code span that renders alike on GitHub and in MkDocs, in a table cell too: a pipe, which GitHub's
    tables split on inside backticks and Python-Markdown's show escaped, goes as an HTML entity."""
    text = str(value)
    if "|" in text or "`" in text:
        return "<code>" + html.escape(text).replace("|", "&#124;").replace("`", "&#96;") + "</code>"
    return f"`{text}`"


def prose(text: str | None) -> str:
    """A description or docstring as one Markdown paragraph: its code spans kept, and outside them the
    characters a table or Markdown would take for markup (`<name>` as an HTML tag) escaped."""
    if not text:
        return ""
    text = " ".join(inspect.cleandoc(text).split())
    parts = re.split(r"(`[^`]*`)", text)
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace("|", "\\|").replace("*", "\\*")
    return "".join(parts)


def _docstring(model: type[BaseModel]) -> str | None:
    return model.__dict__.get("__doc__")  # not BaseModel's or a base section's


def _description(info: FieldInfo) -> str | None:
    """A field's description; for a section without one, the first sentence of its class docstring."""
    if info.description:
        return info.description
    for model, _ in _models_in(info.annotation):
        if doc := _docstring(model):
            return re.split(r"(?<=\.)\s", " ".join(doc.split()), maxsplit=1)[0]
    return None


def reference(root: type[BaseModel] = TokenmillConfig) -> str:
    """The whole page."""
    index = sections(root)
    out = [INTRO]
    for section in index.values():
        model = section.model
        title = "The whole file" if not section.path else section.path
        out.append(f"## {title}\n")
        if intro := prose(_docstring(model)):
            out.append(intro + "\n")
        used = f"`{model.__name__}`"
        if section.also:
            used += "; the same section at " + ", ".join(f"`{p}`" for p in section.also)
        out.append(f"*{used}.*\n" if section.path else f"*The top level of the file: {used}.*\n")
        out.append("| key | type | default | description |")
        out.append("|---|---|---|---|")
        for name, info in model.model_fields.items():
            kind = type_text(info.annotation, index)
            if limits := constraints(info):
                kind += f", {limits}"
            out.append(f"| `{name}` | {kind} | {default_text(info)} | {prose(_description(info))} |")
        out.append("")
    return "\n".join(out)


def undocumented(root: type[BaseModel] = TokenmillConfig) -> tuple[list[str], list[str]]:
    """The key paths of fields without a description of their own, and the sections without a docstring."""
    found = sections(root).values()
    fields = [
        f"{s.path}.{name}" if s.path else name
        for s in found
        for name, info in s.model.model_fields.items()
        if not info.description
    ]
    return fields, [f"{s.path} ({s.model.__name__})" for s in found if s.path and not _docstring(s.model)]


def main() -> None:
    sys.stdout.write(reference())
    fields, models = undocumented()
    if fields:
        print(f"fields without a description ({len(fields)}): {', '.join(fields)}", file=sys.stderr)
    if models:
        print(f"sections without a docstring ({len(models)}): {', '.join(models)}", file=sys.stderr)


if __name__ == "__main__":
    main()
