"""The trainers' Answer counts only the runs compared with a reference: one without a reference is named, never a
"no". Generated over every mix of verdicts for three rules."""

from __future__ import annotations

import itertools

import pandas as pd

from analysis.report.trainers import QUESTION, trainers_answer

VERDICTS = {  # verdict -> what the run's gradient was found to be
    "as expected": "grad L",
    "different": "grad L × 1/2",
    "no reference": "",
    "failed": "",
}


def test_only_runs_compared_with_a_reference_answer_the_question():
    for mix in itertools.product(VERDICTS, repeat=3):
        rows = pd.DataFrame(
            {
                "reduction": [f"rule{n}" for n in range(3)],
                "verdict": list(mix),
                "gradient_vs_grad_L": [VERDICTS[verdict] for verdict in mix],
            }
        )
        answer = trainers_answer(rows)
        compared = [verdict for verdict in mix if verdict in ("as expected", "different")]
        true = mix.count("as expected")
        assert answer.startswith(QUESTION), answer
        if not compared:
            assert "Not measured: no trainer's run here was compared with a reference" in answer, (mix, answer)
        elif true == 3:
            assert answer == f"{QUESTION} Yes, all 3 do.", (mix, answer)
        elif len(compared) == 3:
            assert f"No, {true} of 3 do;" in answer, (mix, answer)
        else:
            assert f"No, {true} of the {len(compared)} compared with a reference do;" in answer, (mix, answer)
        for n, verdict in enumerate(mix):  # every run that did not give grad L is named with what it gave
            if verdict in ("no reference", "failed"):
                assert f"`rule{n}` {verdict}" in answer, (mix, answer)
            elif verdict == "different":
                assert f"`rule{n}` gives grad L × 1/2" in answer, (mix, answer)
