"""The analysis with `dp_replicate` as a layout axis, on synthetic sweeps whose answers are known by construction."""

from __future__ import annotations

from analysis.pipeline import analyze
from analysis.testing.synthetic import SyntheticRun, write_sweep

HSDP = {"dp_replicate": 2}


def test_replicas_are_a_layout_of_the_family_and_keep_the_factor_over_w(tmp_path):
    """W=4 as FSDP and as 2 replicas of 2 shards: one family, the W=1 `sum` its ground truth, `local` grad L / 4
    at both, and an invariance row for the dp_replicate axis."""
    runs = [SyntheticRun("sum", world_size=1)]
    for overrides in (None, HSDP):
        runs += [
            SyntheticRun("sum", world_size=4, factor=1 + 1e-8, overrides=overrides),
            SyntheticRun("local", world_size=4, factor=1 / 4, loss_shift_from=30, overrides=overrides),
        ]
    sweep = write_sweep(tmp_path / "sweep", runs)
    result = analyze([sweep], tmp_path / "out", wandb_mode="disabled", make_plots=False)
    verdicts = result.verdicts
    assert verdicts["family"].nunique() == 1
    ground_truth = verdicts.loc[verdicts["world_size"] == 1, "run"].item()
    assert (verdicts["baseline"] == ground_truth).all()
    by_layout = verdicts.set_index(["reduction", "layout"])["verdict_text"].to_dict()
    assert by_layout == {
        ("sum", "DP(1)-SP(1)-GA(1)"): "reference",
        ("sum", "DP(4)-SP(1)-GA(1)"): "equivalent",
        ("local", "DP(4)-SP(1)-GA(1)"): "rescaled ×1/4",
        ("sum", "DP(2x2)-SP(1)-GA(1)"): "equivalent",
        ("local", "DP(2x2)-SP(1)-GA(1)"): "rescaled ×1/4",
    }
    assert verdicts["as_expected"].all()
    invariance = result.invariance.set_index(["reduction", "axis"])
    for mode in ("sum", "local"):
        assert invariance.loc[(mode, "dp_replicate"), "values"] == "1,2"
        assert not invariance.loc[(mode, "dp_replicate"), "changes"]


def test_a_gradient_averaged_over_the_shards_only_is_not_as_expected(tmp_path):
    """At dp_replicate=2 W=4, `local` is expected at grad L / 4 (FSDP's mean over all W), so a run at grad L / 2,
    a mean over one replica's shards only, is flagged."""
    runs = [
        SyntheticRun("sum", world_size=4, overrides=HSDP),
        SyntheticRun("local", world_size=4, factor=1 / 2, overrides=HSDP),
    ]
    sweep = write_sweep(tmp_path / "sweep", runs)
    verdicts = analyze([sweep], tmp_path / "out", wandb_mode="disabled", make_plots=False).verdicts
    local = verdicts[verdicts["reduction"] == "local"].iloc[0]
    assert local["layout"] == "DP(2x2)-SP(1)-GA(1)"
    assert local["verdict_text"] == "rescaled ×1/2" and not local["as_expected"]
