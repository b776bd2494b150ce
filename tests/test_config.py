import pytest
from pydantic import ValidationError

from tokenmill.config import load_config

from .conftest import EXAMPLES, TOKENMILL


def test_demo_config_loads_with_sizes_parsed():
    config = load_config(EXAMPLES / "demo.yaml")
    assert config.partition.shard_size == 1_000_000
    assert config.tokenizer.train.sample_size == 2_000_000
    assert config.output.path.startswith("/")  # made absolute for workers


def test_set_overrides_parse_yaml_values():
    config = load_config(EXAMPLES / "demo.yaml", ["pack.seq_len=4096", "dask.n_workers=1", "input.id_field=null"])
    assert (config.pack.seq_len, config.dask.n_workers, config.input.id_field) == (4096, 1, None)


def test_dataset_hash_ignores_where_output_goes_and_how_many_workers():
    base = load_config(EXAMPLES / "demo.yaml")
    moved = load_config(EXAMPLES / "demo.yaml", ["output.path=/elsewhere", "dask.n_workers=7"])
    changed = load_config(EXAMPLES / "demo.yaml", ["pack.seq_len=4096"])
    assert base.dataset_hash() == moved.dataset_hash() != changed.dataset_hash()


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_every_example_config_loads(example):
    assert load_config(EXAMPLES / example).name


def test_slurm_and_a_scheduler_address_are_one_or_the_other():
    with pytest.raises(ValidationError, match="dask.address and dask.slurm"):
        load_config(EXAMPLES / "slurm.yaml", ["dask.address=tcp://x:8786"])


def test_retuning_a_check_keeps_the_works_keys_and_makes_a_new_version():
    """tokenizer.check_fraction and the other check settings decide what validate and the encoder's verification
    check, not what is made: the tokenize stage's and the tokenizer training's keys leave them out (no shard is
    redone, no tokenizer retrained), the dataset's hash keeps them (the new version is validated with them)."""
    from types import SimpleNamespace

    from tokenmill.core.commits import tokenize_key

    tokenizer = SimpleNamespace(sha256="0" * 64, chat=())
    base = load_config(EXAMPLES / "demo.yaml")
    checked = ["tokenizer.check_fraction=0.5", "tokenizer.check_min_documents=7", "tokenizer.verify_documents=3"]
    retuned = load_config(EXAMPLES / "demo.yaml", [*checked, "tokenizer.allowed_mismatch_rate=0.1"])
    assert tokenize_key(retuned, tokenizer) == tokenize_key(base, tokenizer)
    assert retuned.section_hash("tokenizer", checks=False) == base.section_hash("tokenizer", checks=False)
    assert retuned.dataset_hash() != base.dataset_hash()
    without_eod = load_config(EXAMPLES / "demo.yaml", ["tokenizer.append_eod=false"])
    assert tokenize_key(without_eod, tokenizer) != tokenize_key(base, tokenizer)


@pytest.mark.parametrize(
    "override, message",
    [
        ("split={train: 0.5, val: 0.2}", "sum to 1"),
        ("tokenizer.path=x.json", "exactly one"),
        ("pack.mode=zigzag", "pack.mode"),
        ("partition.shard_size=lots", "shard_size"),
        ("input.colour=blue", "colour"),
    ],
)
def test_invalid_configs_are_rejected_with_the_key_named(override, message):
    with pytest.raises(ValidationError, match=message):
        load_config(EXAMPLES / "demo.yaml", [override])


def test_cli_reports_config_errors_without_a_traceback(tmp_path):
    import subprocess

    bad = tmp_path / "bad.yaml"
    bad.write_text((EXAMPLES / "demo.yaml").read_text().replace("seq_len: 1024", "seq_len: -5"))
    result = subprocess.run([*TOKENMILL, "check", str(bad)], capture_output=True, text=True)
    assert result.returncode == 2
    assert "pack.seq_len" in result.stdout and "Traceback" not in result.stdout + result.stderr


def test_the_cli_says_its_version_and_run_help_names_every_config_section():
    import inspect
    import os
    import subprocess
    from importlib.metadata import version

    from tokenmill.config import TokenmillConfig

    said = subprocess.run([*TOKENMILL, "--version"], capture_output=True, text=True, check=True)
    assert said.stdout.strip() == f"tokenmill {version('tokenmill')}"
    env = {**os.environ, "COLUMNS": "200"}  # no line of it wrapped
    shown = subprocess.run([*TOKENMILL, "run", "--help"], capture_output=True, text=True, env=env)
    assert shown.returncode == 0, shown.stderr
    for name, field in TokenmillConfig.model_fields.items():
        assert f"{name}: {field.description}".replace("`", "") in shown.stdout, name  # code spans as code
    # The commands' list gives each its first paragraph as sentences, not broken where its docstring's lines end
    listed = subprocess.run([*TOKENMILL, "--help"], capture_output=True, text=True, env=env | {"COLUMNS": "400"})
    from flows.cli import app

    for command in app.registered_commands:
        first = inspect.cleandoc(command.callback.__doc__ or command.help).split("\n\n")[0]
        assert " ".join(first.replace("`", "").split()) in listed.stdout, first


@pytest.mark.parametrize(
    "walltime, seconds",
    [("30", 1800), ("10:00", 600), ("01:00:00", 3600), ("1-2", 93600), ("1-02:30", 95400), ("2-00:00:10", 172810)],
)
def test_dask_slurm_walltime_reads_every_slurm_time_format(walltime, seconds):
    from flows.clusters.slurm import walltime_seconds

    assert walltime_seconds(walltime) == seconds
