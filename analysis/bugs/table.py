"""The known-bugs table (bugs.csv; the report's "Known bugs" section: `analysis.report.bugs`).

A known bug's runs (conf/bug/NAME.yaml, `experiment=bugs`) share `known_bug.*` and its layout, so they form
one comparison group: the buggy arm (`known_bug.buggy`: the upstream logic before the fix), the fixed arm
(`known_bug.fixed`) and the reference `sum`. An arm is told by its rule and FSDP reduction (the two arms
of a bug may share a rule, as torchtitan's loss under DDP's mean and under a sum). Per bug, from the
verdicts (each arm against the group's baseline, step 1's gradient sketch):

- buggy vs reference, fixed vs reference: the verdict and factor (grad L x k, or another direction with
  its cosine);
- buggy vs fixed: the ratio of their step-1 gradient scales and of their step-1 grad norms;
- the result: where the buggy arm gives what `known_bug.buggy.expect` states (the factor to `scale_rtol`, or
  another direction) and the fixed arm gives grad L, the evidence behind the buggy arm (`known_bug.evidence`)
  names it: "reproduced" only with a release, upstream's own tests or the report's own example behind it
  (`REPRODUCED_BY`); "shown (paraphrase)" for upstream code read at a pinned commit with nothing run against
  it; "constructed" for a state the report describes that no upstream code is known to have run. Anything
  else is "not reproduced", with the reason: an arm missing, failed or never run, the bug not showing at
  this layout (the buggy arm gives grad L), another factor than stated, or a fix that is not equivalent to
  the reference.
- a bug of the grad norm alone (`known_bug.buggy.grad_norm` states its factor, sqrt(k) or k) is judged on the
  norm: reproduced when the buggy arm's step-1 gradient is the reference's (sketch scale 1 and cosine 1, to
  `scale_rtol` and `cos_tol`), its step-1 grad norm the stated factor times the reference's (to `scale_rtol`),
  and its verdict as `expect` states: `different` where optim.clip binds (the clipped update departs from
  step 2), grad L where it does not.
"""

from __future__ import annotations

import pandas as pd

from analysis.gradients.expected import SAME
from analysis.gradients.tolerances import Tolerances
from analysis.gradients.verdicts import factor_label
from runner.modes import CUSTOM, grad_norm_factor

COLUMNS = {
    "bug": "bug",
    "reference": "reference",
    "layout": "layout",
    "signature": "reported signature",
    "evidence": "evidence",
    "buggy_vs_reference": "buggy vs reference",
    "buggy_vs_fixed": "buggy vs fixed",
    "fixed_vs_reference": "fixed vs reference",
    "result": "result",
    "why": "why",
}
ARMS = ("buggy", "fixed")
REPRODUCED_BY = ("release", "upstream_tests", "issue_example")  # the evidence a "reproduced" rests on
SHOWN_AS = {"paraphrase": "shown (paraphrase)", "constructed": "constructed"}
NOT_REPRODUCED = "not reproduced"
BECAUSE = {
    "paraphrase": "a paraphrase of upstream code at a pinned commit: no release, upstream test or reported example "
    "was run against it",
    "constructed": "the state the report describes, built here: no upstream code is known to have run it",
}


def _arm_of(runs: pd.DataFrame, arm: str) -> pd.Series:
    """Whether each run is the bug's `arm`: a custom run of that arm's rule under that arm's FSDP reduction."""
    custom = runs.get("custom.fn")
    if custom is None or f"known_bug.{arm}.fn" not in runs:
        return pd.Series(False, index=runs.index)
    return (
        runs["gradient"].eq(CUSTOM)
        & (custom == runs[f"known_bug.{arm}.fn"])
        & (runs["custom.fsdp_reduce"].astype(str) == runs[f"known_bug.{arm}.fsdp_reduce"].astype(str))
    )


def _against(row: pd.Series | None) -> str:
    """An arm's measured gradient against the reference's, in words."""
    if row is None:
        return "no run"
    verdict = row["verdict"]
    if verdict in SAME:
        return f"grad L ({verdict}, ×{row['factor']:.6g})"
    if verdict == "rescaled":
        return f"grad L × {row['factor_label']}"
    if verdict == "different":
        return f"another direction (step-1 cosine {row['sketch_cos_step1']:.4f}, scale ×{row['factor']:.4g})"
    return f"{verdict}: {row['reason']}"


def _norm_against(row: pd.Series | None, stated: str) -> str:
    """A grad-norm bug's arm against the reference, in words: its step-1 gradient, its grad norm, its update."""
    if row is None or row["verdict"] not in SAME | {"rescaled", "different"}:
        return _against(row)
    update = "loss curves match" if row["verdict"] in SAME else f"update departs: {row['reason']}"
    return (
        f"step-1 gradient ×{row['factor']:.6g} (cosine {row['sketch_cos_step1']:.6f}), "
        f"grad norm ×{row['grad_norm_ratio_step1']:.6g} (stated {stated}); {update}"
    )


def _judge_norm(buggy: pd.Series, stated: str, tol: Tolerances) -> tuple[str, str]:
    """A grad-norm bug's buggy arm (both arms ran, the fix is grad L): ("reproduced" or "not reproduced", why)."""
    factor = grad_norm_factor(stated)
    scale, cosine, norm = buggy["factor"], buggy["sketch_cos_step1"], buggy["grad_norm_ratio_step1"]
    if not (abs(scale - 1) <= tol.scale_rtol and abs(1 - cosine) <= tol.cos_tol):
        return NOT_REPRODUCED, f"the buggy arm's step-1 gradient is not the reference's: {_against(buggy)}"
    if abs(norm / factor - 1) > tol.scale_rtol:
        shown = "the bug does not show" if abs(norm - 1) <= tol.scale_rtol else f"not the stated {stated}"
        return NOT_REPRODUCED, f"the buggy arm's grad norm is ×{norm:.6g} the reference's: {shown}"
    if not bool(buggy["as_expected"]):
        return NOT_REPRODUCED, f"the buggy arm's update is not as stated ({buggy['expected']}): {buggy['reason']}"
    clipped = "; the clipped update departs" if buggy["verdict"] == "different" else ""
    return "reproduced", f"the buggy arm's gradient is grad L and its grad norm ×{norm:.6g}, as stated{clipped}"


def _ratio(buggy: pd.Series | None, fixed: pd.Series | None) -> str:
    """The buggy arm's step-1 gradient scale and grad norm over the fixed arm's."""
    if buggy is None or fixed is None or buggy["verdict"] not in SAME | {"rescaled", "different"}:
        return ""
    if fixed["verdict"] not in SAME | {"rescaled", "different"}:
        return ""
    scale = buggy["factor"] / fixed["factor"]
    norm = buggy["grad_norm_ratio_step1"] / fixed["grad_norm_ratio_step1"]
    return f"scale ×{factor_label(scale)}, grad norm ×{norm:.4g}"


def _judge(
    buggy: pd.Series | None, fixed: pd.Series | None, expect: str, norm: str | None, tol: Tolerances
) -> tuple[str, str]:
    """("reproduced" or "not reproduced", why); `norm`: the grad-norm factor a grad-norm bug states."""
    for arm, row in (("buggy", buggy), ("fixed", fixed)):
        if row is None:
            return NOT_REPRODUCED, f"no {arm} arm among the runs"
        if row["verdict"] in ("failed", "not run", "no reference"):
            return NOT_REPRODUCED, f"the {arm} arm {row['verdict']}: {row['reason']}"
    if fixed["verdict"] not in SAME:
        return NOT_REPRODUCED, f"the fix is not equivalent to the reference: it gives {_against(fixed)}"
    if norm is not None:
        return _judge_norm(buggy, norm, tol)
    if buggy["verdict"] in SAME:
        return NOT_REPRODUCED, "the buggy arm gives grad L at this layout: the bug does not show"
    if not bool(buggy["as_expected"]):
        return NOT_REPRODUCED, f"the buggy arm gives {_against(buggy)}, not the stated {expect}"
    shown = "another direction" if buggy["verdict"] == "different" else f"grad L × {buggy['factor_label']}"
    return "reproduced", f"the buggy arm gives {shown}, as stated; the fix gives grad L"


def _graded(result: str, why: str, evidence: str) -> tuple[str, str]:
    """A bug shown as stated, named by the evidence behind its buggy arm (`REPRODUCED_BY`, `SHOWN_AS`)."""
    if result == NOT_REPRODUCED or evidence in REPRODUCED_BY:
        return result, why
    return SHOWN_AS.get(
        evidence, "shown (evidence not stated)"
    ), f"{why}; {BECAUSE.get(evidence, 'no evidence stated')}"


def _evidence(bug: pd.DataFrame) -> tuple[str, str]:
    """(kind, "kind: source") of the bug's `known_bug.evidence` and `known_bug.evidence_source`."""
    first = bug.iloc[0]
    kind, source = first.get("known_bug.evidence"), first.get("known_bug.evidence_source")
    kind = "" if kind is None or pd.isna(kind) else str(kind)
    source = "" if source is None or pd.isna(source) else str(source)
    return kind, f"{kind or 'not stated'}: {source}" if source else (kind or "not stated")


def _layout(run: pd.Series) -> str:
    data = []
    if run.get("data.packing") is True or str(run.get("data.packing")) == "True":
        data.append("packed")
    if str(run.get("data.valid_tokens", "full")) != "full":
        data.append(f"valid_tokens={run['data.valid_tokens']}")
    return run["layout"] + (f" ({', '.join(data)})" if data else "")


def _launched(run: pd.Series) -> tuple:
    """A run's place in its sweep: (sweep, the job number its folder starts with), so bugs come in launch order."""
    number = str(run.get("job", "")).split("_", 1)[0]
    return (str(run.get("sweep", "")), int(number) if number.isdigit() else -1, str(run.get("job", "")))


def _stated_norm(bug: pd.DataFrame) -> str | None:
    """The grad-norm factor the bug states (`known_bug.buggy.grad_norm`), None for a bug of the gradient."""
    if "known_bug.buggy.grad_norm" not in bug:
        return None
    stated = bug["known_bug.buggy.grad_norm"].iloc[0]
    return None if pd.isna(stated) or stated in ("", "None") else str(stated)


def bugs_table(runs: pd.DataFrame, table: pd.DataFrame, tol: Tolerances = Tolerances()) -> pd.DataFrame:
    """One row per known bug in the sweep (empty: none)."""
    if "known_bug.name" not in runs or not runs["known_bug.name"].notna().any():
        return pd.DataFrame(columns=["run_buggy", "run_fixed", *COLUMNS, "expected"])
    measured = pd.concat([runs, table.drop(columns=[c for c in table if c in runs])], axis=1)
    measured = measured.iloc[sorted(range(len(measured)), key=lambda i: _launched(measured.iloc[i]))]
    rows = []
    for name, bug in measured[measured["known_bug.name"].notna()].groupby("known_bug.name", sort=False):
        arms = {arm: bug[_arm_of(bug, arm)] for arm in ARMS}
        buggy, fixed = (arms[arm].iloc[0] if len(arms[arm]) else None for arm in ARMS)
        expect, norm = str(bug["known_bug.buggy.expect"].iloc[0]), _stated_norm(bug)
        kind, evidence = _evidence(bug)
        result, why = _graded(*_judge(buggy, fixed, expect, norm, tol), kind)
        first = bug.iloc[0]
        rows.append(
            {
                "run_buggy": None if buggy is None else buggy["run"],
                "run_fixed": None if fixed is None else fixed["run"],
                "bug": name,
                "reference": first["known_bug.reference"],
                "layout": _layout(first),
                "signature": first["known_bug.signature"],
                "evidence": evidence,
                "expected": expect if norm is None else f"{expect}; grad norm ×{norm}",
                "buggy_vs_reference": _against(buggy) if norm is None else _norm_against(buggy, norm),
                "buggy_vs_fixed": _ratio(buggy, fixed),
                "fixed_vs_reference": _against(fixed),
                "result": result,
                "why": why,
            }
        )
    return pd.DataFrame(rows)


def results_in_words(rows: pd.DataFrame) -> str:
    """How many bugs have each result, in words: "3 reproduced, 4 shown (paraphrase), 1 constructed"."""
    counts = rows["result"].value_counts(sort=False)
    order = ["reproduced", *SHOWN_AS.values(), NOT_REPRODUCED]
    named = sorted(counts.index, key=lambda r: order.index(r) if r in order else len(order))
    return ", ".join(f"{counts[result]} {result}" for result in named)


def bugs_csv(rows: pd.DataFrame) -> pd.DataFrame:
    """bugs.csv: the report's columns (named as there), the buggy arm's stated expectation and both arms' runs."""
    return rows[[*COLUMNS, "expected", "run_buggy", "run_fixed"]].rename(columns=COLUMNS)
