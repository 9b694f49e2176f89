"""The identity records what ran: custom.fn's files are hashed by the launcher before launch and by the ranks as
they import them; a file edited in between fails the job, naming it, so no summary names code that did not run."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from runner.sweep.identity import changed_sources

RULE = '''
import torch.nn.functional as F


def token_sum_over_n(logits, labels, ctx):
    """The token sum over the global count N: grad L under FSDP's mean x W (version {version})."""
    summed = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum", ignore_index=-100)
    return {factor} * summed / ctx.global_tokens
'''


def test_a_file_that_differs_from_its_hash_before_launch_is_named():
    identity = {"sources": {"rule": "a" * 64, "helpers": "b" * 64}}
    assert (
        changed_sources({"identity": identity, "custom_sources_ran": {"rule": "a" * 64, "helpers": "b" * 64}}) is None
    )
    assert changed_sources({"identity": {"parts": {}}}) is None  # not a custom rule
    sentence = changed_sources({"identity": identity, "custom_sources_ran": {"rule": "c" * 64, "helpers": "b" * 64}})
    assert (
        sentence.startswith("custom.fn's code changed")
        and ": rule (sha256 aaaaaaaaaaaa before launch, cccccccccccc" in sentence
    )


@pytest.mark.slow
def test_a_rule_edited_while_its_sweep_runs_fails_the_jobs_that_imported_the_edit(tmp_path):
    rule = tmp_path / "edited_rule.py"
    rule.write_text(RULE.format(version=1, factor="1.0"))
    sweep = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runner",
            "-m",
            "reduction=custom",
            "custom.fn=edited_rule:token_sum_over_n",
            "train.steps=40,4",  # job 0 long enough to be running when the file changes
            "metrics.gather_every=1",  # its metrics.jsonl written from step 1: its ranks imported the rule
            "wandb.mode=disabled",
            "hydra.sweep.dir=sweep",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 240
    first_metrics = None
    while first_metrics is None and time.time() < deadline:  # job 0's ranks have imported the rule, job 1's not
        found = [p for p in (tmp_path / "sweep").glob("0_*/metrics.jsonl") if p.read_text().strip()]
        first_metrics = found[0] if found else None
        time.sleep(0.2)
    assert first_metrics is not None
    time.sleep(1.5)  # a later mtime, as a person's edit has (the byte-code cache goes by mtime and size)
    rule.write_text(RULE.format(version=2, factor="2.0"))
    assert "status" not in json.loads((first_metrics.parent / "summary.json").read_text())  # job 0 still runs
    output, _ = sweep.communicate(timeout=300)
    summaries = {
        int(p.parent.name.split("_")[0]): json.loads(p.read_text())
        for p in (tmp_path / "sweep").glob("*_*/summary.json")
    }
    assert summaries[0]["status"] == "completed", summaries[0].get("error")
    assert summaries[1]["status"] == "failed"
    assert summaries[1]["error"].startswith(
        "custom.fn's code changed between the launcher's check and the ranks' import: edited_rule"
    )
    assert sweep.returncode == 1, output
