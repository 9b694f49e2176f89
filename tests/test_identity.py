"""A run's identity is everything that changes its result, and a rerun into the same folder goes by it.

Generated over every file a run reads (a data file, a .txt file deep in a data folder, a .jsonl file, a
tokenizer.json, a Hugging Face config.json, the custom.fn module and a local module it imports): changing
one byte of it changes the identity, and `identity_changes` names that part; changing a file the run does not
read (a .csv beside the data) changes nothing. Versions: another torch, transformers or tokenizers (for the
runs that use them) changes it too. Then the issue's case as real sweeps: the same `data.path` with other
contents is superseded, not skipped, and runs anew beside a new mode; the same inputs again are skipped.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import run_module, train_tokenizer
from omegaconf import OmegaConf

from runner.config import config_with, run_config_yaml
from runner.sweep import identity as identity_module
from runner.sweep.custom_check import custom_fn_facts, forget_checked
from runner.sweep.identity import identity_changes, run_identity

PRESETS = Path(__file__).resolve().parents[1] / "conf" / "model"
QUICK = ["train.steps=2", "wandb.mode=disabled", "metrics.count_comm=false"]
CALLABLE = """
import helper_{n}


def loss(logits, labels, ctx):
    return helper_{n}.token_sum(logits, labels) / ctx.global_tokens
"""
HELPER = """
import torch.nn.functional as F


def token_sum(logits, labels):
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum", ignore_index=-100)
"""


def paragraphs(label: str) -> str:
    return "\n\n".join(f"Paragraph {i} of the {label} corpus." for i in range(40))


def inputs(folder: Path) -> list[tuple[str, str, dict, Path]]:
    """(name, the identity part it changes, the config's overrides, the file read) of every kind of input file."""
    (folder / "deep" / "er").mkdir(parents=True)
    (folder / "corpus.txt").write_text(paragraphs("first"))
    (folder / "deep" / "a.txt").write_text(paragraphs("a"))
    (folder / "deep" / "er" / "b.txt").write_text(paragraphs("b"))
    (folder / "records.jsonl").write_text("\n".join(json.dumps({"text": paragraphs(str(i))}) for i in range(3)))
    train_tokenizer(folder / "tokenizer.json")
    hf = OmegaConf.to_container(OmegaConf.load(PRESETS / "hf_llama.yaml").overrides)
    (folder / "config.json").write_text(json.dumps(hf))
    (folder / "callable_1.py").write_text(CALLABLE.format(n=1))
    (folder / "helper_1.py").write_text(HELPER)
    model_file = {"model.arch": "hf", "model.name": "hf", "model.config": str(folder / "config.json")}
    custom = {"reduction": "custom", "custom.fn": "callable_1:loss"}
    return [
        ("a data file", "data", {"data.path": str(folder / "corpus.txt")}, folder / "corpus.txt"),
        ("a data folder's nested .txt", "data", {"data.path": str(folder / "deep")}, folder / "deep/er/b.txt"),
        ("a .jsonl data file", "data", {"data.path": str(folder / "records.jsonl")}, folder / "records.jsonl"),
        ("data.tokenizer", "tokenizer", {"data.tokenizer": str(folder / "tokenizer.json")}, folder / "tokenizer.json"),
        ("model.config", "model.config", model_file, folder / "config.json"),
        ("custom.fn's module", "custom.fn", custom, folder / "callable_1.py"),
        ("a local module custom.fn imports", "custom.fn", custom, folder / "helper_1.py"),
    ]


def identity_of(overrides: dict) -> dict:
    """The identity a launching process computes (a fresh one: the callable's facts are read anew)."""
    cfg = config_with(overrides)
    forget_checked()
    facts = custom_fn_facts(cfg.custom.fn) if cfg.reduction.value == "custom" else None
    return run_identity(cfg, run_config_yaml(cfg), facts)


def touched(path: Path) -> None:
    """One byte of the file changed (its size unchanged); a comment's, in a Python module (it must still import)."""
    if path.suffix == ".py":
        path.write_text(path.read_text() + "# x\n")
        return
    raw = bytearray(path.read_bytes())
    middle = len(raw) // 2
    raw[middle] = ord("x") if raw[middle] != ord("x") else ord("y")
    path.write_bytes(bytes(raw))


@pytest.fixture
def in_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # custom.fn's module is imported from the working folder, as a user's is
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_every_file_a_run_reads_is_in_its_identity(in_folder):
    cases = inputs(in_folder)
    assert {part for _, part, _, _ in cases} == {"data", "tokenizer", "model.config", "custom.fn"}
    for name, part, overrides, read in cases:
        before = identity_of(overrides)
        assert identity_of(overrides) == before, name  # the same inputs, the same identity
        touched(read)
        after = identity_of(overrides)
        assert after["digest"] != before["digest"], f"{name}: a changed byte left the identity as it was"
        assert identity_changes(before, after) == [f"{part} (content)"], name
        assert after["parts"]["config"] == before["parts"]["config"]  # the config did not change: its file did


def test_a_file_the_run_does_not_read_leaves_the_identity(in_folder):
    (in_folder / "data").mkdir()
    (in_folder / "data" / "a.txt").write_text(paragraphs("a"))
    overrides = {"data.path": str(in_folder / "data")}
    before = identity_of(overrides)
    (in_folder / "data" / "notes.csv").write_text("a,b\n")  # a folder's .txt files are the data, nothing else
    (in_folder / "other.txt").write_text(paragraphs("elsewhere"))
    assert identity_of(overrides) == before


@pytest.mark.parametrize(
    "package, overrides",
    [
        ("torch", {}),
        ("loss-reduction-ablation", {}),
        ("transformers", {"model.arch": "hf", "model.name": "hf_llama"}),
        ("tokenizers", {"data.tokenizer": "TOKENIZER"}),
    ],
)
def test_the_version_of_every_package_whose_code_runs_is_in_the_identity(in_folder, monkeypatch, package, overrides):
    train_tokenizer(in_folder / "tokenizer.json")
    overrides = {key: str(in_folder / "tokenizer.json") if v == "TOKENIZER" else v for key, v in overrides.items()}
    before = identity_of(overrides)
    assert package in before["versions"]
    real = identity_module._version
    monkeypatch.setattr(identity_module, "_version", lambda name: "0.0.1" if name == package else real(name))
    after = identity_of(overrides)
    assert after["digest"] != before["digest"]
    assert identity_changes(before, after) == [f"{package} {before['versions'][package]} -> 0.0.1"]


def test_the_packages_a_callable_imports_are_in_its_identity(in_folder):
    (in_folder / "callable_2.py").write_text(CALLABLE.format(n=2))
    (in_folder / "helper_2.py").write_text(HELPER)
    facts = identity_of({"reduction": "custom", "custom.fn": "callable_2:loss"})
    assert facts["versions"]["torch"] and "numpy" in facts["versions"]  # torch's own imports run too
    assert identity_of({})["versions"].keys() == {"torch", "loss-reduction-ablation"}


def test_a_rerun_over_changed_data_supersedes_the_earlier_runs_instead_of_skipping_them(tmp_path):
    """The issue's case: the same data.path with other contents, rerun with one more mode."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(paragraphs("first"))
    numbered = ["hydra.sweep.dir=s", "hydra.sweep.subdir=${hydra.job.num}", f"data.path={corpus}", *QUICK]
    first = run_module("runner", ["-m", "reduction=sum,local", *numbered], tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    earlier = {n: (tmp_path / f"s/{n}/metrics.jsonl").read_bytes() for n in (0, 1)}

    corpus.write_text(paragraphs("second, quite different"))
    again = run_module("runner", ["-m", "reduction=sum,local,detached", *numbered], tmp_path)
    out = again.stdout + again.stderr
    assert again.returncode == 0, out
    assert "skipped, completed earlier" not in out
    assert out.count("held an earlier run of another identity (data (content))") == 2, out
    assert "sweep: completed 3, failed 0, diverged 0, invalid 0, skipped 0" in out
    kept = sorted((tmp_path / "s/superseded").iterdir())
    assert [(p / "metrics.jsonl").read_bytes() for p in kept] == [earlier[0], earlier[1]]
    losses = {n: json.loads((tmp_path / f"s/{n}/metrics.jsonl").read_text().splitlines()[0])["loss"] for n in (0, 1, 2)}
    assert losses[0] == pytest.approx(losses[2], rel=1e-6) and losses[0] == pytest.approx(losses[1], rel=1e-6)
    assert losses[0] != json.loads(earlier[0].decode().splitlines()[0])["loss"]  # trained on the new text

    same = run_module("runner", ["-m", "reduction=sum,local,detached", *numbered], tmp_path)
    assert "sweep: completed 0, failed 0, diverged 0, invalid 0, skipped 3" in same.stdout + same.stderr
    summary = json.loads((tmp_path / "s/0/summary.json").read_text())
    assert summary["identity"]["parts"]["data"] and (tmp_path / "s/0/config.json").exists()  # kept (config's copy)


def test_a_rerun_over_an_edited_callable_supersedes_it(tmp_path):
    (tmp_path / "callable_3.py").write_text(CALLABLE.format(n=3))
    (tmp_path / "helper_3.py").write_text(HELPER)
    args = ["reduction=custom", "custom.fn=callable_3:loss", *QUICK, "hydra.run.dir=run"]
    assert run_module("runner", args, tmp_path).returncode == 0
    (tmp_path / "helper_3.py").write_text(HELPER + "# the same math, another source\n")
    again = run_module("runner", args, tmp_path)
    assert (
        again.returncode == 0
        and "held an earlier run of another identity (custom.fn (content))" in again.stderr + again.stdout
    )
