"""Exactly solvable two-neuron models of paper Sec. 9.1 and their Monte Carlo checks.

The model is ``F(x) = c_1 relu(w_1^T x) + c_2 relu(w_2^T x)`` with ``x ~ N(0, I_d)``,
``W_0`` with rows ``w_1, w_2`` and ``W_1 = (c_1 c_2)``. With ``rho`` the cosine of
the angle ``theta = arccos(rho)`` between the neurons:

* ``pi_12 = E[d_1 d_2] = 1/4 + arcsin(rho) / (2 pi)`` (each gate is open w.p. 1/2);
* ``G_0 = E||[D_0, P_0]||_F^2 = (2/pi) (w_1.w_2)^2 arccos(rho)`` (Sec. 9.1),
  because ``[D, P]_12 = (d_1 - d_2) w_1.w_2`` and ``P(d_1 != d_2) = theta / pi``;
* ``Qbar_0 = [[c_1^2/2, c_1 c_2 pi_12], [c_1 c_2 pi_12, c_2^2/2]]`` (Sec. 9.1.1);
* along ``w_{1,2}(t) = cos(t) v +- sin(t) e`` (``v``, ``e`` orthonormal) the neurons
  are unit vectors at angle ``2t``, so ``G_0(t) = (4t/pi) cos^2(2t)`` (Sec. 9.1.4).
  It vanishes for coinciding (``t = 0``) and orthogonal (``t = pi/4``) neurons and is
  positive in between, so a trajectory joining the two must pass through growth.

The Monte Carlo estimators deliberately run the production path
(:func:`~specalign.commutators.measure.network.forward`,
:func:`~specalign.commutators.measure.defects.gate_energy`,
:func:`~specalign.commutators.measure.defects.coactivation`,
:func:`~specalign.commutators.measure.defects.Qbar`) on sampled inputs, so agreement with
the closed forms validates those kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specalign.commutators.measure.defects import (
    Qbar,
    coactivation,
    gate_energy,
    gate_energy_pointwise,
)
from specalign.commutators.measure.network import forward

__all__ = [
    "neuron_cosine",
    "coactivation_two_neuron",
    "gate_energy_two_neuron",
    "Qbar_two_neuron",
    "transient_weights",
    "gate_energy_transient",
    "gate_energy_transient_derivative",
    "MonteCarloTwoNeuron",
    "monte_carlo_two_neuron",
    "monte_carlo_gate_energy_transient",
]


def neuron_cosine(w1: np.ndarray, w2: np.ndarray) -> float:
    """Cosine ``rho = w_1.w_2 / (||w_1|| ||w_2||)`` of the two incoming weight rows (Sec. 9.1)."""
    w1 = np.asarray(w1, dtype=np.float64)
    w2 = np.asarray(w2, dtype=np.float64)
    rho = float(w1 @ w2 / (np.linalg.norm(w1) * np.linalg.norm(w2)))
    # Round-off can push |rho| past 1 for (anti)parallel neurons.
    return float(np.clip(rho, -1.0, 1.0))


def coactivation_two_neuron(rho: float) -> float:
    """Joint activation probability ``pi_12 = 1/4 + arcsin(rho) / (2 pi)`` (Sec. 9.1)."""
    return 0.25 + float(np.arcsin(rho)) / (2.0 * np.pi)


def gate_energy_two_neuron(w1: np.ndarray, w2: np.ndarray) -> float:
    """Closed form ``G_0 = (2/pi) (w_1.w_2)^2 arccos(rho)`` for ``x ~ N(0, I)`` (Sec. 9.1).

    This is the unnormalised gate energy ``E||[D_0(x), P_0]||_F^2``.
    """
    dot = float(np.asarray(w1, dtype=np.float64) @ np.asarray(w2, dtype=np.float64))
    return 2.0 / np.pi * dot**2 * float(np.arccos(neuron_cosine(w1, w2)))


def Qbar_two_neuron(c: np.ndarray, rho: float) -> np.ndarray:
    """Closed form ``Qbar_0 = (c c^T) o [[1/2, pi_12], [pi_12, 1/2]]`` (Sec. 9.1.1).

    ``S_1 = W_1^T W_1 = c c^T`` is constant, so ``Qbar_0 = (c c^T) o p`` with the
    Gaussian co-activation matrix ``p``.
    """
    c = np.asarray(c, dtype=np.float64)
    pi12 = coactivation_two_neuron(rho)
    p = np.array([[0.5, pi12], [pi12, 0.5]])
    return np.outer(c, c) * p


def transient_weights(theta: float, v: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Neurons ``w_{1,2}(theta) = cos(theta) v +- sin(theta) e`` (Sec. 9.1.4).

    ``v`` and ``e`` must be orthonormal.
    """
    v = np.asarray(v, dtype=np.float64)
    e = np.asarray(e, dtype=np.float64)
    if not np.allclose([v @ v, e @ e, v @ e], [1.0, 1.0, 0.0], atol=1e-12):
        raise ValueError("v and e must be orthonormal")
    return np.cos(theta) * v + np.sin(theta) * e, np.cos(theta) * v - np.sin(theta) * e


def gate_energy_transient(theta: float | np.ndarray) -> float | np.ndarray:
    """Gate energy along the constrained flow (Sec. 9.1.4).

    ``G_0(theta) = (4 theta / pi) cos^2(2 theta)``, valid for ``0 <= theta <= pi/2``
    where the angle between the neurons is ``2 theta``.
    """
    theta = np.asarray(theta, dtype=np.float64)
    return 4.0 * theta / np.pi * np.cos(2.0 * theta) ** 2


def gate_energy_transient_derivative(theta: float | np.ndarray) -> float | np.ndarray:
    """``dG_0/dtheta = (4/pi) (cos^2(2 theta) - 2 theta sin(4 theta))`` (Sec. 9.1.4).

    Positive at ``theta = 0`` (initial growth) and negative near ``theta = pi/4``.
    """
    theta = np.asarray(theta, dtype=np.float64)
    return 4.0 / np.pi * (np.cos(2.0 * theta) ** 2 - 2.0 * theta * np.sin(4.0 * theta))


@dataclass(frozen=True)
class MonteCarloTwoNeuron:
    """Monte Carlo estimates with standard errors for the two-neuron model (Sec. 9.1)."""

    G0: float
    G0_se: float
    pi12: float
    pi12_se: float
    Qbar: np.ndarray
    Qbar_se: np.ndarray
    n_samples: int


def _gaussian_forward(W0: np.ndarray, c: np.ndarray, n_samples: int, rng: np.random.Generator):
    X = rng.standard_normal((n_samples, W0.shape[1]))
    return forward([W0, np.asarray(c, dtype=np.float64).reshape(1, 2)], X)


def monte_carlo_two_neuron(
    w1: np.ndarray,
    w2: np.ndarray,
    c: np.ndarray,
    n_samples: int,
    rng: np.random.Generator,
) -> MonteCarloTwoNeuron:
    """Monte Carlo ``G_0``, ``pi_12`` and ``Qbar_0`` for ``x ~ N(0, I_d)`` (Sec. 9.1).

    ``G_0`` is :func:`gate_energy` of ``P_0 = W_0 W_0^T`` and the sampled co-activation
    matrix; its standard error uses the per-sample energies of
    :func:`gate_energy_pointwise`. ``Qbar_0`` is the production :func:`Qbar`.
    """
    W0 = np.stack([np.asarray(w1, dtype=np.float64), np.asarray(w2, dtype=np.float64)])
    fw = _gaussian_forward(W0, c, n_samples, rng)
    d0, g1 = fw.d[0], fw.g[1]
    P0 = W0 @ W0.T
    p = coactivation(d0)
    energies = gate_energy_pointwise(P0, d0)
    q = d0 * g1
    outer = q[:, :, None] * q[:, None, :]
    se = np.sqrt(n_samples / (n_samples - 1.0)) / np.sqrt(n_samples)
    return MonteCarloTwoNeuron(
        G0=float(gate_energy(P0, p)),
        G0_se=float(np.std(energies) * se),
        pi12=float(p[0, 1]),
        pi12_se=float(np.std(d0[:, 0] * d0[:, 1]) * se),
        Qbar=Qbar(d0, g1),
        Qbar_se=np.std(outer, axis=0) * se,
        n_samples=n_samples,
    )


def monte_carlo_gate_energy_transient(
    theta: float,
    v: np.ndarray,
    e: np.ndarray,
    n_samples: int,
    rng: np.random.Generator,
) -> tuple[float, float]:
    """Monte Carlo ``(G_0(theta), standard error)`` along the Sec. 9.1.4 trajectory.

    The readout ``W_1 = (1/2, 1/2)`` of Sec. 9.1.4 does not enter ``G_0``; it is
    included so that the full network runs through :func:`forward`.
    """
    w1, w2 = transient_weights(theta, v, e)
    W0 = np.stack([w1, w2])
    fw = _gaussian_forward(W0, np.array([0.5, 0.5]), n_samples, rng)
    P0 = W0 @ W0.T
    energies = gate_energy_pointwise(P0, fw.d[0])
    se = float(np.std(energies, ddof=1) / np.sqrt(n_samples))
    return float(gate_energy(P0, coactivation(fw.d[0]))), se
