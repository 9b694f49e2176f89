"""A counter of every collective this rank issues: calls, payload bytes and seconds per kind; both loops use it
(the training loop through `meter.py`, the cost loop in `runner.measure.cost`).

It is a TorchDispatchMode, so it sees each collective where it enters the
dispatcher: the c10d ops behind `torch.distributed.*` (FSDP2's all-gathers
and reduce-scatters, in forward and backward), the functional collectives
(`funcol.all_reduce` and its autograd backward), DTensor redistributions and
the all-to-alls of sequence parallelism. Nothing is tallied by hand.

- bytes: the size of the input this rank contributes (for an all-gather its
  shard, for a reduce-scatter its full buffer);
- kind: the op's (all_reduce, all_gather, ...), or the name a caller gives
  the collectives of one process group (`group_kinds`): under HSDP, FSDP's
  all-reduce of the gradients over the replicas is `replica_all_reduce`, so
  that `all_reduce` stays the loss's; a name with `{}` takes the op's kind
  into it (tensor parallelism's `tp_{}`: `tp_all_gather`, `tp_reduce_scatter`, ...);
- seconds: issue-to-completion latency, summed. c10d ops report completion
  through their Work's future (a Work without one, such as gloo's emulated
  reduce-scatter, has completed when its call returns); functional ones when
  their wait_tensor returns. Overlapping collectives each count their own latency.

The mode costs one Python call per dispatched op (see `make bench`).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Mapping

import torch
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

_KIND_OF_OP = {
    "c10d::allreduce_": "all_reduce",
    "c10d::allreduce_coalesced_": "all_reduce",
    "_c10d_functional::all_reduce": "all_reduce",
    "_c10d_functional::all_reduce_coalesced": "all_reduce",
    "c10d::_allgather_base_": "all_gather",
    "c10d::allgather_": "all_gather",
    "c10d::allgather_coalesced_": "all_gather",
    "c10d::allgather_into_tensor_coalesced_": "all_gather",
    "_c10d_functional::all_gather_into_tensor": "all_gather",
    "_c10d_functional::all_gather_into_tensor_coalesced": "all_gather",
    "c10d::_reduce_scatter_base_": "reduce_scatter",
    "c10d::reduce_scatter_": "reduce_scatter",
    "c10d::reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "_c10d_functional::reduce_scatter_tensor": "reduce_scatter",
    "_c10d_functional::reduce_scatter_tensor_coalesced": "reduce_scatter",
    "c10d::alltoall_": "all_to_all",
    "c10d::alltoall_base_": "all_to_all",
    "_c10d_functional::all_to_all_single": "all_to_all",
    "_c10d_functional_autograd::all_to_all_single": "all_to_all",
    "c10d::broadcast_": "broadcast",
    "_c10d_functional::broadcast": "broadcast",
    "c10d::reduce_": "reduce",
    "c10d::gather_": "gather",
    "c10d::scatter_": "scatter",
    "c10d::barrier": "barrier",
    "c10d::send": "send",  # pipeline parallelism's activations and their gradients, stage to stage
    "c10d::recv_": "recv",
}
# Schema names of the argument that holds this rank's contribution.
_INPUT_ARGS = ("input_tensor", "input", "input_tensors", "inputs", "input_list", "tensors")
_WAIT_TENSOR = "_c10d_functional::wait_tensor"
_DESUGARING_SUBCLASSES = (DTensor, AsyncCollectiveTensor)


def _nbytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(item) for item in value)
    return 0


def _payload_bytes(func, args, kwargs) -> int:
    for position, argument in enumerate(func._schema.arguments):
        if argument.name in _INPUT_ARGS:
            value = args[position] if position < len(args) else kwargs.get(argument.name)
            return _nbytes(value)
    return 0


def _group_name(func, args, kwargs) -> str | None:
    """The process group's name of a collective: c10d ops take the group (boxed), functional ones its name."""
    for position, argument in enumerate(func._schema.arguments):
        if argument.name in ("process_group", "group_name"):
            value = args[position] if position < len(args) else kwargs.get(argument.name)
            if isinstance(value, torch.ScriptObject):
                return torch._C._distributed_c10d.ProcessGroup.unbox(value).group_name
            return value if isinstance(value, str) else None
    return None


def _first_tensor(value) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


class CollectiveCounter(TorchDispatchMode):
    def __init__(self, group_kinds: Mapping[str, str] | None = None) -> None:
        """`group_kinds`: {process group name: kind, or a pattern like "tp_{}" for the op's kind} for the
        collectives counted apart (`Meshes.group_kinds`)."""
        super().__init__()
        self._group_kinds = dict(group_kinds or {})
        self._lock = threading.Lock()
        self._calls: dict[str, int] = defaultdict(int)
        self._bytes: dict[str, int] = defaultdict(int)
        self._seconds: dict[str, float] = defaultdict(float)
        self._pending_functional: dict[int, tuple[str, float]] = {}  # storage pointer -> (kind, issue time)
        self._pending_futures: list[torch.futures.Future] = []  # c10d completions whose seconds may not be added yet

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(issubclass(t, _DESUGARING_SUBCLASSES) for t in types):
            # Modes run before tensor subclasses: step aside so that DTensor
            # (or a pending functional result) desugars into plain collectives
            # and waits, which then come through here.
            return NotImplemented
        kwargs = kwargs or {}
        name = func._schema.name
        kind = _KIND_OF_OP.get(name)
        if kind is None:
            out = func(*args, **kwargs)
            if name == _WAIT_TENSOR:
                self._finish_functional(args[0])
            return out
        if self._group_kinds:
            kind = self._group_kinds.get(_group_name(func, args, kwargs), kind).format(kind)
        issued = time.perf_counter()
        out = func(*args, **kwargs)
        with self._lock:
            self._calls[kind] += 1
            self._bytes[kind] += _payload_bytes(func, args, kwargs)
        work = out[-1] if isinstance(out, tuple) else out
        if isinstance(work, torch.ScriptObject):  # a c10d op: completion is reported by its Work
            try:
                future = torch._C._distributed_c10d.Work.unbox(work).get_future()
            except RuntimeError:  # e.g. gloo's emulated reduce-scatter: done when the call returns
                self._add_seconds(kind, time.perf_counter() - issued)
            else:
                self._pending_futures.append(
                    future.then(lambda _: self._add_seconds(kind, time.perf_counter() - issued))
                )
        else:  # a functional op: completion is its wait_tensor
            tensor = _first_tensor(out)
            if tensor is not None:
                self._pending_functional[tensor.untyped_storage().data_ptr()] = (kind, issued)
        return out

    def _finish_functional(self, tensor: torch.Tensor) -> None:
        pending = self._pending_functional.pop(tensor.untyped_storage().data_ptr(), None)
        if pending is not None:
            kind, issued = pending
            self._add_seconds(kind, time.perf_counter() - issued)

    def _add_seconds(self, kind: str, seconds: float) -> None:
        with self._lock:
            self._seconds[kind] += seconds

    def take(self) -> dict[str, dict[str, float]]:
        """{kind: {calls, bytes, seconds}} since the last take, sorted by kind; resets the counts.

        Waits for the completion callbacks of the c10d collectives issued since the
        last take: a future is marked done before its callbacks run, so without the
        wait a collective's seconds could land in the next take.
        """
        for future in self._pending_futures:
            future.wait()
        self._pending_futures.clear()
        with self._lock:
            counts = {
                kind: {"calls": self._calls[kind], "bytes": self._bytes[kind], "seconds": round(self._seconds[kind], 6)}
                for kind in sorted(self._calls)
            }
            self._calls.clear()
            self._bytes.clear()
            self._seconds.clear()
        return counts


def add_counts(*counts: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per-kind sums of several `take()` results."""
    total: dict[str, dict[str, float]] = {}
    for count in counts:
        for kind, fields in count.items():
            into = total.setdefault(kind, {"calls": 0, "bytes": 0, "seconds": 0.0})
            for field, value in fields.items():
                into[field] += value
    for fields in total.values():
        fields["seconds"] = round(fields["seconds"], 6)
    return dict(sorted(total.items()))
