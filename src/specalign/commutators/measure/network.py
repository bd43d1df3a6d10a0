"""Forward and backward sensitivity pass of a bias-free ReLU network (paper Secs. 3.1-3.3).

The network is ``a_0 = x``, ``z_l = W_l a_l``, ``a_{l+1} = relu(z_l)`` and
``F = W_{L-1} a_{L-1}`` with ``W_l`` of shape ``(m_{l+1}, m_l)`` and ``m_L = 1``.
The ReLU derivative uses the paper's fixed selection ``sigma'(0) = 0``
(standing trajectory convention, Sec. 3.6), so a gate is open only for ``z > 0``.

Every array keeps samples as rows: a per-sample vector ``v(x)`` is stored as the
row ``v[..., n, :]``. Leading batch dimensions on the weights (one network per
batch entry) broadcast against an optional batch on the inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Forward", "forward", "check_weights"]


@dataclass(frozen=True)
class Forward:
    """Per-sample quantities of one forward/backward pass.

    Attributes
    ----------
    a:
        Activations ``a_l``, ``l = 0..L-1``, each of shape ``(..., N, m_l)``.
    d:
        Gates ``diag(D_l(x)) = 1[z_l > 0]`` as float 0/1, ``l = 0..H-1`` with
        ``H = L-1``, each of shape ``(..., N, m_{l+1})``.
    F:
        Scalar network output, shape ``(..., N)``.
    g:
        Sensitivities ``g_l = dF/da_l`` (Sec. 3.3), ``l = 0..L-1``, each of shape
        ``(..., N, m_l)``; ``g_{L-1} = W_{L-1}^T`` and ``g_l = W_l^T D_l g_{l+1}``.
    """

    a: tuple[np.ndarray, ...]
    d: tuple[np.ndarray, ...]
    F: np.ndarray
    g: tuple[np.ndarray, ...]

    @property
    def n_hidden(self) -> int:
        """Number of hidden layers ``H = L - 1``."""
        return len(self.d)


def check_weights(Ws: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Convert weights to float64 and validate the layer chain (Sec. 3.1).

    Raises ``ValueError`` unless ``W_l`` has shape ``(..., m_{l+1}, m_l)`` with
    matching inner widths and a single output row in the last layer.
    """
    if len(Ws) < 1:
        raise ValueError("need at least one weight matrix")
    out = [np.asarray(W, dtype=np.float64) for W in Ws]
    for l, W in enumerate(out):
        if W.ndim < 2:
            raise ValueError(f"W_{l} must have at least 2 dimensions, got shape {W.shape}")
        if l > 0 and W.shape[-1] != out[l - 1].shape[-2]:
            raise ValueError(
                f"width mismatch: W_{l - 1} has {out[l - 1].shape[-2]} rows, "
                f"W_{l} has {W.shape[-1]} columns"
            )
    if out[-1].shape[-2] != 1:
        raise ValueError(f"scalar output required: W_{len(out) - 1} must have one row")
    return out


def forward(Ws: Sequence[np.ndarray], X: np.ndarray) -> Forward:
    """Run the network and backpropagate the output sensitivity (Secs. 3.1-3.3).

    Parameters
    ----------
    Ws:
        Weights ``W_0..W_{L-1}``, ``W_l`` of shape ``(..., m_{l+1}, m_l)``, ``m_L = 1``.
    X:
        Inputs of shape ``(N, m_0)`` shared by all batch entries, or
        ``(..., N, m_0)`` broadcasting against the weights' batch dimensions.

    Returns
    -------
    Forward
        Activations, gates, outputs and sensitivities ``g_l = dF/da_l``.
    """
    Ws = check_weights(Ws)
    X = np.asarray(X, dtype=np.float64)
    if X.ndim < 2 or X.shape[-1] != Ws[0].shape[-1]:
        raise ValueError(f"X must have shape (..., N, {Ws[0].shape[-1]}), got {X.shape}")
    batch = np.broadcast_shapes(X.shape[:-2], *(W.shape[:-2] for W in Ws))
    n = X.shape[-2]

    a = [np.broadcast_to(X, (*batch, n, X.shape[-1]))]
    d = []
    for W in Ws[:-1]:
        z = a[-1] @ np.swapaxes(W, -1, -2)
        gate = (z > 0).astype(np.float64)
        d.append(gate)
        a.append(z * gate)
    F = (a[-1] @ np.swapaxes(Ws[-1], -1, -2))[..., 0]

    # Row form of g_l = W_l^T D_l g_{l+1}: g_l(x)^T = (d_l(x) * g_{l+1}(x))^T W_l.
    g = [np.broadcast_to(Ws[-1], (*batch, n, Ws[-1].shape[-1]))]
    for l in range(len(Ws) - 2, -1, -1):
        g.append((d[l] * g[-1]) @ Ws[l])
    g.reverse()
    return Forward(a=tuple(a), d=tuple(d), F=F, g=tuple(g))
