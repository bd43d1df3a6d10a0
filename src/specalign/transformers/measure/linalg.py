"""Small dense kernels shared by the simplified forward and the alignment metrics
(Li & Altafini, arXiv:2605.25619, Section 3): tokens put on the unit sphere, and stacks
of small products (per prompt and head) on one BLAS thread."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["rows_matmul", "stacked_matmul", "unit"]


def unit(X: np.ndarray) -> np.ndarray:
    """Each row of X (..., d) divided by its norm: the token on the unit sphere."""
    return X / np.linalg.norm(X, axis=-1, keepdims=True)


def stacked_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` for stacks of small matrices (per prompt and head: n x d_head, n x n) on
    one BLAS thread. Each product is tiny, so a second thread gains nothing, and when the
    cores are shared with other work, BLAS threads that wait for each other on thousands
    of tiny products made the simplified run 10x slower (measured on 2 busy cores)."""
    with _one_blas_thread():
        return a @ b


#: OpenBLAS computes a product of m n k <= 100^3 multiply-adds by its small-matrix
#: kernel (``*gemm_small_kernel_permit``), which sums in another order than its blocked GEMM
SMALL_PRODUCT = 100**3


def rows_matmul(X: np.ndarray, B: np.ndarray) -> np.ndarray:
    """``X @ B`` for a stack of token rows X (..., n, k) and one matrix B (k, m), as one GEMM
    over all the rows.

    numpy's matmul of a stack by a matrix calls one GEMM per stack item, and each reads
    all of B again: for 100 prompts of 10 tokens at d 4096 that is 100 reads of a 134 MB
    float64 matrix for 10 rows each, and the simplified run spent most of its time so
    (issue 14). One GEMM reads B once: 3-4x faster there (measured). Where one item's
    product is small (:data:`SMALL_PRODUCT`) the stacked form is kept: it is cheap, and
    OpenBLAS computes it by another kernel. Above that bound the two forms agree to
    round-off, and with OpenBLAS on one thread bit for bit where the widths are multiples
    of 8 and there is more than one token per prompt (the shapes of the published models
    and of the default config; measured on 0.3.31, tested at the default config's shape).
    On two threads that holds for its SkylakeX kernels, not for its Haswell ones (an AMD
    EPYC: the one GEMM orders its sums otherwise), so results of more than one thread may
    differ in the last bits from those of the stacked form there.
    """
    n, k = X.shape[-2:]
    if X.ndim < 3 or B.ndim != 2 or n * k * B.shape[1] <= SMALL_PRODUCT:
        return X @ B
    return (X.reshape(-1, k) @ B).reshape(*X.shape[:-1], B.shape[1])


def _one_blas_thread() -> Any:
    """A context limiting BLAS to one thread (threadpoolctl's controller, built once)."""
    global _CONTROLLER
    if _CONTROLLER is None:
        from threadpoolctl import ThreadpoolController

        _CONTROLLER = ThreadpoolController()
    return _CONTROLLER.limit(limits=1, user_api="blas")


_CONTROLLER: Any = None
