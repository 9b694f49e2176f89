"""The environment variables that a process reads while it starts and imports what the fork server preloads.

A rank forked from `runner.world.fork_server` inherits what the server's interpreter and its imports made of
these variables: the hash seed, OpenMP's and OpenBLAS's thread counts, the locale, torch's logging and
compile settings, the temporary folder `tempfile` settled on. A rank whose environment differs from the
server's in any of them would silently differ from a fresh interpreter, so it is started as one
(`runner.sweep.forked`). The list comes from tracing the server's preload (getenv in C and `os.environ` in
Python), widened to whole prefixes so that a variable of the same family read by a later version is covered
too. `python -m runner.world.import_env` traces the Python side again and prints the names it misses
(`tests/test_fork_server.py` fails on any).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable, Mapping

# Families read at start-up or import: the interpreter (PYTHON*), the C runtime (LD_*, LC_*), OpenMP (libgomp,
# Intel's), MKL and oneDNN, OpenBLAS, numpy, torch and its compilers, profilers and distributed modules,
# CUDA and NCCL (read at device and group set-up, compared all the same), the Fortran runtime numpy's BLAS
# loads, and the pure-Python libraries the preload pulls in (tqdm, sympy, mpmath, protobuf, OpenTelemetry).
PREFIXES = (
    "PYTHON",
    "_PYTHON",
    "LD_",
    "LC_",
    "OMP_",
    "GOMP_",
    "KMP_",
    "MKL",
    "ONEDNN_",
    "DNNL_",
    "OPENBLAS_",
    "GOTO_",
    "NPY_",
    "NUMPY_",
    "TORCH",
    "PYTORCH_",
    "KINETO_",
    "COMPILE_STROBELIGHT_",
    "FX_",
    "CUDA_",
    "NCCL_",
    "GFORTRAN_",
    "I_MPI_",
    "OMPI_",
    "MPI_",
    "OPENSSL_",
    "TQDM_",
    "SYMPY_",
    "MPMATH_",
    "PROTOCOL_BUFFERS_",
    "OTEL_",
    "SPT_",
)
NAMES = frozenset(
    {
        "HOME",  # the user's site-packages folder on sys.path
        "PATH",
        "LANG",
        "LANGUAGE",
        "TMPDIR",  # tempfile's folder, settled during the preload
        "TEMP",
        "TMP",
        "LOGLEVEL",  # torch.distributed.elastic's loggers
        "ACC_DEVICE_NUM",  # libgomp
        "ACC_DEVICE_TYPE",
        "INTEL_LIBITTNOTIFY64",
        "SAGE_ROOT",
        "ANDROID_DATA",
        "PYDANTIC_DISABLE_PLUGINS",
        "TEMPORARILY_DISABLE_PROTOBUF_VERSION_CHECK",
        "WANDB_INSECURE_DISABLE_SSL",
        "__PYVENV_LAUNCHER__",
    }
)
# Read at start-up too, but a forked rank makes of them what a fresh interpreter would (`fork_server._become`):
# sys.path from PYTHONPATH, unbuffered output streams, no byte-code written.
SET_IN_THE_CHILD = frozenset({"PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE"})


def read_at_import(name: str) -> bool:
    """Whether a rank forked from a server started without `name`, or with another value, could differ for it."""
    if name in SET_IN_THE_CHILD:
        return False
    return name in NAMES or name.startswith(PREFIXES)


def differences(server: Mapping[str, str], request: Mapping[str, str]) -> list[str]:
    """The variables read at import that the request's environment and the server's do not share."""
    names = {name for name in (*server, *request) if read_at_import(name)}
    return sorted(name for name in names if server.get(name) != request.get(name))


def reads_of(modules: Iterable[str]) -> set[str]:
    """The variables read by name while `modules` are imported (those not imported yet: run it in a fresh process)."""
    read: set[str] = set()

    class Recording(type(os.environ)):
        def __getitem__(self, key):
            if sys._getframe(1).f_code.co_name != "__iter__":  # a scan of every name reads none in particular
                read.add(key)
            return super().__getitem__(key)

    environ = os.environ  # the wrapper shares its variables: nothing is set or cleared by these assignments
    os.environ = Recording(  # noqa: B003
        environ._data, environ.encodekey, environ.decodekey, environ.encodevalue, environ.decodevalue
    )
    try:
        for name in modules:
            importlib.import_module(name)
    finally:
        os.environ = environ  # noqa: B003
    return read


def unlisted_reads() -> tuple[int, list[str]]:
    """Import what the fork server preloads, noting each variable read by name: how many, and those missed here.

    Run it in a process of its own (`python -m runner.world.import_env`): the modules it imports stay imported.
    """
    read = reads_of(["runner.world.fork_server"])  # the server's own module, then what it preloads
    from runner.world.fork_server import PRELOADED

    read |= reads_of(PRELOADED)
    return len(read), sorted(name for name in read if not read_at_import(name) and name not in SET_IN_THE_CHILD)


if __name__ == "__main__":
    count, missed = unlisted_reads()
    print(count, *missed)
