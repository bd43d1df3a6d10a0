"""The synthetic regression task of paper Sec. 10.1.

The teacher is the two-dimensional piecewise-linear function

    f_*(x_1, x_2) = 0.8 relu(x_1 + 0.6 x_2) - 0.6 relu(-0.7 x_1 + x_2) + 0.25 x_1,

observed without noise at standard Gaussian inputs ``x ~ N(0, I_2)``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["INPUT_DIM", "f_star", "sample"]

INPUT_DIM = 2


def f_star(X: np.ndarray) -> np.ndarray:
    """Evaluate the teacher on the rows of ``X`` (shape ``(N, 2)``); returns ``(N,)``."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != INPUT_DIM:
        raise ValueError(f"X must have shape (N, {INPUT_DIM}), got {X.shape}")
    x1, x2 = X[:, 0], X[:, 1]
    return 0.8 * np.maximum(x1 + 0.6 * x2, 0.0) - 0.6 * np.maximum(-0.7 * x1 + x2, 0.0) + 0.25 * x1


def sample(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``n`` noise-free observations ``(X, y)`` of the teacher.

    RNG: ``numpy.random.Generator(PCG64(seed))`` and one call
    ``standard_normal((n, 2))``, so ``X`` is float64 with i.i.d. ``N(0, 1)`` entries
    filled row by row. The first ``k`` rows of ``sample(n, seed)`` equal
    ``sample(k, seed)`` for ``k <= n``; use different seeds for the training and the
    diagnostic sample so that they are independent.
    """
    n = int(n)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if int(seed) < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}")
    rng = np.random.Generator(np.random.PCG64(int(seed)))
    X = rng.standard_normal((n, INPUT_DIM))
    return X, f_star(X)
