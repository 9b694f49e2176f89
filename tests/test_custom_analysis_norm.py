"""A rule whose grad_norm hook logs another norm than its gradient's (true_grad_norm, recorded beside it) is
judged on its gradient, and every sentence about it says what its logged norm is to the gradient's."""

from __future__ import annotations

from analysis.pipeline import analyze
from analysis.testing.synthetic import SyntheticRun, write_sweep

HOOKED = {"custom.fn": "my_rules:hooked", "custom.name": "hooked", "custom.expect": "grad L"}


def test_a_hook_norm_twice_the_gradients_is_said_beside_its_verdict(tmp_path):
    runs = [
        SyntheticRun("sum"),
        SyntheticRun("custom", norm_factor=2.0, norm_hook=True, overrides=HOOKED),
        SyntheticRun("custom", norm_hook=True, overrides={**HOOKED, "custom.name": "honest"}),  # the null control
    ]
    result = analyze([write_sweep(tmp_path / "sweep", runs)], tmp_path / "out", make_plots=False, wandb_mode="disabled")
    verdicts = result.verdicts.set_index("reduction")
    hooked, honest = verdicts.loc["hooked [FSDP mean]"], verdicts.loc["honest [FSDP mean]"]
    assert hooked["verdict"] == "equivalent" and hooked["hook_norm_ratio_median"] == 2.0
    assert hooked["verdict_text"] == "equivalent (its logged grad norm ×2 the gradient's: the rule's grad_norm hook)"
    assert honest["verdict_text"] == "identical" and honest["hook_norm_ratio_median"] == 1.0
    report = result.report.read_text()
    [sentence] = [line for line in report.splitlines() if line.startswith("- `hooked [FSDP mean]`")]
    assert "; its logged grad norm (the rule's grad_norm hook) is ×2 the gradient's norm; expected" in sentence
    [null] = [line for line in report.splitlines() if line.startswith("- `honest [FSDP mean]`")]
    assert "grad_norm hook" not in null
