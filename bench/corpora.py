"""Benchmark corpora that are not Wikipedia, built from what the package registries serve, so that anyone can
rebuild them: unique text with the file-size distributions real corpora have.

- `code`: the Linux kernel's source tree as Debian packages it (`linux-source-6.1`), one JSONL record per text
  file: about 1.5 GB of C, headers, scripts and docs; median file 4 KB, a hundred files over 1 MB, the largest
  (generated register headers) over 20 MB.
- `prose`: the largest unique prose the Debian archive's main component holds: the kernel's own documentation
  (`Documentation/`, reStructuredText), the Python documentation's sources (`python3.11-doc`), the HTML manuals of
  Rust, Racket, SageMath, pandas, Django, PostgreSQL and cppreference, Perl's, the Debian Administrator's Handbook
  and the Debian Reference (HTML pages as text, scripts and styles left out), the help of LibreOffice and of GIMP in
  every language Debian packages, the manual pages in every language (groff markup kept, as a crawler would keep it),
  the fortunes; then ../shared's prose corpora (Wikipedia, WikiText, web pages) where they are there. Only pages:
  a package's scripts, styles, images and data files are left out.
- `books`: prose's texts, each source's joined in their order into documents of 0.3 to 4 MB: the same text as a
  corpus of books has it, in long documents.

Each record is `{"id", "text", "source"}`; ids are unique, texts are not repeated. Packages are fetched with
`apt-get download` into `--cache` (once), and nothing is installed.

    python bench/corpora.py code  /tmp/corpora/code.jsonl
    python bench/corpora.py prose /tmp/corpora/prose.jsonl
    python bench/corpora.py books /tmp/corpora/books.jsonl
    python bench/corpora.py code /tmp/corpora/code-12mb.jsonl --most-mb 12   # a small run's: its first 12 MB
"""

from __future__ import annotations

import argparse
import gzip
import html.parser
import io
import itertools
import multiprocessing
import random
import re
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
KERNEL = "linux-source-6.1"
PROSE_PACKAGES = (
    "python3.11-doc", "rust-doc", "racket-doc", "sagemath-doc", "python-pandas-doc", "python-django-doc",
    "postgresql-doc-15", "cppreference-doc-en-html", "perl-doc", "debian-handbook", "debian-reference-en",
)  # fmt: skip
PROSE_FAMILIES = ("libreoffice-help-", "gimp-help-", "manpages", "fortunes")  # every language of each
NOT_PAGES = (".js", ".css", ".svg", ".json", ".xml", ".map", ".rktd", ".sxref", ".devhelp2", ".ipynb", ".index")
SHARED_PROSE = ("enwiki_slice", "wikitext", "web_scrapinghub_aeb", "web_dclm_annotated", "web_trafilatura_pages")


def downloaded(package: str, cache: Path) -> Path:
    """The package's .deb in `cache`, fetched with apt-get download the first time."""
    cache.mkdir(parents=True, exist_ok=True)
    if not (found := sorted(cache.glob(f"{package}_*.deb"))):
        subprocess.run(["apt-get", "download", "-q", package], cwd=cache, check=True)
        found = sorted(cache.glob(f"{package}_*.deb"))
    return found[-1]


def deb_members(deb: Path) -> Iterator[tarfile.TarInfo | tuple[str, bytes]]:
    """(path, bytes) of every regular file in the .deb's data archive (dpkg-deb streams it)."""
    with subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE) as dpkg:
        with tarfile.open(fileobj=dpkg.stdout, mode="r|") as archive:
            for member in archive:
                if member.isfile():
                    yield member.name, archive.extractfile(member).read()


def text_of(data: bytes) -> str | None:
    """The file as text, or None for a binary file (NUL bytes, or not UTF-8)."""
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


class _Text(html.parser.HTMLParser):
    """An HTML page's text, its scripts and styles left out."""

    def __init__(self):
        super().__init__()
        self.parts, self.skipping = [], 0

    def handle_starttag(self, tag, attrs):
        self.skipping += tag in ("script", "style")

    def handle_endtag(self, tag):
        self.skipping -= tag in ("script", "style") and self.skipping > 0
        if tag in ("p", "div", "li", "h1", "h2", "h3", "h4", "pre", "tr", "br", "title"):
            self.parts.append("\n")

    def handle_data(self, data):
        if not self.skipping:
            self.parts.append(data)


def html_text(page: str) -> str:
    parser = _Text()
    parser.feed(page)
    return re.sub(r"\n\s*\n+", "\n\n", "".join(parser.parts)).strip()


def kernel_files(cache: Path) -> Iterator[tuple[str, str]]:
    """(path, text) of every text file of the kernel's source tarball, inside the package."""
    for name, data in deb_members(downloaded(KERNEL, cache)):
        if name.endswith(".tar.xz"):
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:xz") as source:
                for member in source:
                    if member.isfile() and (text := text_of(source.extractfile(member).read())) is not None:
                        yield member.name, text


def code(cache: Path) -> Iterator[dict]:
    for path, text in kernel_files(cache):
        if text.strip():
            yield {"id": path, "text": text, "source": "linux"}


def prose_packages() -> list[str]:
    names = []
    for prefix in PROSE_FAMILIES:
        listed = subprocess.run(["apt-cache", "pkgnames", prefix], capture_output=True, text=True, check=True)
        names += sorted(listed.stdout.split())
    return [*PROSE_PACKAGES, *names]


def pages(package: str, deb: Path) -> list[dict]:
    """The package's pages as records: HTML as its text, manual pages and plain text as they are."""
    records = []
    for path, data in deb_members(deb):
        if path.endswith(".gz"):
            data, path = gzip.decompress(data), path[:-3]
        if path.endswith(NOT_PAGES) or (package == "python3.11-doc" and "/_sources/" not in path):
            continue  # not prose; python3.11-doc's HTML renders the same sources
        if (text := text_of(data)) is not None and path.endswith((".html", ".htm")):
            text = html_text(text)
        if text is not None and text.strip():
            records.append({"id": f"{package}:{path}", "text": text, "source": package})
    return records


def prose(cache: Path) -> Iterator[dict]:
    for path, text in kernel_files(cache):
        if "/Documentation/" in path and path.endswith((".rst", ".txt")) and text.strip():
            yield {"id": path, "text": text, "source": "linux-docs"}
    packages = prose_packages()
    debs = [downloaded(package, cache) for package in packages]
    with multiprocessing.Pool() as pool:  # parsing HTML is most of the build: one package per core
        for records in pool.starmap(pages, zip(packages, debs, strict=True), chunksize=1):
            yield from records
    if not (SHARED / "corpora").is_dir():
        print(f"bench/corpora.py: no {SHARED / 'corpora'}: the prose corpus is the packages' alone", file=sys.stderr)
    for name in SHARED_PROSE:
        for file in sorted((SHARED / "corpora" / name).glob("*.jsonl.gz")):
            with gzip.open(file) as f:
                for line in f:
                    record = orjson.loads(line)
                    yield {"id": f"{name}:{record['id']}", "text": record["text"], "source": name}


def books(cache: Path) -> Iterator[dict]:
    """prose's texts, each source's joined in their order (each text once) into documents of 0.3 to 4 MB, their sizes
    drawn with a fixed seed: the same text as long documents, as a corpus of books has them."""
    sizes, seen = random.Random(0), set()
    for source, records in itertools.groupby(prose(cache), key=lambda record: record["source"]):
        parts, held, wanted = [], 0, sizes.randint(300_000, 4_000_000)
        for record in records:
            if (digest := hash(record["text"])) in seen:
                continue
            seen.add(digest)
            parts.append(record["text"])
            held += len(record["text"])
            if held >= wanted:
                yield {"id": f"{source}:{record['id']}", "text": "\n\n".join(parts), "source": source}
                parts, held, wanted = [], 0, sizes.randint(300_000, 4_000_000)
        if parts:
            yield {"id": f"{source}:{record['id']}", "text": "\n\n".join(parts), "source": source}


def write(records: Iterator[dict], target: Path, most_bytes: float = float("inf")) -> tuple[int, int]:
    """The records as JSONL at `target`, each text once, the first of them up to `most_bytes`; (documents, bytes)."""
    seen, documents, size = set(), 0, 0
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "wb") as f:
        for record in records:
            if (digest := hash(record["text"])) in seen:
                continue
            seen.add(digest)
            line = orjson.dumps(record) + b"\n"
            if size + len(line) > most_bytes:
                break
            f.write(line)
            documents, size = documents + 1, size + len(line)
    return documents, target.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=("code", "prose", "books"))
    parser.add_argument("target", type=Path)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/tokenmill-bench-debs"))
    parser.add_argument("--most-mb", type=float, default=float("inf"), help="only the first records up to this size")
    args = parser.parse_args()
    made = {"code": code, "prose": prose, "books": books}[args.kind](args.cache)
    documents, size = write(made, args.target, args.most_mb * 1e6)
    print(f"{args.target}: {documents:,} documents, {size / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
