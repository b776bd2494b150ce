"""Mixtures: three sources built in one run, the mix resolved from the tokens made, drawn in the resolved shares by
megatron-core's own BlendedMegatronDatasetBuilder from the published data-args files and by tokenmill.loader, each
source's validation set on its own; weights retuned without redoing a shard; one source growing redoes only its
new shards. The resolution's rules (budgets, epochs, totals, max_epochs) on tables made here."""

from __future__ import annotations

import collections
import io
import json
import shutil
import types
import warnings

import numpy as np
import pandas as pd
import pytest
import yaml
from rich.console import Console
from rich.text import Text

from tokenmill.config import TokenmillConfig
from tokenmill.core.layout import megatron_prefix, packed_prefix
from tokenmill.core.plan import Plan, Shard, Shards
from tokenmill.core.shares import MixError
from tokenmill.io.readers import Piece
from tokenmill.stages.mix import resolve
from tokenmill.stages.partition import list_inputs
from tokenmill.stages.report import summary_rows
from tokenmill.stages.validate import reference_items

from .conftest import CORPORA, EXAMPLES, TOKENIZERS

SEQ_LEN = 256


def mixture(tmp_path, sources: list[dict], **mix) -> dict:
    return {
        "name": "mix3",
        "sources": sources,
        "mix": mix,
        "split": {"train": 0.95, "val": 0.05},
        "partition": {"shard_size": "4MB"},
        "tokenizer": {"path": str(TOKENIZERS / "gpt2" / "tokenizer.json")},
        "pack": {"mode": "concat", "seq_len": SEQ_LEN},
        "output": {"path": str(tmp_path / "build"), "publish": {"path": str(tmp_path / "published")}},
    }


def three_sources(news_dir) -> list[dict]:
    return [
        {"name": "multilingual", "input": {"paths": [str(CORPORA / "multilingual" / "*.jsonl.gz")]}, "weight": 0.6},
        {"name": "code", "input": {"paths": [str(CORPORA / "code" / "*.jsonl.gz")]}, "weight": 0.3},
        {"name": "news", "input": {"paths": [f"{news_dir}/*.jsonl.gz"]}, "weight": 0.1},
    ]


def run_mix(run_cli, tmp_path, config: dict) -> dict:
    """`tokenmill run` of `config`; the published version's manifest and where it is."""
    path = tmp_path / "mix.yaml"
    path.write_text(yaml.safe_dump(config))
    run_cli("run", str(path))
    root = tmp_path / "published" / "mix3"
    version = root / (root / "LATEST").read_text().strip()
    return json.loads((version / "manifest.json").read_text()) | {"root": version}


def made_times(build, plan: dict) -> dict[str, tuple[str, int]]:
    """Each shard's source and the mtime of its training tokens, by what the shard is made from: written only
    where the shard's tokenize body ran (a shard whose id changes as files land before it is renamed)."""
    return {
        s["source"]: (
            s["mix_source"],
            (build / f"{megatron_prefix(s['mix_source'] + '/train', s['shard_id'])}.bin").stat().st_mtime_ns,
        )
        for s in plan["shards"]
    }


def drawn_by_megatron(root, manifest: dict) -> tuple[dict[str, float], list]:
    """Each source's share of the training samples megatron-core's builder draws from the published data-args
    files (as Megatron-LM reads them), asked for the mix's tokens in samples; and the validation datasets."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        builder = pytest.importorskip("megatron.core.datasets.blended_megatron_dataset_builder")
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
        from megatron.core.datasets.utils import get_blend_from_list
    train = get_blend_from_list((root / "mix/megatron/train.args").read_text().split())  # Megatron-LM's reading
    per_split = json.loads((root / "mix/megatron/per_split.json").read_text())
    tokenizer = manifest["tokenizer"]
    config = GPTDatasetConfig(
        random_seed=1,
        sequence_length=SEQ_LEN,
        blend_per_split=[train, get_blend_from_list(per_split["valid"]), None],
        multiple_validation_sets=True,
        full_validation=False,
        tokenizer=types.SimpleNamespace(
            eod=tokenizer["eod_id"],
            pad=tokenizer["eod_id"],
            vocab_size=tokenizer["vocab_size"],
            unique_identifiers={"tokenizer": tokenizer["sha256"]},
        ),  # fmt: skip
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
    )
    samples = manifest["mix"]["total_tokens"] // SEQ_LEN
    sizes = [samples, 64, 0]
    trained, validation, _ = builder.BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()
    counts = collections.Counter(
        trained.datasets[int(i)].dataset_path.split("/megatron/")[1].split("/")[0] for i in trained.dataset_index
    )
    return {source: n / len(trained) for source, n in counts.items()}, validation


def rows_drawn(root, plan: dict) -> dict[str, float]:
    """Each source's share of the rows `tokenmill.loader.PackedSplit(root, "train")` yields, from the mix's index
    of (shard, row) pairs; and the loader's samples are those rows."""
    from tokenmill.formats.packed import PackedReader
    from tokenmill.loader import PackedSplit, training_sample

    mixed, index = PackedSplit(root, "train"), np.load(root / "mix/packed/train.npy")
    assert len(mixed) == len(index)
    source_of = {s["shard_id"]: s["mix_source"] for s in plan["shards"]}
    for i in (0, len(index) // 2, len(index) - 1):
        shard, row = (int(v) for v in index[i])
        stored = PackedReader(root / packed_prefix(f"{source_of[shard]}/train", shard))
        expected = training_sample(*stored[row])
        assert all(np.array_equal(mixed[i][k], expected[k]) for k in expected)
    counts = collections.Counter(source_of[int(shard)] for shard in index[:, 0])
    return {source: n / len(index) for source, n in counts.items()}


def test_a_mix_of_three_sources_is_drawn_by_megatron_in_its_resolved_shares(run_cli, prefect_client, tmp_path):
    news = tmp_path / "news"
    news.mkdir()
    shutil.copy(EXAMPLES / "data" / "web_scrapinghub_aeb.jsonl.gz", news)
    config = mixture(tmp_path, three_sources(news))
    first = run_mix(run_cli, tmp_path, config)
    report = first["root"] / "report"  # the mix's plot, drawn on a worker with the others
    assert (report / "mix.png").read_bytes().startswith(b"\x89PNG") and "![mix](mix.png)" in (
        report / "summary.md"
    ).read_text()
    build = tmp_path / "build"
    plan = json.loads((build / "plan.json").read_text())
    assert {s.get("mix_source") for s in plan["shards"]} == {"multilingual", "code", "news"}
    for f in first["files"]:  # every shard file under its source's directory
        if f["kind"].startswith("megatron"):
            assert f["path"].split("/")[1] in {"multilingual", "code", "news"}, f["path"]
    # the shard stages' task runs name their sources
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName

    named = TaskRunFilter(name=TaskRunFilterName(like_="tokenize[shard"))
    assert any(t.name.endswith("news]") for t in prefect_client.read_task_runs(task_run_filter=named))
    # no total: the largest mix in which no weighted source repeats (the scarcest, by weight, drawn once)
    sources = first["mix"]["sources"]
    assert max(s["epochs"] for s in sources.values()) == pytest.approx(1.0, abs=1e-3)
    assert {n: s["share"] for n, s in sources.items()} == pytest.approx({"multilingual": 0.6, "code": 0.3, "news": 0.1})

    # Retuned: the total makes news (a tenth) repeat 2.5 times; no shard is tokenized again
    before = made_times(build, plan)
    news_tokens = sources["news"]["splits"]["train"]["tokens"]
    config["mix"] = {"total_tokens": 25 * news_tokens}
    second = run_mix(run_cli, tmp_path, config)
    assert made_times(build, plan) == before
    sources = second["mix"]["sources"]
    assert sources["news"]["epochs"] == pytest.approx(2.5, abs=1e-3)
    assert second["version"] != first["version"]  # another mix is another version; its shards the same files
    shares, validation = drawn_by_megatron(second["root"], second)
    for name, source in sources.items():
        assert shares[name] == pytest.approx(source["share"], rel=0.01), (name, shares)
    # the packed loader's mix: each source's rows in its share, read through tokenmill.loader
    shares = rows_drawn(second["root"], json.loads((build / "plan.json").read_text()))
    for name, source in sources.items():
        assert shares[name] == pytest.approx(source["share"], rel=0.01), (name, shares)
    # one validation set per source, each all of that source's validation documents
    assert len(validation) == 3
    val_documents = sorted(s["splits"]["val"]["documents"] for s in sources.values())
    assert sorted(d.dataset.index.sequence_lengths.size for d in validation) == val_documents

    # news grows by a file: only its new shard is made, the mix follows the new counts, the old version verifies
    shutil.copy(EXAMPLES / "data" / "web_dclm_annotated.jsonl.gz", news)
    third = run_mix(run_cli, tmp_path, config)
    plan = json.loads((build / "plan.json").read_text())
    after = made_times(build, plan)
    assert [source for made_from, (source, _) in after.items() if before.get(made_from) != after[made_from]] == ["news"]
    grown = third["mix"]["sources"]["news"]["splits"]["train"]["tokens"]
    assert grown > news_tokens and third["mix"]["sources"]["news"]["epochs"] < 2.5
    assert run_cli("inspect", str(second["root"]), "--verify").returncode == 0
    shown = run_cli("inspect", str(third["root"])).stdout
    assert "    news: weight 0.1 -> " in shown and "--data-args-path" in shown, shown
    moved = run_cli("diff", str(second["root"]), str(third["root"])).stdout
    assert "web_dclm_annotated.jsonl.gz (news)" in moved and f"source news: {news_tokens:,} -> {grown:,}" in moved


def table(tokens: dict[str, int]) -> pd.DataFrame:
    """A stats table with one shard per source: its train tokens, and a tenth as many in val."""
    rows = []
    for shard_id, (source, n) in enumerate(tokens.items()):
        rows += [
            {"shard_id": shard_id, "split": f"{source}/train", "documents": n // 100, "tokens": n, "rejected": 0},
            {"shard_id": shard_id, "split": f"{source}/val", "documents": 1, "tokens": n // 10, "rejected": 0},
        ]
    return pd.DataFrame(rows)


def config_of(sources: list[dict], **mix) -> TokenmillConfig:
    sources = [{"input": {"paths": [f"/data/{s['name']}/*"]}} | s for s in sources]
    return TokenmillConfig.model_validate(
        {
            "name": "m",
            "sources": sources,
            "mix": mix,
            "split": {"train": 0.9, "val": 0.1},
            "tokenizer": {"path": "t.json"},
            "output": {"path": "/tmp/out"},
        }  # fmt: skip
    )


def test_budgets_and_epochs_are_drawn_as_given_and_the_weights_share_the_rest():
    config = config_of(
        [{"name": "web", "weight": 3}, {"name": "code", "weight": 1}, {"name": "books", "tokens": 500},
         {"name": "math", "epochs": 2.5}],
        total_tokens=10_000,
    )  # fmt: skip
    mix = resolve(config, table({"web": 20_000, "code": 5_000, "books": 1_000, "math": 400}))["sources"]
    assert mix["books"]["tokens_drawn"] == 500 and mix["books"]["epochs"] == 0.5
    assert mix["math"]["tokens_drawn"] == 1_000 and mix["math"]["epochs"] == 2.5
    assert mix["web"]["tokens_drawn"] == 6_375 and mix["code"]["tokens_drawn"] == 2_125  # 8,500 shared 3:1
    assert sum(s["share"] for s in mix.values()) == pytest.approx(1.0)
    assert mix["web"]["splits"] == {
        "train": {"documents": 200, "tokens": 20_000},
        "val": {"documents": 1, "tokens": 2_000},
    }


def test_the_runs_mix_table_shows_every_count_whole_in_a_log_and_in_a_narrow_terminal(capsys, monkeypatch):
    """The mix as `tokenmill run` prints it: a log (no terminal) gets the table at its full width, one line a source;
    a terminal of 60 columns wraps, but loses no digit. Rich laid out a log in 80 columns and cut the counts of a
    1.5 GB mix ("701,691,3…"); a budget showed as "1e+07"."""
    import flows.cli as cli

    config = config_of(
        [{"name": "code", "weight": 0.3}, {"name": "crawl", "weight": 0.3}, {"name": "prose", "epochs": 2},
         {"name": "chat", "tokens": 10_000_000}],
    )  # fmt: skip
    mix = resolve(config, table({"code": 701_691_385, "crawl": 701_848_711, "prose": 45_785_196, "chat": 41_194_354}))
    rows = summary_rows(mix)
    assert [row["target"] for row in rows] == ["weight 0.3", "weight 0.3", "epochs 2", "tokens 10,000,000"]
    cells = [[f"{v:,}" if isinstance(v, int) else str(v) for v in row.values()] for row in rows]
    cli.print_table(list(rows[0]), cells, title="the mix")
    logged = capsys.readouterr().out
    assert "…" not in logged and max(map(len, logged.splitlines())) > 80
    for row in cells:  # a source's row on one line
        assert any(all(cell in line for cell in row) for line in logged.splitlines()), (row, logged)

    narrow = io.StringIO()
    monkeypatch.setattr(cli, "console", Console(file=narrow, force_terminal=True, width=60, soft_wrap=True))
    cli.print_table(list(rows[0]), cells, title="the mix")
    shown = narrow.getvalue()
    plain = Text.from_ansi(shown).plain
    assert "…" not in plain and max(map(len, plain.splitlines())) <= 60
    assert sum(map(str.isdigit, plain)) == sum(map(str.isdigit, "".join(map("".join, cells)))), plain


def test_the_reference_check_draws_from_every_source_by_its_share_of_the_tokens():
    """validate's reference check in a mixture: 1.6 million chat turns in one shard beside 30 shards of 2,500 code
    files and 30 of web pages. Drawn from all documents at once, the sample went to whichever shards it read (the chat
    shard, when it was among them, took nearly all of it); each source now gets its share by tokens, from its own
    shards, at least one document."""
    config = config_of([{"name": "chat", "weight": 1}, {"name": "code", "weight": 1}, {"name": "web", "weight": 1}])
    sizes = {"chat": [(1_600_000, 40_000_000)], "code": [(2_500, 23_000_000)] * 30, "web": [(4_000, 9_000_000)] * 30}
    shards, rows = [], []
    for name, shard_sizes in sizes.items():
        for documents, tokens in shard_sizes:
            shards.append(Shard(len(shards), (Piece(f"/data/{name}/{len(shards)}.jsonl"),), 3 * tokens, "", name))
            rows.append({"shard_id": len(rows), "split": f"{name}/train", "documents": documents, "tokens": tokens,
                         "rejected": 0})  # fmt: skip
    plan = Plan("k", "c", "i", 1 << 26, None, [], Shards(shards))
    tokens = {name: sum(t for _, t in shard_sizes) for name, shard_sizes in sizes.items()}
    for seed in range(1, 21):
        items = reference_items(config, plan, pd.DataFrame(rows), seed)
        drawn = collections.Counter()
        for item in items:
            drawn[item.shard.mix_source] += item.sample
        assert drawn == pytest.approx({n: 1000 * t / sum(tokens.values()) for n, t in tokens.items()}, abs=1), drawn
        assert sum(item.most_bytes for item in items) == pytest.approx(4_000_000, rel=1e-3)  # check_bytes: auto


def test_a_source_repeated_past_max_epochs_stops_the_run_naming_it():
    config = config_of([{"name": "web", "weight": 0.9}, {"name": "tiny", "weight": 0.1}], total_tokens=100_000)
    with pytest.raises(MixError, match=r"source 'tiny' would be drawn 10.00 times .* over mix.max_epochs 4"):
        resolve(config, table({"web": 100_000, "tiny": 1_000}))
    config.mix.max_epochs = 10
    assert resolve(config, table({"web": 100_000, "tiny": 1_000}))["sources"]["tiny"]["epochs"] == 10


def test_budgets_over_the_total_and_a_source_with_no_tokens_are_named(tmp_path):
    config = config_of([{"name": "web", "weight": 1}, {"name": "books", "tokens": 5_000}], total_tokens=4_000)
    with pytest.raises(MixError, match="books draw 5,000 tokens, mix.total_tokens is 4,000: nothing is left for web"):
        resolve(config, table({"web": 10_000, "books": 10_000}))
    empty = table({"web": 10_000, "books": 0})
    with pytest.raises(MixError, match="source 'books' made no train tokens: its 1 documents all fell in other"):
        resolve(config, empty)
    empty.loc[empty.split.str.startswith("books/"), ["documents", "rejected"]] = [0, 7]
    rejects = tmp_path / "rejects" / "shard-00001.jsonl"
    rejects.parent.mkdir()
    rejects.write_text(json.dumps({"file": "b.jsonl", "line": 3, "reason": "text field 'text' missing or null"}) + "\n")
    config.output.path = str(tmp_path)
    said = (
        r"'books' made no train tokens: all 7 records were rejected, the first at b.jsonl line 3: text field 'text' "
        r"missing or null \(each one's file, line and reason: rejects/shard-00001.jsonl in "
    )
    with pytest.raises(MixError, match=said):
        resolve(config, empty)


def test_a_source_whose_paths_match_nothing_is_named(tmp_path):
    (tmp_path / "web").mkdir()
    (tmp_path / "web" / "a.jsonl").write_text('{"text": "x"}\n')
    config = config_of([{"name": "web", "weight": 1}, {"name": "code", "weight": 1}])
    config.sources[0].input.paths = [str(tmp_path / "web" / "*.jsonl")]
    config.sources[1].input.paths = [str(tmp_path / "code" / "*.jsonl")]
    with pytest.raises(FileNotFoundError, match=r"source 'code': input path .*code/\*\.jsonl' matches no file"):
        list_inputs(config)
    config.sources[1].input.paths = config.sources[0].input.paths
    with pytest.raises(ValueError, match="an input file may belong to one source only"):
        list_inputs(config)


def test_a_mixture_config_takes_one_target_per_source_and_names_each_source_once():
    with pytest.raises(ValueError, match="set exactly one of weight, tokens or epochs"):
        config_of([{"name": "web", "weight": 1, "epochs": 2}])
    with pytest.raises(ValueError, match="each name once"):
        config_of([{"name": "web", "weight": 1}, {"name": "web", "weight": 2}])
    config = config_of([{"name": "web", "weight": 1}, {"name": "code", "epochs": 1}])
    assert config.streams() == ["web/train", "web/val", "code/train", "code/val"]
    # retuning the targets keys the same shard work; another input config does not
    retuned = config_of([{"name": "web", "weight": 5}, {"name": "code", "epochs": 3}])
    assert retuned.section_hash("input", "partition", "split", "tokenizer") == config.section_hash(
        "input", "partition", "split", "tokenizer"
    )
    assert retuned.dataset_hash() != config.dataset_hash()
    retuned.sources[1].input.text_field = "content"
    assert retuned.section_hash("input") != config.section_hash("input")


def test_the_tokenizer_of_a_mix_is_trained_on_a_sample_in_the_mix_shares(tmp_path):
    """A tenth of the mix from the largest source, nine tenths from the two smaller: the texts the tokenizer is
    trained on (the sample written, as `training_texts` reads it) take each source in its share of the mix, in
    text bytes, not its share of the corpus."""
    from tokenmill.core import samples as sample_files
    from tokenmill.stages import sampling
    from tokenmill.stages.partition import plan_shards

    sources = [
        {"name": "code", "input": {"paths": [str(CORPORA / "code" / "*.jsonl.gz")]}, "weight": 0.6},
        {"name": "multilingual", "input": {"paths": [str(CORPORA / "multilingual" / "*.jsonl.gz")]}, "weight": 0.1},
        {"name": "web", "input": {"paths": [str(CORPORA / "web_trafilatura_pages" / "*.jsonl.gz")]}, "weight": 0.3},
    ]
    config = mixture(tmp_path, sources)
    config["tokenizer"] = {"train": {"sample_size": "3MB", "vocab_size": 1000}}
    config = TokenmillConfig.model_validate(config)
    plan = plan_shards(config)
    f, g = sampling.fractions(config, plan)
    samples = [sampling.sample_shard(sampling.Sampling.of(config, f, g), shard) for shard in plan.shards]
    source_of = {}  # each sampled text's source, from the sample files written
    for sample, shard in zip(samples, plan.shards, strict=True):
        for line in (tmp_path / "build" / sample.path).read_text().splitlines():
            source_of[json.loads(line)["text"]] = shard.mix_source
    trained_on = collections.Counter()
    for text in sample_files.training_texts(config, samples):
        trained_on[source_of[text]] += len(text.encode())
    corpus = collections.Counter()
    for shard in plan.shards:
        corpus[shard.mix_source] += shard.bytes
    assert corpus["multilingual"] / corpus.total() > 0.4  # the largest source by far, a tenth of the mix
    for source in sources:
        assert trained_on[source["name"]] / trained_on.total() == pytest.approx(source["weight"], rel=0.1), trained_on
    assert trained_on.total() == pytest.approx(3_000_000, rel=0.1)


def test_a_single_input_publishes_megatron_data_args_of_its_shards(gpt2_run, run_cli):
    """A single input (examples/gpt2.yaml, four shards) publishes data-args files as a mixture does, beside its data
    and not in its manifest (they name where the version lies; the data is the same bytes anywhere): megatron-core's
    reading of `megatron/train.args` gives every training shard of the published version, weighted by its part of
    the split's tokens, and each prefix opens as an `IndexedDataset`; `megatron/per_split.json` has the validation
    split's shards too; `tokenmill inspect` names both files."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
        from megatron.core.datasets.utils import get_blend_from_list
    dataset = gpt2_run / "demo-gpt2"
    root = dataset / (dataset / "LATEST").read_text().strip()
    stats = pd.DataFrame(json.loads((root / "stats.json").read_text()))
    for split, megatron_split in (("train", "train"), ("val", "valid")):
        made = stats[(stats.split == split) & (stats.documents > 0)].sort_values("shard_id")
        listed = (root / "megatron/train.args").read_text().split() if split == "train" else None
        per_split = json.loads((root / "megatron/per_split.json").read_text())[megatron_split]
        assert listed is None or listed == per_split
        prefixes, weights = get_blend_from_list(per_split)  # as Megatron-LM reads --data-args-path
        assert prefixes == [f"{root}/{megatron_prefix(split, i)}" for i in made.shard_id]
        assert np.allclose(weights, made.tokens / made.tokens.sum())
        assert [len(indexed.IndexedDataset(p)) for p in prefixes] == made.documents.tolist()
    manifest = json.loads((root / "manifest.json").read_text())
    assert not {f["path"] for f in manifest["files"]} & {"megatron/train.args", "megatron/per_split.json"}
    shown = run_cli("inspect", str(root)).stdout
    assert f"--data-args-path {root}/megatron/train.args" in shown, shown
