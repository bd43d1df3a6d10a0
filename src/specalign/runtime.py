"""Process-level runtime settings shared by every script: threads, devices, and the
Snakemake process a job belongs to.

On small machines an eigen-decomposition or a 32x32 matmul run with more BLAS/OpenMP
threads than cores is many times slower than single-threaded, and the number of threads
can change the order of floating-point reductions (so results stop being bit-identical
between runs). Every script therefore pins the thread pools to the job's ``threads``
before it does any numerical work.
"""

from __future__ import annotations

import _thread
import contextlib
import gc
import importlib.util
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

_THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
_PINNED: list[int | None] = [None]  # what pin_threads last set


def pin_threads(n: int) -> int:
    """Limit BLAS, OpenMP and torch intra-op threads to ``n`` (at least 1), and torch's
    inter-op pool to one thread.

    Environment variables only take effect for libraries loaded afterwards, so this
    also uses threadpoolctl (when present) for libraries that are already loaded. Torch
    is pinned now if it is loaded, else when it is first imported (:class:`_PinTorch`):
    importing it only to set its threads cost every job that never uses it (tables,
    figures, the commutator study) a second. Returns the number of threads set.
    """
    n = max(1, int(n))
    for var in _THREAD_VARS:
        os.environ[var] = str(n)
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(n)
    except ImportError:  # pragma: no cover - threadpoolctl ships with scipy/sklearn stacks
        pass
    _PINNED[0] = n
    if "torch" in sys.modules:
        _pin_torch(sys.modules["torch"], n)
    elif not any(isinstance(f, _PinTorch) for f in sys.meta_path):
        sys.meta_path.insert(0, _PinTorch())
    return n


def _pin_torch(torch: Any, n: int) -> None:
    torch.set_num_threads(n)
    if torch.get_num_interop_threads() != 1:
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already started parallel work; harmless
            pass


class _PinTorch:
    """A one-shot import hook: when torch is first imported, after its module has run,
    give it the threads :func:`pin_threads` set (the latest count, read then)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        # no import statement here: it would call this finder again
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)  # the real finders locate torch; never again here
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            if _PINNED[0] is not None:
                _pin_torch(module, _PINNED[0])

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def torch_device(gpu: int | float | None) -> str:
    """The torch device a job should use: CUDA when the job's ``gpu`` resource asks for
    one and CUDA is present, else the CPU.

    A job that was granted no GPU never touches CUDA, even on a GPU node, so that a
    CPU-tagged job cannot steal an accelerator scheduled for another job.
    """
    if not gpu or float(gpu) <= 0:
        return "cpu"  # without importing torch: a CPU job of numpy work never loads it
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


_SET_ASIDE = [0]  # depth of nested heap_set_aside() blocks


@contextlib.contextmanager
def heap_set_aside() -> Iterator[None]:
    """Within the block (or the decorated function), a full ``gc.collect()`` scans only
    the objects made since it began.

    Streaming frees each unit's tensors with a full collection as the next one loads
    (their Python objects sit in reference cycles). With torch and transformers imported
    a job holds about 370,000 tracked objects, and each collection took 0.2-0.33 s to
    scan them all: seconds of a small model's job, whatever its size. The objects alive
    at the start are set aside once (``gc.freeze``, after one collection, so that no
    garbage is set aside) and given back to the collector when the outermost block ends,
    however it ends; what is made and dropped inside is collected as before. A nested
    block sets aside what was made since (a streamed model built inside a decorated
    function: its modules' objects too), and everything goes back when the outermost
    block ends."""
    gc.collect()  # inside a block, scans only what is not yet set aside
    gc.freeze()
    _SET_ASIDE[0] += 1
    try:
        yield
    finally:
        _SET_ASIDE[0] -= 1
        if _SET_ASIDE[0] == 0:
            gc.unfreeze()


def release_freed_memory() -> None:
    """Return memory that was freed back to the operating system (glibc only; a no-op
    elsewhere).

    Streaming a checkpoint allocates and frees one layer's float64 matrices per block.
    glibc raises its mmap threshold after the first large free, so later layers land on
    the heap, whose freed pages it keeps: resident memory then creeps up by about a
    matrix per layer although nothing is alive. ``malloc_trim`` hands those pages back,
    which keeps the extraction's peak at the order of one layer.
    """
    _glibc_call("malloc_trim", 0)


def _glibc_call(name: str, *args: int) -> int | None:
    """glibc's function ``name`` called with ``args``; None where the libc is not glibc
    (another platform, musl: no such function), so the callers are no-ops there."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return None
    try:
        return int(getattr(ctypes.CDLL("libc.so.6"), name)(*args))
    except (OSError, AttributeError):
        return None


#: mallopt's parameter number for the mmap threshold (glibc's malloc.h)
_M_MMAP_THRESHOLD = -3
#: glibc's ceiling for its dynamic mmap threshold on 64-bit machines (4 MiB x 8)
HEAP_CEILING = 32 * 2**20


def set_mmap_threshold(nbytes: int) -> bool:
    """Have glibc map every block of at least ``nbytes`` apart from its heap, so that it
    goes back to the system when it is freed; False where the libc is not glibc.

    glibc starts at 128 KiB and raises the threshold to the size of each mapped block
    that is freed, up to :data:`HEAP_CEILING`. A streamed model allocates and frees one
    unit's float32 weights, then its activations, for every unit: after the first frees
    those blocks land on the heap, between long-lived ones, and the heap's freed pages
    stay resident. Setting the threshold ends the raising (glibc's ``mallopt``), for the
    rest of the process.
    """
    return bool(_glibc_call("mallopt", _M_MMAP_THRESHOLD, int(nbytes)))


def pinned_threads() -> int | None:
    """The thread count the last :func:`pin_threads` set in this process (None: never
    pinned). Outputs record it: results are bit-identical only between equal counts."""
    return _PINNED[0]


# --------------------------------------------------------------------------- writers


def _start_ticks(pid: int) -> str | None:
    """When process ``pid`` started, in clock ticks since boot (/proc/<pid>/stat field
    22; Linux only, else None). It never moves with the wall clock, and with the PID it
    names one process: a later process reusing the PID has a later start."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    # the command name (field 2) is parenthesised and may hold spaces or parentheses
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


def _host_tag() -> str:
    import hashlib
    import socket

    return hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]


def writer_tag() -> str:
    """This process as a name fragment, ``h<host>p<pid>s<start>`` (host: 8 hex digits
    of its name's SHA-1; start: :func:`_start_ticks`, 0 where unknown). Partial files
    carry it, so that whoever finds one can tell whether its writer still runs."""
    pid = os.getpid()
    return f"h{_host_tag()}p{pid}s{_start_ticks(pid) or 0}"


WRITER_TAG_RE = r"h(?P<host>[0-9a-f]{8})p(?P<pid>[0-9]+)s(?P<start>[0-9]+)"


def writer_gone(host: str, pid: int, start: str) -> bool | None:
    """Whether the process a :func:`writer_tag` names has ended: True or False on this
    host, None on another (it cannot be checked from here). A PID that runs again under
    a later start counts as ended; with no start recorded (``"0"``) only a missing PID
    does."""
    if host != _host_tag():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # it runs, as another user
        pass
    if start == "0":
        return False
    now = _start_ticks(pid)
    return now is not None and now != start


# --------------------------------------------------------------------------- orphans


class OrphanedJobError(BaseException):
    """The Snakemake process that started this job is gone; its output is not published.

    A BaseException (like SystemExit): it ends the job, and no ``except Exception`` on
    the way may turn it into an ordinary error or swallow it.
    """


#: (process, command) of the Snakemake processes this job descends from.
_WATCHED: list[tuple[Any, str]] = []
_GONE: list[str] = []


def _is_snakemake(cmdline: list[str]) -> bool:
    """``snakemake ...``, ``python .../bin/snakemake ...`` or ``python -m snakemake ...``."""
    return any(os.path.basename(arg) == "snakemake" for arg in cmdline[:3])


def watch_snakemake(stop: bool = True, interval: float = 0.5) -> list[int]:
    """Remember the Snakemake processes this job descends from and watch them.

    A local Snakemake runs each script job as its own child. Killed alone (SIGKILL of its
    PID, the OOM killer), it leaves the job running, reparented to init; the job would
    finish minutes later and rename its output into the final path, over whatever a rerun
    has written there meanwhile. From the call on, :func:`check_snakemake_alive` raises
    once any of those processes is gone (it is called before every atomic rename,
    :func:`specalign.io.atomic_path`). With ``stop`` (called from the main thread), a
    daemon thread also raises ``OrphanedJobError`` in the main thread within ``interval``
    seconds of the loss, so the job ends instead of computing for nothing. (SIGINT cannot
    carry it: jobs started in the background ignore SIGINT, and Python then cannot raise
    KeyboardInterrupt; a private handler on SIGUSR1 does, through ``interrupt_main``.)
    Processes are identified by psutil's own PID-reuse check (``is_running``: the PID and
    its start time since boot), so a reused PID does not count as alive. Not by the
    start time on the wall clock: psutil adds the boot time it reads each call from
    /proc/stat, which moves with clock adjustments, and a live Snakemake was once taken
    for gone, its job's output withheld (2026-12-01). Returns the PIDs watched (none
    outside Snakemake, or without psutil).
    """
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is a dependency of snakemake
        return []
    _WATCHED.clear()
    for proc in psutil.Process().parents():
        try:
            cmd = proc.cmdline()
            if _is_snakemake(cmd):
                _WATCHED.append((proc, " ".join(cmd[:3])))
        except psutil.Error:
            continue
    if _WATCHED and stop:
        signal.signal(signal.SIGUSR1, _raise_if_orphaned)
        threading.Thread(target=_watch, args=(interval,), daemon=True).start()
    return [proc.pid for proc, _ in _WATCHED]


def snakemake_gone() -> str | None:
    """Why this job is orphaned (a watched Snakemake process is gone), or None."""
    if _GONE:
        return _GONE[0]
    if not _WATCHED:
        return None
    import psutil

    for proc, cmd in _WATCHED:
        try:
            alive = proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            alive = False
        except psutil.Error:  # it exists (AccessDenied, say): not gone
            alive = True
        if not alive:
            _GONE.append(f"the Snakemake process that started this job ({proc.pid}: {cmd}) is gone")
            return _GONE[0]
    return None


def check_snakemake_alive(what: object) -> None:
    """Raise OrphanedJobError instead of publishing ``what`` when this job is orphaned."""
    gone = snakemake_gone()
    if gone:
        raise OrphanedJobError(f"{gone}: {what} is not published; rerun after `snakemake --unlock`")


def _raise_if_orphaned(signum: int, frame: Any) -> None:
    gone = snakemake_gone()
    if gone:  # a SIGUSR1 from elsewhere while Snakemake lives changes nothing
        raise OrphanedJobError(f"{gone}: job stopped, nothing published")


def _watch(interval: float) -> None:
    while not snakemake_gone():
        time.sleep(interval)
    _thread.interrupt_main(signal.SIGUSR1)
