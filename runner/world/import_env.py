"""The environment variables that a process reads while it starts and imports what the fork server preloads.

A rank forked from `runner.world.fork_server` inherits what the server's interpreter and its imports made of
these variables: the hash seed, OpenMP's and OpenBLAS's thread counts, the locale, torch's logging and
compile settings, the temporary folder `tempfile` settled on. A rank whose environment differs from the
server's in any of them would silently differ from a fresh interpreter, so it is started as one
(`runner.sweep.forked`). The list comes from tracing the server's preload (getenv in C and `os.environ` in
Python; `tests/test_fork_server.py` traces the Python side again and fails on a name left out), widened to
whole prefixes so that a variable of the same family read by a later version is covered too.
"""

from __future__ import annotations

from collections.abc import Mapping

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
