"""Process-level runtime settings shared by every script: threads and devices.

On small machines an eigen-decomposition or a 32x32 matmul run with more BLAS/OpenMP
threads than cores is many times slower than single-threaded, and the number of threads
can change the order of floating-point reductions (so results stop being bit-identical
between runs). Every script therefore pins the thread pools to the job's ``threads``
before it does any numerical work.
"""

from __future__ import annotations

import os

_THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


def pin_threads(n: int) -> int:
    """Limit BLAS, OpenMP and torch intra-op threads to ``n`` (at least 1).

    Environment variables only take effect for libraries loaded afterwards, so this
    also uses threadpoolctl (when present) and torch's own setter for libraries that
    are already loaded. Returns the number of threads set.
    """
    n = max(1, int(n))
    for var in _THREAD_VARS:
        os.environ[var] = str(n)
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(n)
    except ImportError:  # pragma: no cover - threadpoolctl ships with scipy/sklearn stacks
        pass
    try:
        import torch

        torch.set_num_threads(n)
        if torch.get_num_interop_threads() != 1:
            try:
                torch.set_num_interop_threads(1)
            except RuntimeError:  # already started parallel work; harmless
                pass
    except ImportError:  # pragma: no cover
        pass
    return n


def torch_device(gpu: int | float | None) -> str:
    """The torch device a job should use: CUDA when the job's ``gpu`` resource asks for
    one and CUDA is present, else the CPU.

    A job that was granted no GPU never touches CUDA, even on a GPU node, so that a
    CPU-tagged job cannot steal an accelerator scheduled for another job.
    """
    import torch

    if gpu and float(gpu) > 0 and torch.cuda.is_available():
        return "cuda"
    return "cpu"


def release_freed_memory() -> None:
    """Return memory that was freed back to the operating system (glibc only; a no-op
    elsewhere).

    Streaming a checkpoint allocates and frees one layer's float64 matrices per block.
    glibc raises its mmap threshold after the first large free, so later layers land on
    the heap, whose freed pages it keeps: resident memory then creeps up by about a
    matrix per layer although nothing is alive. ``malloc_trim`` hands those pages back,
    which keeps the extraction's peak at the order of one layer.
    """
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # musl or another libc: nothing to trim
        pass
