"""config.json, the copy of config.yaml that the analysis reads: used only while it matches, never a different config."""

from __future__ import annotations

import json

import pandas as pd
import yaml

from analysis.load.sweeps import load_sweeps
from analysis.testing.synthetic import SyntheticRun, write_sweep
from runner.config import config_with, run_config_yaml
from runner.record.config_file import COPY_NAME, read_config, write_config, write_config_copy


def test_the_runner_writes_a_copy_that_reads_back_as_its_yaml(tmp_path):
    path = tmp_path / "config.yaml"
    config = config_with({"reduction": "local", "world_size": 4, "optim.lr": 1e-5, "cost.modes": ["sum", "local"]})
    write_config(path, run_config_yaml(config))
    copied = read_config(path)
    assert (tmp_path / COPY_NAME).exists()
    assert copied == yaml.safe_load(path.read_text())
    assert (copied["reduction"], copied["world_size"], copied["optim"]["lr"], copied["cost"]["modes"]) == (
        "local",
        4,
        1e-5,
        ["sum", "local"],
    )
    assert list(copied) == list(
        yaml.safe_load(path.read_text())
    )  # the key order too: it orders the runs table's columns


def test_the_copy_is_what_is_read_while_it_matches(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("reduction: sum\nworld_size: 2\n")
    write_config_copy(path)
    record = json.loads((tmp_path / COPY_NAME).read_text())
    record["config"]["world_size"] = 8  # a copy that says something else, for the same text: so it was read
    (tmp_path / COPY_NAME).write_text(json.dumps(record))
    assert read_config(path) == {"reduction": "sum", "world_size": 8}


def test_a_config_yaml_edited_after_its_copy_is_parsed_itself(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("reduction: sum\nworld_size: 2\n")
    write_config_copy(path)
    path.write_text("reduction: sum\nworld_size: 4\n")
    assert read_config(path) == {"reduction": "sum", "world_size": 4}
    (tmp_path / COPY_NAME).write_text("{not json")
    assert read_config(path) == {"reduction": "sum", "world_size": 4}


def test_configs_json_would_change_get_no_copy(tmp_path):
    path = tmp_path / "config.yaml"
    for text in ("optim:\n  lr: .nan\n", "1: one\n", "when: 2026-12-03\n", "reduction: [unclosed\n"):
        path.write_text(text)
        assert write_config_copy(path) is None and not (tmp_path / COPY_NAME).exists(), text
    path.write_text("1: one\n")
    assert read_config(path) == {1: "one"}


def test_a_sweep_loads_the_same_runs_with_or_without_copies(tmp_path):
    runs = [
        SyntheticRun("sum"),
        SyntheticRun("local", factor=0.5, overrides={"optim.name": "sgd"}),
        SyntheticRun("scaled", sp=3, status="invalid"),
    ]
    sweep = write_sweep(tmp_path / "sweep", runs)
    assert len(list(sweep.glob(f"*/{COPY_NAME}"))) == 3
    with_copies = load_sweeps([sweep]).runs
    for copy in sweep.glob(f"*/{COPY_NAME}"):
        copy.unlink()
    without = load_sweeps([sweep]).runs
    pd.testing.assert_frame_equal(with_copies, without)
    assert with_copies.loc[1, "optim.name"] == "sgd" and with_copies.loc[2, "sp"] == 3
