"""What a run's summary.json records of the code and data its result rests on, as columns of `runs`.

- `upstream`: the code a custom rule ran or followed (summary.json's `custom_upstream`), in a few words:
  "transformers 5.25.0 (ForCausalLMLoss)" for a package whose functions it called, with the version that
  ran; "NVIDIA/Megatron-LM@d98e8a6 (pretrain_gpt.py, schedules.py)" for a paraphrase (repository,
  commit, files); "no upstream (a rule of its own)" where the rule names none; "" where the run records
  nothing (a built-in mode, an earlier runner). `upstream_detail`: all of it
  (each function called, each file and function followed), for trainers.csv.
- `evidence`: the kinds of evidence behind the rule, from the same records, strongest first (`KINDS`):
  "release" for a package whose functions it called (the version that ran is recorded), and "paraphrase"
  besides for the package's code it writes out (`follows`); each test of
  this repository that holds it, or a part of it, against upstream (`Tested`) gives its kind ("release":
  beside a release's own code; "upstream_tests": upstream's own test cases reproduced; "issue_example": an
  upstream report's own example); "paraphrase" for upstream code read at a commit and written out;
  "paper" for a published objective written out; "constructed" where the rule names no upstream (a rule
  of its own); "" where the run records nothing. `evidence_detail`: each kind with its source, each test
  named (the part of the rule it calls, what it is compared with, the package it is skipped without).
- `backward_implementation`, `backward_factor`, `backward_per_rank`, `backward_torch`: the backward of
  the graph's differentiable all-reduce as the run measured it at its start (`all_reduce_backward`: the
  gradient a rank's input receives when every rank seeds 1: W for a SUM backward, 1 for identity), and
  the torch version that gave it; NaN where the graph has none.
- `identity_data`, `identity_tokenizer`, `identity_digest`: the run identity's parts that say what it
  trained on (`runner.sweep.identity`); None where the run records no identity.
- `wandb_run_id`: the id of the run's W&B run (one run across the attempts of a job resumed from its
  checkpoint); None where it had none (`wandb.mode=disabled`, an earlier runner).
"""

from __future__ import annotations

import re

import numpy as np

COLUMNS = [
    "upstream",
    "upstream_detail",
    "evidence",
    "evidence_detail",
    "backward_implementation",
    "backward_factor",
    "backward_per_rank",
    "backward_torch",
    "identity_data",
    "identity_tokenizer",
    "identity_digest",
    "identity_custom_fn",  # the sha256 over a custom rule's files (runner.callables.local_sources), or None
    "wandb_run_id",
    "dropout",  # what of the model drew at random (runner.train.rng.dropout_in), or None
]
DATA_PARTS = ("data", "tokenizer")  # the identity's parts that say what a run trained on
# The kinds of evidence behind a rule, strongest first: runner.config.Evidence's, and "paper" (an objective as
# published, with no code behind it) before "constructed".
KINDS = ("release", "upstream_tests", "issue_example", "paraphrase", "paper", "constructed")


def _short_commit(commit: object) -> str:
    """A commit's 7 hex digits; a release or PR named instead of a commit, by its first words ("release 4.47.1")."""
    if not commit:
        return "?"
    text = str(commit)
    return text[:7] if re.fullmatch(r"[0-9a-f]{40}", text) else text.split(" (", 1)[0].split(";", 1)[0]


def _file(entry: str) -> str:
    """'xtuner/v1/loss/ce_loss.py: LMHeadLossContext.forward' -> 'ce_loss.py'."""
    return entry.split(":", 1)[0].strip().rsplit("/", 1)[-1]


def _entry(record: dict, detailed: bool) -> str:
    if "package" in record:
        version = record.get("version") or "(version not recorded)"
        calls = [str(c) for c in record.get("calls") or []]
        if not detailed:
            called = ", ".join(c.rsplit(".", 1)[-1] for c in calls)
            return f"{record['package']} {version}" + (f" ({called})" if called else "")
        parts = [f"calls {', '.join(calls)}"] if calls else []
        parts += [f"follows {'; '.join(map(str, record.get('follows') or []))}"] if record.get("follows") else []
        return f"{record['package']} {version}" + (f": {'; '.join(parts)}" if parts else "")
    if "repository" in record:
        files = [str(f) for f in record.get("files") or []]
        where = f"{record['repository']}@{_short_commit(record.get('commit'))}"
        if detailed:
            return f"{record['repository']}@{record.get('commit')}: {'; '.join(files)}"
        shown = list(dict.fromkeys(_file(f) for f in files))
        return f"{where} ({', '.join(shown)})" if shown else where
    return str(record)


def _is_test(record: object) -> bool:
    """A record of a test that holds the rule against upstream (`runner.train.upstream.Tested`), not of code."""
    return isinstance(record, dict) and "evidence" in record and "test" in record


def upstream_text(records: object, detailed: bool = False) -> str:
    """summary.json's `custom_upstream` in words (see the module docstring); "" without one. Its tests are
    evidence, not code that ran: `evidence_text` names them."""
    if not isinstance(records, list):
        return ""
    code = [r for r in records if isinstance(r, dict) and not _is_test(r)]
    if not code:  # recorded, and naming no code: the rule follows no upstream code (a construction of its own)
        return "no upstream (a rule of its own)"
    return "; ".join(_entry(r, detailed) for r in code)


def _kinds(record: dict) -> list[tuple[str, str]]:
    """(kind, its source in words) of one record; none for a record that is no evidence (a package whose code
    the rule only follows is a paraphrase of it)."""
    if _is_test(record):
        via = [str(v) for v in record.get("via") or []]
        text = str(record["test"]) + (f" (through {', '.join(via)})" if via else "")
        text += f" against {record.get('against')}" if record.get("against") else ""
        text += f", skipped without {record['needs']}" if record.get("needs") else ""
        return [(str(record["evidence"]), text)]
    if "package" in record:
        named = f"{record['package']} {record.get('version') or '(version not recorded)'}"
        called = ", ".join(str(c).rsplit(".", 1)[-1] for c in record.get("calls") or [])
        followed = ", ".join(str(f).split(":", 1)[-1].strip() for f in record.get("follows") or [])
        kinds = [("release", f"{named} called ({called})")] if called else []
        # What the rule writes out of the package is a paraphrase of it, however much else it calls: the
        # Ulysses rule calls ForCausalLMLoss, and its SP reduction, which decides its gradient, is followed.
        kinds += [("paraphrase", f"{named} followed ({followed})")] if followed or not called else []
        return kinds
    if "repository" in record:
        return [("paraphrase", f"{record['repository']}@{_short_commit(record.get('commit'))}")]
    if "paper" in record:
        return [("paper", str(record["paper"]))]
    return []


def _strength(kind: str) -> int:
    return KINDS.index(kind) if kind in KINDS else len(KINDS)


def _sourced(records: object) -> list[tuple[str, str]]:
    """(kind, source) of every record, strongest first (a stable sort: the rule's order within a kind);
    [("constructed", ...)] where the rule names nothing, [] where the run records nothing."""
    if not isinstance(records, list):
        return []
    named = [record for record in records if isinstance(record, dict)]
    if not named:  # recorded, and empty: a rule of its own
        return [("constructed", "no upstream (a rule of its own)")]
    return sorted((pair for record in named for pair in _kinds(record)), key=lambda pair: _strength(pair[0]))


def evidence_kinds(records: object) -> list[str]:
    """The kinds of evidence behind a rule from its `custom_upstream`, strongest first, each once."""
    return list(dict.fromkeys(kind for kind, _ in _sourced(records)))


def _needed(records: object, kind: str) -> str | None:
    """What every record of `kind` needs to run (a package `make test` lacks), or None where one runs without."""
    if not isinstance(records, list):
        return None
    named = [r for r in records if isinstance(r, dict)]
    tests = [r for r in named if _is_test(r) and r["evidence"] == kind]
    if not tests or any(k == kind for r in named if not _is_test(r) for k, _ in _kinds(r)):
        return None  # none of this kind, or one the run itself gives (the package's function called)
    needs = {r.get("needs") for r in tests}
    return None if None in needs else " or ".join(sorted(needs))


def evidence_text(records: object, detailed: bool = False) -> str:
    """The `evidence` column (the kinds, ", "-joined, each held only by tests skipped without a package marked
    "(needs PACKAGE)": `make test` does not run them) or, `detailed`, `evidence_detail` ("kind: source" for each
    record, strongest first, "; "-joined); "" where the run records nothing."""
    if not detailed:
        marked = [(kind, _needed(records, kind)) for kind in evidence_kinds(records)]
        return ", ".join(kind + (f" (needs {needs})" if needs else "") for kind, needs in marked)
    return "; ".join(f"{kind}: {text}" for kind, text in _sourced(records))


def provenance(summary: dict) -> dict:
    """The COLUMNS of one run from its summary.json."""
    backward = summary.get("all_reduce_backward")
    backward = backward if isinstance(backward, dict) else {}
    per_rank = backward.get("per_rank")
    identity = summary.get("identity")
    parts = identity.get("parts") if isinstance(identity, dict) else None
    parts = parts if isinstance(parts, dict) else {}
    return {
        "upstream": upstream_text(summary.get("custom_upstream")),
        "upstream_detail": upstream_text(summary.get("custom_upstream"), detailed=True),
        "evidence": evidence_text(summary.get("custom_upstream")),
        "evidence_detail": evidence_text(summary.get("custom_upstream"), detailed=True),
        "backward_implementation": backward.get("implementation"),
        "backward_factor": float(backward["factor"]) if isinstance(backward.get("factor"), (int, float)) else np.nan,
        "backward_per_rank": "/".join(f"{f:g}" for f in per_rank) if isinstance(per_rank, list) else None,
        "backward_torch": backward.get("torch"),
        "identity_data": parts.get("data"),
        "identity_tokenizer": parts.get("tokenizer"),
        "identity_digest": identity.get("digest") if isinstance(identity, dict) else None,
        "identity_custom_fn": parts.get("custom.fn"),
        "wandb_run_id": summary.get("wandb_run_id"),
        "dropout": summary.get("dropout") if isinstance(summary.get("dropout"), str) else None,
    }
