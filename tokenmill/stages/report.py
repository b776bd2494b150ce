"""The dataset report: `report/summary.md` and PNG plots (document lengths, tokens per shard, packing
utilization by split) beside the published files, and the same markdown, plots inline, for the Prefect artifact.

The report describes the run that made the dataset (its throughput differs run to run), so it is written
after `manifest.json` and is not among the manifest's files: the data stay byte-identical across runs.
"""

from __future__ import annotations

import base64
import io
import threading
from collections.abc import Iterable

import numpy as np
import pandas as pd

from tokenmill.core import layout
from tokenmill.core.shares import target_text
from tokenmill.core.stats import split_summary
from tokenmill.formats.megatron import MegatronIndex
from tokenmill.io.storage import Store

SUMMARY = "report/summary.md"
PLOTS = {
    "document_lengths": "report/document_lengths.png",
    "tokens_per_shard": "report/tokens_per_shard.png",
    "utilization": "report/utilization.png",
    "mix": "report/mix.png",  # a mixture's (`mix_plot`)
}
MAX_BARS = 200  # bars in the tokens-per-shard plot
MAX_INDEXES = 256  # Megatron indexes read for the document-length plot


def percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction:.2%}"


def files(images: dict[str, bytes]) -> list[str]:
    """The report's files, with these plots (`plots`, and a mixture's `mix_plot`)."""
    return [SUMMARY, *(PLOTS[name] for name in images)]


def summary_markdown(manifest: dict, run: dict | None = None, images: Iterable[str] = PLOTS) -> str:
    """Counts, tokens per split, encoder, packing against the padded layout, the run's throughput and a
    mixture's mix; `images`: the plots to show."""
    counts = manifest["counts"]
    lines = [
        f"# {manifest['name']} {manifest.get('version', '')}",
        "",
        f"{manifest['shards']} shards; {counts['documents_in']:,} documents in, {counts['documents_out']:,} "
        f"tokenized, {counts['documents_rejected']:,} rejected; {counts['tokens']:,} tokens ({manifest['dtype']}).",
        f"Tokenizer: sha256 `{manifest['tokenizer']['sha256'][:16]}`, vocab {manifest['tokenizer']['vocab_size']:,}, "
        f"{'trained on a sample' if manifest['tokenizer'].get('trained') else 'pretrained'}"
        + (
            f"; encoder {manifest['encoder']['name']} {manifest['encoder']['version']}."
            if "encoder" in manifest
            else "."
        ),
    ]
    if run:
        lines.append(
            f"Run: {run['bytes_in'] / 1e6:,.1f} MB of input; {tokenize_rate(run, manifest['shards'])}; "
            f"whole flow {run['flow_seconds']} s"
            + (f"; global shuffle {run['shuffle_seconds']} s" if run.get("shuffle_seconds") is not None else "")
            + (f"; largest process {run['largest_process_mb']:,} MB" if run.get("largest_process_mb") else "")
            + (f"; Dask workers restarted for memory: {n}" if (n := run.get("workers_restarted_for_memory")) else "")
            + "."
        )
    lines += [
        "",
        "| split | documents | tokens | packed rows | packing utilization | one document per padded row |",
        "|---|---|---|---|---|---|",
    ]
    for split, s in manifest["splits"].items():
        p = s.get("packing", {})
        padded = p.get("padded_layout", {})
        lines.append(
            f"| {split} | {s['documents']:,} | {s['tokens']:,} | {p.get('sequences', 0):,} | "
            f"{percent(p.get('utilization'))} | {percent(padded.get('utilization'))} "
            f"({padded.get('sequences', 0):,} rows) |"
        )
    if chats := {split: s for split, s in manifest["splits"].items() if "supervised_tokens" in s}:
        lines += [
            "",
            "Conversations (input.chat): the tokens that carry loss, and those longer than a packed row "
            f"({manifest['config']['pack']['too_long']}: pack.too_long). Preference pairs (input.preference): a "
            "pair is a document (its two sequences), too long where a side is longer than its max_length "
            "(dropped or cut as its too_long says).",
            "",
            "| split | conversations | tokens | supervised tokens | supervised share | too long | tokens cut |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {split} | {s['documents']:,} | {s['tokens']:,} | {s['supervised_tokens']:,} | "
            f"{percent(s['supervised_share'])} | {s['too_long']:,} | {s['tokens_cut']:,} |"
            for split, s in chats.items()
        ]
    if mix := manifest.get("mix"):
        rows = summary_rows(mix)
        lines += ["", f"The mix: {mix['total_tokens']:,} {mix['split']} tokens drawn.", ""]
        lines += [f"| {' | '.join(rows[0])} |", f"|{'---|' * len(rows[0])}"]
        lines += [f"| {' | '.join(f'{v:,}' if isinstance(v, int) else str(v) for v in r.values())} |" for r in rows]
    lines += ["", *(f"![{name}]({PLOTS[name].removeprefix('report/')})" for name in images)]
    return "\n".join(lines) + "\n"


def tokenize_rate(run: dict, shards: int) -> str:
    """The tokenize stage's rate, of the input it tokenized in this run of `shards` (a rerun reuses most)."""
    made = run["shards_made"]
    if not made:
        return "tokenize stage: every shard reused"
    rate = run["tokenize_mb_per_s"]  # None where the shards it made held no input (empty files)
    said = "tokenize stage: no input" if rate is None else f"tokenize stage {rate} MB/s of input"
    return said if made == shards else f"{said} (the {made:,} of {shards:,} shards it made)"


def _png(figure) -> bytes:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, metadata={"Software": None})
    plt.close(figure)
    return buffer.getvalue()


def document_lengths(store: Store, table: pd.DataFrame) -> tuple[np.ndarray, int, int]:
    """Tokens per document from the Megatron indexes the stats table names (each split's shards with documents,
    by split and shard), at most MAX_INDEXES of them evenly spaced (a read each: on an object store, a request
    each; and only those are named: a name per file was 0.1 GB at 490,000 files); (lengths, indexes read,
    indexes in all)."""
    rows = table.loc[table.documents > 0, ["split", "shard_id"]].sort_values(["split", "shard_id"])
    read = rows.iloc[:: -(-len(rows) // MAX_INDEXES)] if len(rows) else rows
    lengths = []
    for split, shard_id in read.itertuples(index=False):
        with store.local_copies(layout.megatron_prefix(split, shard_id) + ".idx") as (path,):
            lengths.append(np.array(MegatronIndex(path).lengths))
    return (np.concatenate(lengths) if lengths else np.zeros(0, np.int32)), len(read), len(rows)


def shard_bins(per_shard: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Tokens per shard and split, as at most MAX_BARS bars: consecutive shards' mean when there are more
    (100,000 bars cost matplotlib gigabytes and minutes, and no screen shows them); (bars, shards per bar)."""
    width = -(-len(per_shard) // MAX_BARS)
    binned = per_shard.groupby(np.arange(len(per_shard)) // width).mean()
    binned.index = per_shard.index[::width]
    return binned, width


_LOADING_MATPLOTLIB = threading.Lock()


def load_matplotlib():
    """pyplot for files only, never a display. Most of a second to import: only the process that draws pays it
    (a worker, for the flow). One thread at a time: `matplotlib.use` in one
    thread while another is importing pyplot finds it half made (AttributeError: no 'switch_backend')."""
    with _LOADING_MATPLOTLIB:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker  # noqa: F401 (the plots' formatters)

    return plt


def load_plotting() -> None:
    """`load_matplotlib` ahead of `plots`, on the worker that will draw them (`flows.cluster.prepare_cluster`)."""
    load_matplotlib()


def plots(store: Store, table: pd.DataFrame, seq_len: int, mix: dict | None = None) -> dict[str, bytes]:
    """The report's plots (PNG, by name), from the stats table and the Megatron indexes it names, and a mixture's
    `mix_plot` where `mix` is given: they need no manifest, so a worker draws them while validate runs (0.2 s of
    matplotlib that publish used to wait for)."""
    drawn = {
        "document_lengths": _png(lengths_figure(*document_lengths(store, table))),
        "tokens_per_shard": _png(shards_figure(table)),
        "utilization": _png(utilization_figure(split_summary(table, seq_len))),
    }
    return drawn | ({"mix": mix_plot(mix)} if mix is not None else {})


def _figure(height: float = 3.2, left: float = 0.9, right: float = 0.2, bottom: float = 0.64):
    """A figure 6 inches wide and its axes, with fixed margins in inches (a "tight" layout measured every text and
    drew the figure twice)."""
    return load_matplotlib().subplots(
        figsize=(6, height),
        gridspec_kw={"left": left / 6, "right": 1 - right / 6, "top": 1 - 0.32 / height, "bottom": bottom / height},
    )


def _counts():
    """Tick labels of counts as 950, 12k, 3.5M: plain text (10^n labels go through mathtext, a third of the plots'
    time), and short enough not to run into each other on a log axis up to billions."""
    from matplotlib.ticker import EngFormatter

    return EngFormatter(sep="")


def lengths_figure(lengths: np.ndarray, read: int, indexes: int):
    """The histogram of tokens per document (`document_lengths`), on a log axis."""
    from matplotlib.ticker import NullFormatter

    figure, ax = _figure()
    if len(lengths):
        bins = np.logspace(0, np.log10(max(lengths.max(), 10)), 40)
        ax.hist(lengths, bins=bins, color="#4c72b0")
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(_counts())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_major_formatter(_counts())
    sampled = f" ({read:,} of {indexes:,} indexes, evenly spaced)" if read < indexes else ""
    ax.set(title=f"Document length{sampled}", xlabel="tokens per document, as stored", ylabel="documents")
    return figure


def shards_figure(table: pd.DataFrame):
    """Tokens per shard, a bar per shard (`shard_bins`) stacked by split, the legend beside the bars, not over them (a
    mixture has splits of every source)."""
    from matplotlib.ticker import MaxNLocator

    per_shard = table.pivot_table(index="shard_id", columns="split", values="tokens", aggfunc="sum", fill_value=0)
    bars, width = shard_bins(per_shard)
    figure, ax = _figure(height=max(3.2, 0.9 + 0.2 * len(bars.columns)), right=1.6)
    bottom = np.zeros(len(bars))
    for split in bars.columns:
        ax.bar(bars.index, bars[split], width=width if width > 1 else 0.8, align="edge" if width > 1 else "center",
               bottom=bottom, label=split)  # fmt: skip
        bottom += bars[split].to_numpy()
    per_bar = f" (mean of {width:,} consecutive shards a bar)" if width > 1 else ""
    ax.set(title=f"Tokens per shard{per_bar}", xlabel="shard", ylabel="tokens")
    ax.yaxis.set_major_formatter(_counts())
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # shard numbers
    ax.set_xlim(min(ax.get_xlim()[0], bars.index[0] - 1), max(ax.get_xlim()[1], bars.index[-1] + 1))
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False, fontsize="small")
    return figure


def utilization_figure(summary: dict):
    """Each split's packing utilization, packed and as one document per padded row (`split_summary`): a pair of bars
    a split, down the page (a mixture's split names side by side ran into each other)."""
    splits = list(summary)
    packed = [summary[s].get("packing", {}).get("utilization") or 0 for s in splits]
    padded = [(summary[s].get("packing", {}).get("padded_layout", {}).get("utilization") or 0) for s in splits]
    longest = max(map(len, splits), default=0)
    figure, ax = _figure(height=max(2.2, 1.5 + 0.35 * len(splits)), left=0.3 + 0.075 * longest, bottom=0.9)
    y = np.arange(len(splits))
    ax.barh(y - 0.2, packed, 0.4, label="packed")
    ax.barh(y + 0.2, padded, 0.4, label="one document per padded row")
    ax.set_yticks(y, splits)
    ax.invert_yaxis()
    ax.set(title="Packing utilization", xlabel="real tokens / token slots", xlim=(0, 1.05))
    if not any(packed + padded):
        ax.text(0.5, 0.5, "nothing packed (pack.mode: none)", transform=ax.transAxes, ha="center", va="center")
    figure.legend(loc="lower center", ncol=2, frameon=False, fontsize="small")
    return figure


def mix_plot(mix: dict) -> bytes:
    """A mixture's sources: each one's share of the training tokens drawn, and how many times it is drawn."""
    names = list(mix["sources"])
    figure, ax = _figure(height=0.6 + 0.45 * len(names), left=1.5, right=0.9, bottom=0.35)
    shares = [mix["sources"][n]["share"] for n in names]
    ax.barh(names, shares, color="#4c72b0")
    for y, name in enumerate(names):
        ax.annotate(f" {mix['sources'][name]['epochs']:.2f} epochs", (shares[y], y), va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set(title=f"The mix: share of {mix['total_tokens']:,} {mix['split']} tokens", xlim=(0, max(shares) * 1.3))
    return _png(figure)


def write_report(store: Store, manifest: dict, images: dict[str, bytes], run: dict | None = None) -> str:
    """Write the report files into the dataset (`manifest`: what `publish.publish` returns; `images`: `plots`);
    return the markdown with the plots inline, for the run's Prefect artifact (the file's relative image links
    lead nowhere in the UI; the three PNGs are about 40 KB)."""
    markdown = summary_markdown(manifest, run, images)
    for name, data in images.items():
        store.write_bytes(PLOTS[name], data)
    store.write_bytes(SUMMARY, markdown.encode())
    for name, data in images.items():
        inline = f"(data:image/png;base64,{base64.b64encode(data).decode()})"
        markdown = markdown.replace(f"({PLOTS[name].removeprefix('report/')})", inline)
    return markdown


def summary_rows(resolved: dict) -> list[dict]:
    """The mix as a table a person reads: a row per source."""
    split = resolved["split"]
    return [
        {
            "source": name,
            "documents": sum(s["documents"] for s in source["splits"].values()),
            f"{split} tokens": source["splits"][split]["tokens"],
            "target": target_text(source["target"]),
            "tokens drawn": source["tokens_drawn"],
            "share": f"{100 * source['share']:.2f}%",
            "epochs": f"{source['epochs']:.2f}",
        }
        for name, source in resolved["sources"].items()
    ]
