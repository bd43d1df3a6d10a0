"""Small dense kernels shared by the simplified forward and the alignment metrics
(Li & Altafini, arXiv:2605.25619, Section 3): tokens put on the unit sphere, and stacks
of small products (per prompt and head) on one BLAS thread."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["stacked_matmul", "unit"]


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


def _one_blas_thread() -> Any:
    """A context limiting BLAS to one thread (threadpoolctl's controller, built once)."""
    global _CONTROLLER
    if _CONTROLLER is None:
        from threadpoolctl import ThreadpoolController

        _CONTROLLER = ThreadpoolController()
    return _CONTROLLER.limit(limits=1, user_api="blas")


_CONTROLLER: Any = None
