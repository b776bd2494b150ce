"""The tokenizer report: what the vocabulary costs, measured on the held-out sample.

For the dataset's tokenizer and each baseline (`fertility.baselines`), over the held-out documents (never
in the training sample) overall and per value of each `fertility.group_by` field: tokens per word
(fertility; words are whitespace-separated, so scripts written without spaces count a run as one word),
bytes per token and characters per token (comparable across scripts). Written as `report/fertility.json`
and `report/fertility.md`, the same markdown the flow shows as a Prefect artifact.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

from tokenizers import Tokenizer

from tokenmill.config import TokenmillConfig
from tokenmill.core import layout
from tokenmill.core.samples import Sampled, group_name, holdout_records
from tokenmill.tokenizers.encoders import EncoderChoice, HFEncoder, load_encoder, loaded_backend
from tokenmill.tokenizers.pretrained import load_pretrained
from tokenmill.tokenizers.tokenizer_info import TokenizerInfo

DATASET = "dataset"  # the report's name for the dataset's own tokenizer
BATCH = 512
FLAG_RATIO = 1.2  # a group needing 20% more tokens per byte than the whole held-out sample is called out


def _metrics(words: int, chars: int, nbytes: int, tokens: int) -> dict:
    return {
        "tokens": tokens,
        "tokens_per_word": round(tokens / words, 4) if words else None,
        "bytes_per_token": round(nbytes / tokens, 4) if tokens else None,
        "chars_per_token": round(chars / tokens, 4) if tokens else None,
    }


TokenCounter = Callable[[list[str]], list[int]]  # texts -> tokens per text


def hf_counter(tokenizer: Tokenizer) -> TokenCounter:
    """hf's counts, its memory bounded as `HFEncoder` bounds it (a run of texts, a long text in pieces, at a time)."""
    encoder = HFEncoder(tokenizer)
    return lambda texts: encoder.encode_batch(texts)[1].tolist()


def measure(tokenizers: dict[str, TokenCounter], records: Iterable[dict], group_by: list[str]) -> dict:
    """Counts and fertility of every tokenizer (its token counter) over `records` (`{"text": ..., field:
    value}`), overall and per value of each `group_by` field."""
    sizes: dict[tuple, dict[str, int]] = defaultdict(lambda: {"documents": 0, "words": 0, "chars": 0, "bytes": 0})
    tokens: dict[tuple, dict[str, int]] = defaultdict(lambda: dict.fromkeys(tokenizers, 0))
    records = list(records)
    for start in range(0, len(records), BATCH):
        batch = records[start : start + BATCH]
        texts = [r["text"] for r in batch]
        counts = {name: count(texts) for name, count in tokenizers.items()}
        for i, record in enumerate(batch):
            text = texts[i]
            keys = [()] + [(field, group_name(record.get(field))) for field in group_by]
            for key in keys:
                s = sizes[key]
                s["documents"] += 1
                s["words"] += len(text.split())
                s["chars"] += len(text)
                s["bytes"] += len(text.encode())
                for name in tokenizers:
                    tokens[key][name] += counts[name][i]

    def entry(key: tuple) -> dict:
        s = sizes[key]
        metrics = {n: _metrics(s["words"], s["chars"], s["bytes"], tokens[key][n]) for n in tokenizers}
        return {**s, "tokenizers": metrics}

    groups: dict[str, dict[str, dict]] = {field: {} for field in group_by}
    for key in sorted(k for k in sizes if k):
        groups[key[0]][key[1]] = entry(key)
    return {"overall": entry(()) if records else None, "groups": groups}


def flagged(report: dict, name: str = DATASET) -> list[str]:
    """Groups where the tokenizer needs FLAG_RATIO times the overall tokens per byte: under-represented
    in its training sample, or a script or language it serves badly."""
    overall = report["overall"]["tokenizers"][name]["bytes_per_token"] if report["overall"] else None
    notes = []
    for field, values in report["groups"].items():
        for value, entry in values.items():
            bpt = entry["tokenizers"][name]["bytes_per_token"]
            if overall and bpt and overall / bpt >= FLAG_RATIO:
                notes.append(f"{field} {value}: {overall / bpt:.1f}x the overall tokens per byte")
    return notes


def tokenizer_report(
    config: TokenmillConfig,
    tokenizer: TokenizerInfo,
    samples: Iterable[Sampled | int],
    encoder: EncoderChoice | None = None,
) -> dict:
    """Measure the held-out sample (`samples`: the sample stage's results, or the shard ids, as
    `tokenmill.core.samples.holdout_records` takes them) and write `report/fertility.{json,md}`; return the
    report. The dataset's tokenizer is counted by the run's `encoder` when given (verified to give hf's ids: the
    same counts, at the fast backend's speed), else by hf."""
    store = config.output.store()
    url = store.url_of(layout.TOKENIZER)
    tokenizers = {DATASET: loaded_backend(url, tokenizer.sha256, "hf").tokenizer}  # as the process loaded it
    for source in config.fertility.baselines:
        pretrained = load_pretrained(source, config.tokenizer.hub, config.tokenizer.tiktoken)
        tokenizers[source] = Tokenizer.from_str(pretrained.data.decode())
    counters = {name: hf_counter(tok) for name, tok in tokenizers.items()}
    if encoder is not None:
        counters[DATASET] = lambda texts: load_encoder(url, tokenizer.sha256, encoder).encode_batch(texts)[1].tolist()
    report = measure(counters, holdout_records(config, samples), config.fertility.group_by)
    train = config.tokenizer.train
    report["tokenizers"] = {
        name: {
            "source": (f"trained {train.algorithm}" if train else config.tokenizer.path) if name == DATASET else name,
            "vocab_size": max(tok.get_vocab(with_added_tokens=True).values()) + 1,
        }
        for name, tok in tokenizers.items()
    }
    report["tokenizers"][DATASET]["sha256"] = tokenizer.sha256
    report["flagged"] = flagged(report)
    store.write_json(layout.FERTILITY_REPORT[1], report)
    store.write_bytes(layout.FERTILITY_REPORT[0], markdown(report).encode())
    return report


def _fmt(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _label(name: str, report: dict) -> str:
    """The dataset's tokenizer with its origin; a baseline by the last two parts of its path (gpt2/tokenizer.json)."""
    return f"{name} ({report['tokenizers'][name]['source']})" if name == DATASET else "/".join(name.split("/")[-2:])


def markdown(report: dict) -> str:
    names = list(report["tokenizers"])
    overall = report["overall"]
    if overall is None:
        return "# Tokenizer report\n\nThe held-out sample is empty: raise fertility.holdout_size.\n"
    lines = [
        "# Tokenizer report",
        "",
        f"Held-out sample (never trained on): {overall['documents']:,} documents, {overall['bytes']:,} bytes, "
        f"{overall['words']:,} words. Tokens per word is fertility (lower is cheaper); bytes and characters "
        "per token compare across scripts (higher is cheaper).",
        "",
        "| tokenizer | vocab | tokens | tokens/word | bytes/token | chars/token |",
        "|---|---|---|---|---|---|",
    ]
    for name in names:
        m = overall["tokenizers"][name]
        lines.append(
            f"| {_label(name, report)} | {report['tokenizers'][name]['vocab_size']:,} | {m['tokens']:,} "
            f"| {_fmt(m['tokens_per_word'])} | {_fmt(m['bytes_per_token'])} | {_fmt(m['chars_per_token'])} |"
        )
    if report["flagged"]:
        lines += ["", "**Served worst by the dataset's tokenizer** (compare its share of the training sample):", ""]
        lines += [f"- {note}" for note in report["flagged"]]
    for field, values in report["groups"].items():
        metric_heads = [f"{metric} {_label(n, report)}" for metric in ("tokens/word", "bytes/token") for n in names]
        lines += [
            "",
            f"## By {field}",
            "",
            f"| {field} | documents | share of bytes | " + " | ".join(metric_heads) + " |",
        ]
        lines.append("|---" * (3 + len(metric_heads)) + "|")
        for value, entry in values.items():
            m = entry["tokenizers"]
            cells = [_fmt(m[n]["tokens_per_word"]) for n in names] + [_fmt(m[n]["bytes_per_token"]) for n in names]
            share = entry["bytes"] / overall["bytes"]
            lines.append(f"| {value} | {entry['documents']:,} | {share:.1%} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
