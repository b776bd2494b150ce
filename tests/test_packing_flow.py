"""The packing modes through the real CLI, Prefect and Dask: bfd rows, llm.c files and the shuffle index are
published with their kinds, and the run summary shows the packing stats beside the padded layout."""

from __future__ import annotations

import json

import numpy as np

from tokenmill.formats.llmc import LlmcReader
from tokenmill.formats.megatron import MegatronReader


def test_bfd_with_llmc_through_the_flow(run_cli, tmp_path):
    out = tmp_path / "bfd"
    result = run_cli(
        "run", "examples/gpt2.yaml", "--set", f"output.path={out}", "--set", "partition.shard_size=1MB",
        "--set", "split={train: 0.9, val: 0.1}", "--set", "pack={mode: bfd, seq_len: 1024}",
        "--set", "output.formats=[megatron, packed, llmc]",
    )  # fmt: skip
    manifest = json.loads((out / "manifest.json").read_text())
    packing = manifest["packing"]
    assert packing["real_tokens"] == manifest["counts"]["tokens"] and packing["utilization"] > 0.95
    assert packing["padded_layout"]["sequences"] > packing["sequences"]
    assert f"{packing['utilization']:.2%}" in result.stdout and "padded layout: utilization" in result.stdout
    kinds = {f["path"]: f["kind"] for f in manifest["files"]}
    assert kinds["packed/train/shuffle.npy"] == kinds["packed/val/shuffle.npy"] == "packed-shuffle"
    index = np.load(out / "packed/train/shuffle.npy")
    assert len(index) == manifest["splits"]["train"]["packing"]["sequences"]
    for path, kind in kinds.items():
        if kind == "llmc":
            megatron = MegatronReader(out / path.replace("llmc/", "megatron/").removesuffix("-0000.bin"))
            assert np.array_equal(LlmcReader(out / path).tokens, megatron.tokens)
