"""A stop asked of a checkpointing run: save where it stands, then end (`train.checkpoint_every` > 0).

SIGTERM (what the launcher sends its ranks on Ctrl-C or SIGTERM, and SLURM at a kill), SIGUSR1 and SIGUSR2
(what SLURM sends ahead of a time limit or a preemption with `--signal`, and submitit asks for) are noted, not
acted on mid-step. At the end of each step the ranks agree with one scalar all-reduce (MAX), so that they
stop after the same step even when the signal reached one rank only (under SLURM, submitit's rank 0). All then
save that step's checkpoint and leave the loop; a rerun resumes from it. The handler that was there before
(submitit's, which requeues the job) is called once the checkpoint is saved.

Only a run that keeps checkpoints installs it: otherwise the signals keep their usual meaning and no
collective is added to a step.
"""

from __future__ import annotations

import signal

import torch
import torch.distributed as dist

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


class StopRequest:
    def __init__(self):
        self.signum = 0
        self.previous = {}
        for signum in SIGNALS:
            self.previous[signum] = signal.signal(signum, self._note)

    def _note(self, signum, frame) -> None:
        self.signum = self.signum or signum

    def agreed(self, group: dist.ProcessGroup, device: torch.device) -> int:
        """The signal any rank noted (0: none), the same on every rank (collective)."""
        asked = torch.tensor([self.signum], dtype=torch.int64, device=device)
        dist.all_reduce(asked, op=dist.ReduceOp.MAX, group=group)
        return int(asked.item())

    def restore(self) -> None:
        """The handlers that were there before, in place again."""
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def hand_on(self) -> None:
        """After the checkpoint: the earlier handler of the signal this rank noted (submitit's requeues and exits)."""
        handler = self.previous.get(self.signum)
        self.restore()
        if callable(handler):
            handler(self.signum, None)
