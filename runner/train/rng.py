"""Every random draw of a rank's step from (seed, step, rank) alone.

The batch, the learning rate and the gradient sketch are functions of (seed, step) already; what is left is
what a model draws from the global generators while it trains: dropout (`nn.Dropout`, the `dropout_p` a
Hugging Face attention passes to SDPA), and whatever a custom rule or hook draws from `random` or NumPy.
`seed_step` sets all of them at the start of every optimizer step, so that

- the same config gives the same loss bit for bit, in a fresh interpreter and in a rank forked from the
  fork server (whose generators every fork would otherwise inherit, one state for every rank and job);
- the ranks draw different masks (each rank's share of the batch is its own, as in any data-parallel
  trainer), and two runs at one layout draw the same masks on each rank, so modes compare at one layout;
- a resumed run draws what the uninterrupted run drew: the step's state depends on nothing before it.

Two layouts draw different masks for the same token (rank r of W holds other tokens than rank r of W'),
so with dropout a run's gradient is not the single-process reference's; the analysis then compares a
run with its own layout's `sum` run only (`analysis.gradients.groups`).
"""

from __future__ import annotations

import hashlib
import random

import numpy as np
import torch


def step_seed(seed: int, step: int, rank: int) -> int:
    """A 63-bit seed of its own for each (seed, step, rank); step 0 is the rank's set-up before step 1."""
    digest = hashlib.sha256(f"{seed}:{step}:{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def seed_step(seed: int, step: int, rank: int) -> None:
    """Seed torch's CPU and CUDA generators, Python's `random` and NumPy's global generator for this step."""
    value = step_seed(seed, step, rank)
    torch.manual_seed(value)  # every device's default generator
    random.seed(value)
    np.random.seed(value % 2**32)


def dropout_in(model: torch.nn.Module) -> str | None:
    """What of `model` draws at random in training, in words ("attention_dropout=0.1, Dropout p=0.1 x 5"),
    or None: its `nn.Dropout` modules with p > 0 and a Hugging Face config's dropout probabilities above 0
    (an attention's dropout goes to SDPA as `dropout_p`, with no module of its own)."""
    found = []
    config = getattr(getattr(model, "hf", None), "config", None)
    if config is not None:
        settings = config.get_text_config().to_dict()
        found += [
            f"{key}={value:g}"
            for key, value in sorted(settings.items())
            if ("dropout" in key or "pdrop" in key) and isinstance(value, float) and value > 0
        ]
    probabilities = [m.p for m in model.modules() if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0]
    for p in sorted(set(probabilities)):
        found.append(f"Dropout p={p:g} x {probabilities.count(p)}")
    return ", ".join(found) or None
