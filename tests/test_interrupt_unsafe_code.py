"""A signal that lands inside OmegaConf (Hydra composes with it) is raised once the process is out of it.

Raised between two of OmegaConf's bytecodes, `Interrupted` broke its flag restoring (`flag_override`'s
`finally` then failed with an AttributeError that replaced it, and Hydra printed that traceback; seen once in
50 signals at random moments of a sweep). Here the main thread spends about half its time in OmegaConf's
list assignment while a timer signals it; every try must end in `Interrupted`, raised outside OmegaConf.
"""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import os, signal, sys, threading, traceback
from runner.sweep import interrupts
interrupts.install()
from omegaconf import OmegaConf
cfg = OmegaConf.create({"a": list(range(50))})
threading.Timer(float(sys.argv[1]), os.kill, (os.getpid(), int(sys.argv[2]))).start()
try:
    while True:
        cfg.a = list(range(50))
        sum(range(2000))  # outside OmegaConf a while, about as long as inside: where the deferred signal is raised
except interrupts.Interrupted as stop:
    innermost = traceback.extract_tb(stop.__traceback__)[-1]
    print(stop.name, "omegaconf" in innermost.filename, cfg.a[49])
"""


def test_a_signal_inside_omegaconf_is_raised_outside_it_and_leaves_the_config_whole():
    for n in range(10):
        signum = (2, 15)[n % 2]
        done = subprocess.run(
            [sys.executable, "-c", PROBE, str(0.05 + 0.01 * n), str(signum)], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == [{2: "SIGINT", 15: "SIGTERM"}[signum], "False", "49"], done.stderr
