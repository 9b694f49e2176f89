"""The double-GA-scaling bug arm (conf/bug/double_ga_scaling.yaml) held to the transformers releases that shipped
each state: the real released `transformers.Trainer`, installed from the package index, trains one optimizer step.

Each release runs in a subprocess with its own folder first on PYTHONPATH (.cache/release-parity/transformers-V,
installed once with uv, its dependencies pinned as they stood at the release; the rest is this venv's), on a
tiny model whose forward takes no loss kwargs (tests/release_parity_trainer.py: no download of any kind), CPU,
gradient_accumulation_steps = M (the bug's grad_accum), on packed rows (every micro-batch holds as many
targets). What it gives, the gradient accumulated before the optimizer step (`on_pre_optimizer_step`, clipping
off) and the logged loss, is held to the project's own rules called on the same model and rows in this process
as the runner calls them (fn(logits, labels, ctx), once per micro-batch, after the rule's start_step):
- 4.46.0 and 4.47.1 (the bug's first and last release): the buggy arm (`transformers_bugs:double_ga`) exactly,
  gradient and logged loss, each M x the fixed arm's;
- 4.47.0: the buggy arm's gradient, the fixed arm's logged loss (4.46.2 to 4.47.0 divide the logged loss by M:
  they pass no num_items_in_batch to a model without loss kwargs; 4.46.0-4.46.1 log x M through an in-place
  `loss *= M`, 4.47.1 through PR #35121's count for every model);
- 4.48.0 (PR #35207) and 4.48.1 (PR #35438): the fixed arm (`hf_trainer:no_loss_kwargs`), gradient and loss.

Skipped, saying so, only where the package index cannot be reached to install a release.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from release_parity_trainer import TinyLM

from runner.callables import resolve_callable
from runner.train.custom_rule import LossContext, StepContext

REPO = Path(__file__).resolve().parents[1]
BUG = OmegaConf.load(REPO / "conf" / "bug" / "double_ga_scaling.yaml")
M = BUG.grad_accum
CACHE = REPO / ".cache" / "release-parity"
# Each release with the tokenizers, huggingface_hub and accelerate of its day (the venv's are too new for it);
# torch, numpy, safetensors, requests and the rest come from this venv.
RELEASES = {
    "4.46.0": ("tokenizers==0.20.3", "huggingface-hub==0.26.1", "accelerate==1.0.1"),
    "4.47.0": ("tokenizers==0.21.0", "huggingface-hub==0.26.5", "accelerate==1.2.0"),
    "4.47.1": ("tokenizers==0.21.0", "huggingface-hub==0.27.0", "accelerate==1.2.1"),
    "4.48.0": ("tokenizers==0.21.0", "huggingface-hub==0.27.1", "accelerate==1.2.1"),
    "4.48.1": ("tokenizers==0.21.0", "huggingface-hub==0.27.1", "accelerate==1.3.0"),
}
# The arm each release's (gradient, logged loss) is.
ARMS_OF = {
    "4.46.0": ("buggy", "buggy"),
    "4.47.0": ("buggy", "fixed"),
    "4.47.1": ("buggy", "buggy"),
    "4.48.0": ("fixed", "fixed"),
    "4.48.1": ("fixed", "fixed"),
}
VOCAB, WIDTH, ROWS, SEQ = 32, 16, 2 * M, 12  # two rows per micro-batch, every target valid (packed)


def _uv() -> list[str]:
    beside = Path(sys.executable).parent / "uv"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("uv")
    return [found] if found else [sys.executable, "-m", "uv"]


def _index_unreachable() -> str | None:
    """Why the package index uv installs from cannot be reached, or None where it answers (any HTTP status)."""
    index = os.environ.get("UV_DEFAULT_INDEX") or os.environ.get("UV_INDEX_URL") or "https://pypi.org/simple"
    try:
        urllib.request.urlopen(f"{index.rstrip('/')}/transformers/", timeout=20).close()
    except urllib.error.HTTPError:
        return None
    except OSError as error:
        return f"the package index {index} is unreachable ({error})"
    return None


def installed(version: str) -> Path:
    """.cache/release-parity/transformers-VERSION, installed once (a finished install is renamed into place)."""
    target = CACHE / f"transformers-{version}"
    specs = [f"transformers=={version}", *RELEASES[version], "psutil==7.2.2"]  # psutil: accelerate's one more
    stamp = "\n".join(specs)
    if (target / "release-parity.txt").is_file() and (target / "release-parity.txt").read_text() == stamp:
        return target
    shutil.rmtree(target, ignore_errors=True)  # none yet, or installed with other pins
    CACHE.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".transformers-{version}-", dir=CACHE))
    command = [*_uv(), "pip", "install", "--quiet", "--no-deps", "--python", sys.executable, "--target", str(staging)]
    done = subprocess.run([*command, *specs], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        why = _index_unreachable()
        if why:
            pytest.skip(f"cannot install transformers {version}: {why}")
        pytest.fail(f"uv could not install {specs} (the index answers):\n{done.stdout}{done.stderr}")
    (staging / "release-parity.txt").write_text(stamp)
    try:
        staging.rename(target)
    except OSError:  # another process installed it first
        shutil.rmtree(staging, ignore_errors=True)
    return target


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> dict:
    """The model's initial weights and the packed rows: (input_ids, labels shifted by one), all targets valid."""
    torch.manual_seed(0)
    model = TinyLM(VOCAB, WIDTH)
    tokens = torch.randint(0, VOCAB, (ROWS, SEQ + 1), generator=torch.Generator().manual_seed(1))
    folder = tmp_path_factory.mktemp("release-parity")
    case = {
        "shape": (VOCAB, WIDTH),
        "state": model.state_dict(),
        "inputs": tokens[:, :-1].clone(),
        "labels": tokens[:, 1:].clone(),
        "grad_accum": M,
        "output_dir": str(folder / "trainer"),
    }
    torch.save(case, folder / "case.pt")
    return {**case, "path": folder / "case.pt", "folder": folder}


def release_step(version: str, case: dict) -> dict:
    """One optimizer step of the released Trainer, in a subprocess with the release first on PYTHONPATH."""
    target = installed(version)
    out = case["folder"] / f"out-{version}.pt"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(target), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "HF_HUB_OFFLINE": "1",  # nothing fetched: the model is built here, the rows are tensors
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HOME": str(case["folder"] / "hf"),
        "WANDB_MODE": "disabled",
        "OMP_NUM_THREADS": "1",
    }
    script = Path(__file__).with_name("release_parity_trainer.py")
    done = subprocess.run(
        [sys.executable, str(script), str(case["path"]), str(out)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"transformers {version}:\n{done.stdout}{done.stderr[-6000:]}"
    return torch.load(out)


def arm_step(arm: str, case: dict) -> dict:
    """The arm's rule (the bug's custom.fn) on the same model and micro-batches, one process (W = 1), as the
    runner's CustomReducer calls it: start_step on the step's labels, then fn(logits, labels, ctx) per micro-batch,
    each loss backpropagated; logged = the sum of what it logs (the runner's, at W = 1)."""
    rule = resolve_callable(BUG.known_bug[arm].fn)
    model = TinyLM(*case["shape"])
    model.load_state_dict(case["state"])
    inputs, labels = case["inputs"].chunk(M), case["labels"].chunk(M)
    tokens = sum(int((rows != -100).sum()) for rows in labels)
    step = StepContext(
        world_size=1, dp=1, sp=1, rank=0, dp_rank=0, sp_rank=0, grad_accum=M, global_tokens=tokens,
        rank_tokens=tokens, rank_sequence_tokens=tokens, labels=labels, sequence_labels=labels, world_group=None,
        dp_group=None, sp_group=None, device=torch.device("cpu"), sequences=ROWS,
    )  # fmt: skip
    start = getattr(rule, "start_step", None)
    plan = start(step) if start is not None else None
    logged = 0.0
    for m, (rows, targets) in enumerate(zip(inputs, labels)):
        valid = int((targets != -100).sum())
        ctx = LossContext(**{**vars(step), "plan": plan}, micro_batch=m, shard_tokens=valid, sequence_tokens=valid)
        loss, shown = rule(model(rows)["logits"], targets, ctx)
        loss.backward()
        logged += float(shown)
    return {"grads": {n: p.grad for n, p in model.named_parameters()}, "logged": logged}


def flat(grads: dict) -> torch.Tensor:
    return torch.cat([g.flatten() for _, g in sorted(grads.items())])


@pytest.fixture(scope="module")
def arms(case) -> dict:
    return {arm: arm_step(arm, case) for arm in ("buggy", "fixed")}


def test_the_stated_releases_are_the_bugs_range_and_its_fixes():
    assert BUG.known_bug.buggy.expect == str(M) and M > 1  # the buggy arm's gradient is stated as M x grad L
    assert "4.46.0-4.47.1" in BUG.known_bug.reference and "4.48.1" in BUG.known_bug.reference


@pytest.mark.slow
@pytest.mark.parametrize("version", sorted(RELEASES))
def test_the_released_trainer_gives_the_arm_of_its_state(version, case, arms):
    got = release_step(version, case)
    assert got["version"] == version and got["accepts_loss_kwargs"] is False  # that release ran, on this model
    assert len(got["returned"]) == M and len(got["logged"]) == 1  # M micro-batches, one optimizer step, one log
    buggy, fixed = flat(arms["buggy"]["grads"]), flat(arms["fixed"]["grads"])
    torch.testing.assert_close(buggy, M * fixed, rtol=1e-5, atol=1e-7)  # the arms differ by M
    assert arms["buggy"]["logged"] == pytest.approx(M * arms["fixed"]["logged"], rel=1e-6)
    gradient_arm, logged_arm = ARMS_OF[version]
    grad = flat(got["grads"])
    ratio = grad.norm().item() / fixed.norm().item()
    torch.testing.assert_close(
        grad,
        flat(arms[gradient_arm]["grads"]),
        rtol=1e-5,
        atol=1e-7,
        msg=lambda m: f"{version}: ||g|| / the fixed arm's {ratio:.6f}, not the {gradient_arm} arm's; {m}",
    )
    # the logged loss: the sum of training_step's returns over the M micro-batches (log_history rounds it to 4)
    logged = arms[logged_arm]["logged"]
    assert sum(got["returned"]) == pytest.approx(logged, rel=1e-5), (version, got["returned"], logged_arm, logged)
    assert got["logged"][0] == pytest.approx(logged, abs=1e-4), version
