"""Pretrained tokenizer sources, each turned into one HF `tokenizer.json` and the tokenizer's own EOS/BOS.

A source is a `tokenizer.json` file; a directory holding one (HF layout, whose `tokenizer_config.json` or
`special_tokens_map.json` names the EOS/BOS tokens); a tiktoken rank file (converted, see
`tiktoken_convert`); or `hf:org/name`, fetched with huggingface_hub into its cache (or found there offline).
Local paths may be fsspec URLs (s3://...). Every failure names the source and says what to do.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import fsspec
import orjson
from tokenizers import Tokenizer

from tokenmill.config import HubConfig, TiktokenConfig
from tokenmill.tokenizers import tiktoken_convert
from tokenmill.tokenizers.encoders import package_version, read_cached, write_cached
from tokenmill.tokenizers.tiktoken_convert import Preset, is_rank_file, rank_file_preset, rank_file_to_tokenizer_json

HUB_PREFIX = "hf:"
HF_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx")  # not read for a tokenizer
# Names that mean end / beginning of a document in common vocabularies, most specific first.
EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "<｜end▁of▁sentence｜>")
BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "<|bos|>", "<|startoftext|>", "<｜begin▁of▁sentence｜>")


@dataclass(frozen=True)
class Pretrained:
    data: bytes  # the tokenizer.json
    eos: str | None  # the tokenizer's own end-of-sequence token, where the source says
    bos: str | None
    origin: str  # the source as configured, for messages
    parsed: Tokenizer | None = field(default=None, compare=False, repr=False)  # `data`, as HF tokenizers read it
    directory: str | None = None  # where it came from, when a HF tokenizer directory (its chat template is there)


class TokenizerSourceError(ValueError):
    """A tokenizer source that cannot be used; the message names it and says what to do."""


def load_pretrained(source: str, hub: HubConfig | None = None, tiktoken: TiktokenConfig | None = None) -> Pretrained:
    """The tokenizer at `source` (any of the kinds in the module docstring) as a tokenizer.json."""
    hub, tiktoken = hub or HubConfig(), tiktoken or TiktokenConfig()
    if source.startswith(HUB_PREFIX):
        return _from_directory(download_from_hub(source[len(HUB_PREFIX) :], hub), source)
    fs, path = fsspec.core.url_to_fs(source)
    if not fs.exists(path):
        raise TokenizerSourceError(f"tokenizer {source!r}: no such file or directory")
    if fs.isdir(path):
        return _from_directory(source, source)
    with fs.open(path, "rb") as f:
        data = f.read()
    if is_rank_file(data):
        try:
            converted, preset = _rank_file_converted(data, source, tiktoken)
        except Exception as e:  # a bad pattern surfaces from the Rust regex engine as a bare Exception
            raise TokenizerSourceError(f"tokenizer {source!r}: cannot convert the tiktoken rank file: {e}") from e
        return Pretrained(converted, preset.eos, preset.bos, source)
    tokenizer = parse_tokenizer_json(data, source)
    return Pretrained(data, *own_special_tokens(tokenizer, orjson.loads(data)), source, tokenizer)


def _rank_file_converted(data: bytes, source: str, tiktoken: TiktokenConfig) -> tuple[bytes, Preset]:
    """`rank_file_to_tokenizer_json`, kept in the user's cache by the rank file, the pattern and special tokens, the
    conversion's code and tokenizers' version: converting a large vocabulary takes seconds (o200k's 2.8 s, cl100k's
    1.4 s), and a run converted it twice, in the flow's process and in the cluster's forkserver."""
    preset = rank_file_preset(data, source, tiktoken.pattern, tiktoken.special_tokens)
    key = hashlib.sha256(orjson.dumps([preset.pattern, preset.special_tokens, package_version("tokenizers")]))
    for part in (data, Path(tiktoken_convert.__file__).read_bytes()):
        key.update(hashlib.sha256(part).digest())
    name = f"{key.hexdigest()[:24]}.json"
    if (converted := read_cached("tiktoken-tokenizers", name)) is None:
        converted = rank_file_to_tokenizer_json(data, source, preset)
        write_cached("tiktoken-tokenizers", name, converted)
    return converted, preset


def parse_tokenizer_json(data: bytes, source: str) -> Tokenizer:
    try:
        return Tokenizer.from_str(data.decode())
    except Exception as e:  # tokenizers raises a bare Exception on a malformed file
        raise TokenizerSourceError(
            f"tokenizer {source!r} is neither a tokenizer.json nor a tiktoken rank file ({str(e)[:200]})"
        ) from e


def _from_directory(directory: str, source: str) -> Pretrained:
    """A HF tokenizer directory: tokenizer.json, and the EOS/BOS named by its config files."""
    fs, path = fsspec.core.url_to_fs(directory)
    files = {name: f"{path.rstrip('/')}/{name}" for name in HF_FILES}
    if not fs.exists(files["tokenizer.json"]):
        raise TokenizerSourceError(
            f"tokenizer {source!r}: the directory has no tokenizer.json (only the fast tokenizer format is read; "
            "convert slow tokenizers with transformers first)"
        )
    with fs.open(files["tokenizer.json"], "rb") as f:
        data = f.read()
    tokenizer = parse_tokenizer_json(data, source)
    eos, bos = None, None
    for name in ("tokenizer_config.json", "special_tokens_map.json"):  # the first that names one wins
        if fs.exists(files[name]):
            with fs.open(files[name], "rb") as f:
                config = json.load(f)
            eos = eos or _token_content(config.get("eos_token"))
            bos = bos or _token_content(config.get("bos_token"))
    own_eos, own_bos = own_special_tokens(tokenizer, orjson.loads(data))
    return Pretrained(data, eos or own_eos, bos or own_bos, source, tokenizer, directory)


def as_transformers_builds_it(pretrained: Pretrained) -> Pretrained:
    """The tokenizer as transformers' AutoTokenizer builds it from the directory, which is what a chat template's
    ids are compared with: transformers 5 rebuilds some pipelines rather than read tokenizer.json as written (for
    Llama-style tokenizers such as phi3's, every conversation's ids differ). Needs transformers (the chat extra).
    Built once per directory's files and transformers' version, then kept in the user's cache."""
    if pretrained.directory is None:
        raise TokenizerSourceError(
            f"tokenizer {pretrained.origin!r}: a chat input needs the model's tokenizer directory (tokenizer.json with "
            "its tokenizer_config.json) or hf:org/name, not a single file"
        )
    if importlib.util.find_spec("transformers") is None:
        raise TokenizerSourceError(
            "a chat input needs transformers, to build the tokenizer as the model's trainers do: "
            "pip install -e '.[chat]'"
        )
    fs, path = fsspec.core.url_to_fs(pretrained.directory)
    files = sorted(f for f in fs.find(path) if not f.endswith(WEIGHTS))
    key = hashlib.sha256(orjson.dumps([package_version("transformers"), package_version("tokenizers")]))
    for file in files:
        key.update(orjson.dumps([file.removeprefix(path), hashlib.sha256(fs.cat_file(file)).hexdigest()]))
    name = f"{key.hexdigest()[:24]}.json"
    exported = read_cached("transformers-tokenizers", name)  # only a file of this user's that no one else can write
    if exported is None:
        # In a process of its own, without torch: transformers imports it where it is installed (seconds), and
        # building a tokenizer never uses it.
        build = "import sys; sys.modules['torch'] = None; from transformers import AutoTokenizer; " + (
            "sys.stdout.write(AutoTokenizer.from_pretrained(sys.argv[1]).backend_tokenizer.to_str())"
        )
        command = [sys.executable, "-P", "-c", build, pretrained.directory]  # -P: not the working directory's modules
        built = subprocess.run(command, capture_output=True, text=True)
        if built.returncode != 0:
            said = (built.stderr.strip().splitlines() or [f"exit status {built.returncode}"])[-1]
            raise TokenizerSourceError(f"tokenizer {pretrained.origin!r}: transformers cannot build it: {said}")
        exported = built.stdout.encode()
        write_cached("transformers-tokenizers", name, exported)
    return Pretrained(exported, pretrained.eos, pretrained.bos, pretrained.origin, None, pretrained.directory)


def chat_template_source(pretrained: Pretrained, template_file: str | None) -> tuple[str, str, dict]:
    """(its name for messages, the template's text, the tokenizer_config.json it is rendered with): `template_file`,
    or the chat_template of the directory's tokenizer_config.json (its "default" where it holds several)."""
    config = {}
    if pretrained.directory is not None:
        fs, path = fsspec.core.url_to_fs(pretrained.directory)
        if fs.exists(f"{path.rstrip('/')}/tokenizer_config.json"):
            with fs.open(f"{path.rstrip('/')}/tokenizer_config.json", "rb") as f:
                config = json.load(f)
    if template_file is not None:
        try:
            with fsspec.open(template_file, "r", encoding="utf-8") as f:
                return template_file, f.read(), config
        except FileNotFoundError:
            raise TokenizerSourceError(f"input.chat.template {template_file!r}: no such file") from None
    template = config.get("chat_template")
    if isinstance(template, list):  # [{name, template}, ...] as transformers saves several
        template = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}.get("default")
    if not isinstance(template, str):
        raise TokenizerSourceError(
            f"tokenizer {pretrained.origin!r}: its tokenizer_config.json has no chat_template; name a .jinja file "
            "in input.chat.template"
        )
    return f"{pretrained.origin} (tokenizer_config.json)", template, config


def _token_content(value) -> str | None:
    """`"</s>"` or `{"content": "</s>", ...}` (an AddedToken as transformers saves it)."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def own_special_tokens(tokenizer: Tokenizer, spec: dict) -> tuple[str | None, str | None]:
    """(EOS, BOS) of a bare tokenizer.json: the special tokens its post-processor template puts after and
    before a sequence, else special tokens with a conventional name."""
    eos, bos = _template_tokens(spec.get("post_processor"))
    specials = {t["content"] for t in spec.get("added_tokens", []) if t.get("special")}
    eos = eos or next((n for n in EOS_NAMES if n in specials), None)
    bos = bos or next((n for n in BOS_NAMES if n in specials), None)
    return eos, bos


def _template_tokens(processor: dict | None) -> tuple[str | None, str | None]:
    if not processor:
        return None, None
    if processor.get("type") == "Sequence":
        found = [_template_tokens(p) for p in processor.get("processors", [])]
        return next((e for e, _ in found if e), None), next((b for _, b in found if b), None)
    if processor.get("type") != "TemplateProcessing":
        return None, None
    pieces = processor.get("single", [])
    at = next((i for i, p in enumerate(pieces) if "Sequence" in p), None)
    if at is None:
        return None, None
    before = [p["SpecialToken"]["id"] for p in pieces[:at] if "SpecialToken" in p]
    after = [p["SpecialToken"]["id"] for p in pieces[at + 1 :] if "SpecialToken" in p]
    return (after[0] if after else None), (before[-1] if before else None)


def download_from_hub(repo_id: str, hub: HubConfig) -> str:
    """The local snapshot directory of a hub repo's tokenizer files: downloaded, or from the cache when
    the hub cannot be reached (or `hub.offline`). Without network and cache it fails at once."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    offline = hub.offline or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    try:
        return snapshot_download(
            repo_id,
            revision=hub.revision,
            cache_dir=hub.cache_dir,
            token=os.environ.get(hub.token_env) or False,
            allow_patterns=list(HF_FILES),
            local_files_only=offline,
            etag_timeout=hub.timeout,
        )
    except (LocalEntryNotFoundError, OSError) as e:
        cache = hub.cache_dir or "the default huggingface_hub cache"
        how = "offline mode is on" if offline else "the Hugging Face hub cannot be reached"
        raise TokenizerSourceError(
            f"tokenizer 'hf:{repo_id}': {how} and {cache} holds no copy of it"
            f"{'' if hub.revision is None else f' at revision {hub.revision!r}'}; pass a local path instead "
            "(tokenizer.path: a tokenizer.json or a directory holding one)"
        ) from e
    except HfHubHTTPError as e:  # not found, gated, unauthorised
        raise TokenizerSourceError(f"tokenizer 'hf:{repo_id}': {e}") from e
