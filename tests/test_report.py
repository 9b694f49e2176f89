"""report.md states only what the runs show: no mode that did not run, no "n/a" for a step, a word where a
table would be empty, no section without its data; and every section opens with its answer in one sentence."""

from __future__ import annotations

import pytest

from analysis.pipeline import analyze
from analysis.testing.synthetic import SyntheticRun, pg_run, write_cost_job, write_sweep

OTHER_MODES = ("detached", "fsdp_sum", "scaled", "mean_of_means")


def test_a_short_sum_and_local_sweep_without_a_cost_job(tmp_path):
    runs = [SyntheticRun("sum", steps=4), SyntheticRun("local", steps=4, factor=0.5)]  # shorter than the warm-up
    sweep = write_sweep(tmp_path / "sweep", runs)
    result = analyze([sweep], sweep / "analysis", make_plots=False, wandb_mode="disabled")
    report = result.report.read_text()
    assert not any(f"`{mode}`" in report for mode in OTHER_MODES), report  # only the modes that ran
    assert "n/a" not in report
    assert "Step times: none, as every run is shorter than the 5 warm-up steps" in report
    assert "Not measured: this analysis holds no interleaved cost job" in report and "Floor:" not in report
    assert "## Plots" not in report and "## Runs that did not complete" not in report
    assert "plots" not in " ".join(result.written)


def test_a_turned_gradient_whose_curves_stay_close_says_so(tmp_path):
    """A different direction with loss curves within tolerance: no 'departs from step n/a'."""
    runs = [SyntheticRun("sum", steps=20), SyntheticRun("mean_of_means", steps=20, turn=0.2)]
    sweep = write_sweep(tmp_path / "sweep", runs)
    report = analyze([sweep], sweep / "analysis", make_plots=False, wandb_mode="disabled").report.read_text()
    line = next(line for line in report.splitlines() if line.startswith("- `mean_of_means`"))
    assert "a different gradient" in line and "stays within tolerance of the baseline's" in line, line
    assert "n/a" not in report


# Each section's question where it has a yes/no one; its first line must ask it and answer at once.
QUESTIONS = {
    "## Verdicts": "Is every verdict the one its mode should give? ",
    "## Runs that did not complete": "Did every run complete? ",
    "## Invariance to the layout": "Does a mode's loss curve change with the layout (at a fixed global batch)? ",
    "## Cost, measured interleaved": "Does a mode take more or less time a step than `local`? ",
    "## Trainers": "Do the trainers' rules give grad L, as the reference does? ",
    "## Post-training aggregation": "Is every post-training mode's gradient invariant to the layout (against the same "
    "mode at W=1, grad_accum=1)? ",
}
ANSWERS = ("Yes, ", "No, ", "Not measured", "Not stated", "Not that this measurement can tell", "None could")
W2 = dict(world_size=2, grad_accum=2)


def sweeps_of_every_kind(folder) -> dict[str, tuple]:
    """Sweeps whose answers are known by construction: (sweep folder, what the cost job's arms take x local's)."""
    custom = {"custom.fn": "my_trainers:titan", "custom.fsdp_reduce": "sum", "custom.expect": "grad L"}
    kinds = {
        "modes": [
            SyntheticRun("sum", **W2),
            SyntheticRun("fsdp_sum", factor=1 + 1e-7, **W2),
            SyntheticRun("scaled", **W2),
            SyntheticRun("local", factor=0.5, **W2),
            SyntheticRun("detached", factor=0.5, loss_shift_from=12, **W2),
            SyntheticRun("mean_of_means", turn=0.1, **W2),
            SyntheticRun("sum", seed=1, **W2),
            SyntheticRun("fsdp_sum", seed=1, status="failed", fail_after=3, **W2),
        ],
        "layouts": [SyntheticRun("sum", world_size=1)]
        + [SyntheticRun("sum", world_size=w, factor=1 + 1e-8) for w in (2, 4)]
        + [SyntheticRun("local", world_size=w, factor=1 / w, loss_shift_from=20 + w) for w in (2, 4)],
        "trainers": [
            SyntheticRun("sum", **W2),
            SyntheticRun("sum", overrides={"autograd_all_reduce": "identity"}, factor=0.5, **W2),
            SyntheticRun("custom", overrides=custom, **W2),
        ],
        "post training": [
            *[SyntheticRun("sum", world_size=w, steps=4, overrides={"objective.name": "pg"}) for w in (1, 2)],
            *[
                pg_run("bnpo", layout, "token", "changes with dp", turn=0.1 * (layout == "w2"))
                for layout in ("w1", "w2")
            ],
            *[pg_run("GRPO", layout, "response", "invariant", turn=0.5, paper="GRPO") for layout in ("w1", "w1_ga2")],
        ],
    }
    costs = {
        "resolved": {"sum": 1.08, "detached": 1.0, "fsdp_sum": 1.0, "scaled": 1.0},
        "unresolved": {"sum": 1.0, "detached": 1.0, "fsdp_sum": 1.0},
        "null fails": {"sum": 1.2, "fsdp_sum": 1.05, "scaled": 1.0},
        "no null": {"sum": 1.08, "detached": 1.0},
    }
    made = {name: (write_sweep(folder / name.replace(" ", "_"), runs), None) for name, runs in kinds.items()}
    for name, ratios in costs.items():
        sweep = write_sweep(folder / name.replace(" ", "_"), [SyntheticRun("sum", **W2), SyntheticRun("local", **W2)])
        write_cost_job(sweep / "cost", ratios, noise=0.01 if name == "null fails" else 0.02)
        made[f"cost {name}"] = (sweep, ratios)
    return made


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    made = sweeps_of_every_kind(tmp_path_factory.mktemp("kinds"))
    results = {}
    for name, (sweep, _) in made.items():
        results[name] = analyze([sweep], sweep / "analysis", make_plots=False, wandb_mode="disabled")
    return results


def first_lines(report: str) -> dict[str, str]:
    """Each section's heading and the first line after it."""
    lines = report.splitlines()
    return {
        line: next(after for after in lines[i + 1 :] if after) for i, line in enumerate(lines) if line.startswith("## ")
    }


def test_every_section_opens_with_its_answer_in_one_sentence(reports):
    for name, result in reports.items():
        for heading, first in first_lines(result.report.read_text()).items():
            assert not first.startswith(("|", "!", "- ", "#")), (name, heading, first)  # words before any table
            assert first.endswith("."), (name, heading, first)
            if heading in QUESTIONS:
                question = QUESTIONS[heading]
                assert first.startswith(question) and first[len(question) :].startswith(ANSWERS), (name, first)


def test_the_answers_say_what_the_runs_were_built_to_show(reports):
    modes = first_lines(reports["modes"].report.read_text())
    assert modes["## Answer"] == (
        "`fsdp_sum` and `scaled` give the baseline's gradient; `local` and `detached` give the baseline's gradient "
        "divided by W (×1/2 at W=2); `mean_of_means` gives a different gradient."
    )
    assert modes["## Verdicts"].startswith(QUESTIONS["## Verdicts"] + "No, 1 of 8 differ (`fsdp_sum` in ")
    assert modes["## Verdicts"].endswith(": failed, expected equivalent).")
    assert modes["## Runs that did not complete"] == "Did every run complete? No, 1 of 8 did not (1 failed)."
    assert modes["## Communication per step"] == (
        "`sum` issues 3 more loss all-reduces per step than `local`; `detached` issues 1 more loss all-reduce per "
        "step than `local` (counted on the sampled steps)."
    )
    assert modes["## Invariance to the layout"].endswith("Not measured: every config ran in one layout "
                                                          "(sweep world_size, sp or grad_accum to see this).")  # fmt: skip
    assert modes["## Cost, measured interleaved"].startswith(
        QUESTIONS["## Cost, measured interleaved"] + "Not measured: this analysis holds no interleaved cost job."
    )

    layouts = first_lines(reports["layouts"].report.read_text())
    assert layouts["## Answer"] == (
        "`sum` gives the baseline's gradient; `local` gives the baseline's gradient divided by W (×1/2 at W=2, ×1/4 "
        "at W=4)."
    )
    assert layouts["## Invariance to the layout"].endswith(
        "Yes, `local` with world_size; `sum` gives the same curve in every layout tried."
    )
    assert layouts["## Verdicts"] == QUESTIONS["## Verdicts"] + "Yes, all 5 judged."

    post_training = first_lines(reports["post training"].report.read_text())
    assert post_training["## Post-training aggregation"] == QUESTIONS["## Post-training aggregation"] + (
        "No, 2 of 3 are (`sum`, `GRPO`); `bnpo` changes direction with dp (over the axes this analysis varied: dp "
        "and grad_accum; sp not varied, so not tested)."
    )
    assert post_training["## Answer"] == post_training["## Post-training aggregation"]  # a post-training sweep's first
    assert "## Post-training aggregation" not in reports["modes"].report.read_text()  # no objective=pg run there

    trainers = first_lines(reports["trainers"].report.read_text())
    trainers_answer = QUESTIONS["## Trainers"] + "No, 1 of 2 do; `sum[identity]` gives grad L × 1/2."
    assert trainers["## Trainers"] == trainers_answer and trainers["## Answer"] == trainers_answer


def test_the_cost_answer_follows_the_interleaved_verdicts(reports):
    for name, result in reports.items():
        if not name.startswith("cost "):
            continue
        answer = first_lines(result.report.read_text())["## Cost, measured interleaved"]
        said = answer[len(QUESTIONS["## Cost, measured interleaved"]) :]
        cost = result.cost.set_index("mode")
        steps = int(cost["steps"].iloc[0])
        where = f"at DP(2)-SP(1)-GA(2) over {steps} paired steps"
        if name == "cost resolved":
            sum_row, detached = cost.loc["sum"], cost.loc["detached"]
            assert (sum_row["verdict"], detached["verdict"]) == ("resolved", "not resolved")
            assert sum_row["ci_low"] <= 1.08 <= sum_row["ci_high"]
            assert said == (
                f"Yes, `sum` takes {sum_row['extra_ms']:.2f} ms ({(sum_row['ratio'] - 1) * 100:.1f} %) a step more than "
                f"`local` {where}; `detached` {detached['extra_ci_high']:+.2f} ms at most (not resolved)."
            )
        elif name == "cost unresolved":
            assert (cost.loc[["sum", "detached"], "verdict"] == "not resolved").all()
            assert said.startswith(f"Not that this measurement can tell {where}: at most `sum` +")
        elif name == "cost null fails":
            assert (cost["verdict"] == "null control failed").any()
            assert said == f"Not stated {where}: the null control failed, so this machine's noise is not under control."
        else:
            assert said == f"Not stated {where}: no null control (`fsdp_sum` or `scaled`) was measured."
