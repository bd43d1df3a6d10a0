"""Batched full-batch gradient descent for ensembles of bias-free ReLU networks.

The network (paper, Sec. 10) is a bias-free fully connected ReLU net with scalar output,

    a_0 = x,   z_l = W_l a_l,   a_{l+1} = relu(z_l)   (l = 0, ..., L-2),
    F(x) = W_{L-1} a_{L-1},

with ``W_l`` of shape ``(m_{l+1}, m_l)``, ``H = L - 1`` hidden layers and ``m_L = 1``. It is
trained by full-batch gradient descent on ``R = 0.5 * mean_i (F(x_i) - y_i)^2``; training
time is ``t = iteration * lr``.

Every seed of an ensemble trains at once: weights are stacked into float64 tensors of shape
``(S, m_{l+1}, m_l)`` and each layer is one batched matmul (``torch.bmm``), so the Python
interpreter runs once per iteration, not once per seed. Backpropagation is written out by
hand because the ensemble needs neither a graph nor per-seed optimiser state, and the hand-
written pass does exactly the maths autograd does (checked against
:func:`reference_train_loop` in the tests).

ReLU derivative at zero
-----------------------
The paper's gate matrices are ``D_l(x) = diag(sigma'(z_l(x)))`` with the convention
``sigma'(0) = 0``: a unit whose pre-activation is exactly zero is *off*. The backward pass
here implements it by masking the upstream gradient with ``a_{l+1} > 0`` (equivalently
``z_l > 0``), which is also what ``torch.relu``'s autograd backward does
(``threshold_backward(grad, result, 0)`` zeroes the gradient wherever ``result <= 0``).
Hence the batched trainer and the autograd baseline agree even on exact ties, which occur in
practice: a dead unit has ``z = 0`` for every input once its incoming row is zero.

Activations are stored feature-major, ``(S, m_l, N)``: on a CPU the three matmuls of a
layer (forward, input gradient, weight gradient) ran about 10-50 % faster in this layout
than sample-major at the study's sizes (MKL, one thread), and the first layer
becomes a single GEMM because the input batch is shared by all seeds.

Stage ``train`` of the commutator study, a module of its own. May import: the shared
modules, the study's common modules and ``data``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specalign.commutators.contracts import seeds_of, widths_of

__all__ = [
    "DIVERGENCE_FACTOR",
    "TrainResult",
    "checkpoint_label",
    "he_init",
    "initial_weights",
    "predict",
    "reference_train_loop",
    "rescale",
    "train_ensemble",
    "train_experiment",
]

DTYPE = torch.float64

#: A seed has diverged once its risk exceeds this multiple of its initial risk R(0), or
#: is no longer finite. A blow-up can end in a collapse instead of an overflow: the
#: weights grow until every ReLU of a layer is off, the network is then constant and
#: its risk stays finite (seen: R = 1e53 R(0), then a constant 0.3 R(0) at lr = 10, and
#: after R = 4e115 R(0) at lr = 0.5). Stable gradient descent can overshoot R(0) by a
#: small factor early on (2.8 seen), never by orders of magnitude.
DIVERGENCE_FACTOR = 1e6


# --------------------------------------------------------------------------------------
# Initialisation and the function-preserving rescaling
# --------------------------------------------------------------------------------------


def he_init(widths: Sequence[int], seeds: Sequence[int]) -> list[np.ndarray]:
    """He initialisation of an ensemble, one independent stream per seed.

    ``widths = [m_0, m_1, ..., m_H, 1]``. Hidden layers ``W_l`` (``l < L-1``) are drawn
    from ``N(0, 2 / m_l)`` and the read-out ``W_{L-1}`` from ``N(0, 1 / m_{L-1})``.

    RNG: seed ``s`` owns ``numpy.random.Generator(PCG64(s))`` and draws the layers in order
    ``W_0, W_1, ...`` with ``standard_normal((m_{l+1}, m_l))`` (row-major), then scales by
    the standard deviation. A seed's weights therefore depend only on ``s`` and ``widths``,
    never on the ensemble size or the seed's position in ``seeds``, which is what makes
    the rescaling experiment's seeds paired.

    Returns a list of float64 arrays of shape ``(S, m_{l+1}, m_l)``.
    """
    widths = [int(w) for w in widths]
    if len(widths) < 2 or any(w < 1 for w in widths):
        raise ValueError(f"widths must be >= 2 positive integers, got {widths}")
    if widths[-1] != 1:
        raise ValueError(f"the network has a scalar output: widths[-1] must be 1, got {widths}")
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds must not be empty")
    if any(s < 0 for s in seeds):
        raise ValueError(f"seeds must be non-negative integers, got {seeds}")
    n_layers = len(widths) - 1
    out = [np.empty((len(seeds), widths[l + 1], widths[l])) for l in range(n_layers)]
    for k, s in enumerate(seeds):
        rng = np.random.Generator(np.random.PCG64(s))
        for l in range(n_layers):
            gain = 1.0 if l == n_layers - 1 else 2.0
            std = math.sqrt(gain / widths[l])
            out[l][k] = rng.standard_normal((widths[l + 1], widths[l])) * std
    return out


def rescale(Ws: Sequence[np.ndarray], layer: int, c: float) -> list[np.ndarray]:
    """Function-preserving rescaling ``W_layer <- c W_layer``, ``W_{layer+1} <- W_{layer+1}/c``.

    Because relu is positively homogeneous (``relu(c z) = c relu(z)`` for ``c > 0``), the
    network function and every gate are unchanged; only the adjacent-layer imbalance and the
    gradient-descent parametrisation change (paper Sec. 10.6, with ``layer = 1``).
    Works on single networks ``(m_{l+1}, m_l)`` and ensembles ``(S, m_{l+1}, m_l)`` alike.
    Returns new arrays; the input is not modified.
    """
    c = float(c)
    if not (math.isfinite(c) and c > 0):
        raise ValueError(
            f"rescaling factor c must be finite and > 0 (relu is only positively "
            f"homogeneous), got {c}"
        )
    n_layers = len(Ws)
    if not 0 <= layer < n_layers - 1:
        raise ValueError(
            f"layer must be in [0, {n_layers - 2}] so that layer+1 exists "
            f"({n_layers} weight matrices), got {layer}"
        )
    out = [np.array(W, dtype=np.float64, copy=True) for W in Ws]
    out[layer] *= c
    out[layer + 1] /= c
    return out


def predict(Ws: Sequence[np.ndarray], X: np.ndarray) -> np.ndarray:
    """Network output ``F(x_i)`` for every seed: ``(S, N)`` for an ensemble (weights
    ``(S, m_{l+1}, m_l)``), ``(N,)`` for a single network (weights ``(m_{l+1}, m_l)``)."""
    single = np.ndim(Ws[0]) == 2
    Wt = [torch.as_tensor(np.asarray(W, dtype=np.float64)) for W in Ws]
    if single:
        Wt = [W.unsqueeze(0) for W in Wt]
    Xt = torch.as_tensor(np.asarray(X, dtype=np.float64))
    with torch.no_grad():
        a = torch.matmul(Wt[0], Xt.T)
        for W in Wt[1:]:
            a = torch.bmm(W, torch.relu(a))
    out = a[:, 0, :].numpy()
    return out[0] if single else out


# --------------------------------------------------------------------------------------
# Batched trainer
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainResult:
    """Outcome of :func:`train_ensemble` (all arrays on the host, float64 unless noted).

    Attributes
    ----------
    risk
        ``(S, n_iter + 1)``; ``risk[s, i] = R(W_i)`` with ``W_i`` the weights after ``i``
        steps. At ``diverged_at[s]`` it holds the value that marked the divergence (above
        ``DIVERGENCE_FACTOR * R(0)``, inf or NaN) and it is NaN afterwards.
    checkpoint_labels
        ``C`` labels: first the risk levels (``"r<=1e-3"``) in the order given, then the
        times (``"t=100"``).
    checkpoint_iteration
        ``(S, C)`` int64 iteration at which the checkpoint was taken, ``-1`` where a risk
        level was never reached or the seed had diverged before the time.
    checkpoint_weights
        One array per layer, ``(S, C, m_{l+1}, m_l)``, NaN where not reached.
    final_weights
        One array per layer, ``(S, m_{l+1}, m_l)``: the weights after ``n_iter`` steps, or,
        for a diverged seed, the weights at ``diverged_at``.
    diverged, diverged_at
        ``(S,)`` bool and int64 (``-1`` when the seed did not diverge).
    """

    risk: np.ndarray
    checkpoint_labels: tuple[str, ...]
    checkpoint_iteration: np.ndarray
    checkpoint_weights: list[np.ndarray]
    final_weights: list[np.ndarray]
    diverged: np.ndarray
    diverged_at: np.ndarray
    lr: float
    n_iter: int
    risk_levels: tuple[float, ...]
    times: tuple[float, ...]

    @property
    def relative_risk(self) -> np.ndarray:
        """``r(t) = R(t) / R(0)``, ``(S, n_iter + 1)``."""
        return self.risk / self.risk[:, :1]

    @property
    def checkpoint_time(self) -> np.ndarray:
        """``(S, C)`` training time ``iteration * lr`` of each checkpoint, NaN if not taken."""
        it = self.checkpoint_iteration.astype(np.float64)
        return np.where(self.checkpoint_iteration >= 0, it * self.lr, np.nan)


def checkpoint_label(kind: str, value: float) -> str:
    """``checkpoint_label("risk", 1e-3) == "r<=1e-3"``, ``checkpoint_label("time", 100) ==
    "t=100"``. Risk levels use the shortest mantissa/exponent form so that labels read as in
    the paper; times use ``%g``."""
    if kind == "risk":
        mantissa, exponent = f"{float(value):.12e}".split("e")
        mantissa = mantissa.rstrip("0").rstrip(".")
        return f"r<={mantissa}e{int(exponent)}"
    if kind == "time":
        return f"t={float(value):g}"
    raise ValueError(f"kind must be 'risk' or 'time', got {kind!r}")


ProgressLike = Callable[[int, int], Any] | Any


def _as_weights(Ws0: Sequence[Any], device: torch.device) -> list[torch.Tensor]:
    if len(Ws0) < 1:
        raise ValueError("Ws0 must contain at least one weight matrix")
    Ws = [torch.as_tensor(np.asarray(W, dtype=np.float64)) for W in Ws0]
    for l, W in enumerate(Ws):
        if W.ndim != 3:
            raise ValueError(f"W_{l} must have shape (S, m_{l + 1}, m_{l}), got {tuple(W.shape)}")
    S = Ws[0].shape[0]
    for l in range(1, len(Ws)):
        if Ws[l].shape[0] != S:
            raise ValueError(f"W_{l} has {Ws[l].shape[0]} seeds, W_0 has {S}")
        if Ws[l].shape[2] != Ws[l - 1].shape[1]:
            raise ValueError(
                f"W_{l} expects {Ws[l].shape[2]} inputs but W_{l - 1} has {Ws[l - 1].shape[1]} rows"
            )
    if Ws[-1].shape[1] != 1:
        raise ValueError(f"the read-out must have one row (scalar output), got {Ws[-1].shape[1]}")
    if not all(bool(torch.isfinite(W).all()) for W in Ws):
        raise ValueError("initial weights contain NaN or inf")
    # .clone(): the loop updates in place and must never write into the caller's arrays.
    return [W.to(device=device, dtype=DTYPE).clone().contiguous() for W in Ws]


def _progress_hook(progress: ProgressLike | None, n_iter: int) -> Callable[[int], None]:
    """Turn a tqdm-like object (anything with ``.update(n)``) or a
    ``callable(iteration, n_iter)`` into a function of the current iteration."""
    if progress is None:
        return lambda i: None
    if hasattr(progress, "update"):
        done = [0]

        def tqdm_hook(i: int) -> None:
            progress.update(i - done[0])  # tqdm counts increments, not positions
            done[0] = i

        return tqdm_hook
    if not callable(progress):
        raise TypeError("progress must be callable(iteration, n_iter) or have .update(n)")
    return lambda i: progress(i, n_iter)


def _schedule(
    lr: float, n_iter: int, risk_levels: Sequence[float], times: Sequence[float]
) -> tuple[tuple[float, ...], tuple[float, ...], list[int], tuple[str, ...]]:
    """Checked risk levels and times, the iterations of the times, and the labels."""
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be finite and > 0, got {lr}")
    if n_iter < 0:
        raise ValueError(f"n_iter must be >= 0, got {n_iter}")
    levels = tuple(float(r) for r in risk_levels)
    if any(not (math.isfinite(r) and r > 0) for r in levels):
        raise ValueError(f"risk levels must be finite and > 0, got {levels}")
    ts = tuple(float(t) for t in times)
    time_iters: list[int] = []
    for t in ts:
        if not (math.isfinite(t) and t >= 0):
            raise ValueError(f"checkpoint times must be finite and >= 0, got {t}")
        it = round(t / lr)
        if it > n_iter:
            raise ValueError(
                f"checkpoint time t={t:g} is iteration {it} > n_iter={n_iter} (lr={lr:g}); "
                f"the run ends at t={n_iter * lr:g}"
            )
        time_iters.append(it)
    labels = tuple(checkpoint_label("risk", r) for r in levels) + tuple(
        checkpoint_label("time", t) for t in ts
    )
    if len(set(labels)) != len(labels):
        raise ValueError(f"duplicate checkpoints: {labels}")
    return levels, ts, time_iters, labels


def _as_data(
    X: np.ndarray, y: np.ndarray, m_0: int, dev: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    Xt = torch.as_tensor(np.asarray(X, dtype=np.float64)).to(dev)
    yt = torch.as_tensor(np.asarray(y, dtype=np.float64)).to(dev)
    if Xt.ndim != 2 or Xt.shape[1] != m_0:
        raise ValueError(f"X must have shape (N, {m_0}), got {tuple(Xt.shape)}")
    N = Xt.shape[0]
    if N == 0:
        raise ValueError("X has no rows")
    if yt.shape != (N,):
        raise ValueError(f"y must have shape ({N},), got {tuple(yt.shape)}")
    if not (bool(torch.isfinite(Xt).all()) and bool(torch.isfinite(yt).all())):
        raise ValueError("X or y contains NaN or inf")
    return Xt, yt


class _Checkpoints:
    """Weights and iterations at the first crossing of each risk level and at each time.

    Risk-level checkpoints are a vectorised mask over (seed, level), and weights are
    copied only on the (at most S * Cr) iterations where some seed crosses a level; time
    checkpoints are known in advance, so a dict lookup per iteration costs nothing.
    """

    def __init__(
        self,
        Ws: list[torch.Tensor],
        risk_levels: tuple[float, ...],
        time_iters: list[int],
    ) -> None:
        S, dev = Ws[0].shape[0], Ws[0].device
        self.Cr = len(risk_levels)
        C = self.Cr + len(time_iters)
        self.weights = [
            torch.full((S, C, *W.shape[1:]), math.nan, dtype=DTYPE, device=dev) for W in Ws
        ]
        self.iteration = torch.full((S, C), -1, dtype=torch.int64, device=dev)
        self.at_time: dict[int, list[int]] = {}
        for c, it in enumerate(time_iters):
            self.at_time.setdefault(it, []).append(self.Cr + c)
        self.levels = torch.tensor(risk_levels, dtype=DTYPE, device=dev).view(1, self.Cr)
        self.pending = torch.ones((S, self.Cr), dtype=torch.bool, device=dev)
        self.thresh: torch.Tensor | None = None

    def record(
        self, i: int, risk: torch.Tensor, Ws: list[torch.Tensor], diverged: torch.Tensor
    ) -> None:
        S, Cr = risk.shape[0], self.Cr
        if Cr:
            if self.thresh is None:
                self.thresh = self.levels * risk.view(S, 1)
            hit = (risk.view(S, 1) <= self.thresh) & self.pending
            if bool(hit.any()):
                self.pending &= ~hit
                self.iteration[:, :Cr] = torch.where(hit, i, self.iteration[:, :Cr])
                h = hit.view(S, Cr, 1, 1)
                for l, W in enumerate(Ws):
                    self.weights[l][:, :Cr] = torch.where(
                        h, W.unsqueeze(1), self.weights[l][:, :Cr]
                    )
        if i in self.at_time:
            alive = ~diverged
            for c in self.at_time[i]:
                self.iteration[:, c] = torch.where(alive, i, -1)
                for l, W in enumerate(Ws):
                    self.weights[l][:, c] = torch.where(alive.view(S, 1, 1), W, math.nan)


class _Divergence:
    """Which seeds diverged, when, and their weights at that iteration.

    A seed diverges at the first iteration whose risk is not finite or exceeds
    ``DIVERGENCE_FACTOR * R(0)`` (a blow-up caught before it can end in a dead, constant
    network that would otherwise pass for converged). A diverged seed's working copy is
    set to zero, which makes its gradient exactly zero, so it costs no NaN arithmetic and
    cannot disturb the other seeds (every batched matmul is independent per seed).
    """

    def __init__(self, Ws: list[torch.Tensor]) -> None:
        S, dev = Ws[0].shape[0], Ws[0].device
        self.diverged = torch.zeros(S, dtype=torch.bool, device=dev)
        self.at = torch.full((S,), -1, dtype=torch.int64, device=dev)
        self.frozen = [torch.zeros_like(W) for W in Ws]
        self.any = False
        self.limit: torch.Tensor | None = None  # DIVERGENCE_FACTOR * R(0); inf if R(0) = 0

    def update(
        self,
        i: int,
        risk: torch.Tensor,
        err: torch.Tensor,
        Ws: list[torch.Tensor],
        checkpoints: _Checkpoints,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mark seeds whose risk is no longer finite or above the limit; returns the risk
        to record (the value met at ``diverged_at`` kept, later ones NaN) and the residual
        to backpropagate (zero for diverged seeds). One reduction per step; the rare
        branch does the bookkeeping."""
        S = risk.shape[0]
        if self.limit is None:
            self.limit = torch.where(risk > 0, risk * DIVERGENCE_FACTOR, math.inf)
        bad = ~torch.isfinite(risk) | (risk > self.limit)
        if self.any:
            bad &= ~self.diverged
        if bool(bad.any()):
            self.any = True
            self.diverged |= bad
            self.at = torch.where(bad, i, self.at)
            checkpoints.pending &= ~bad.view(S, 1)
            keep = bad.view(S, 1, 1)
            for l in range(len(Ws)):
                self.frozen[l] = torch.where(keep, Ws[l], self.frozen[l])
                Ws[l] = Ws[l].masked_fill(keep, 0.0)  # zero weights => zero gradient
            err = err.masked_fill(bad.view(S, 1, 1), 0.0)
        if self.any:
            after = self.diverged & (self.at < i)
            risk = torch.where(after, math.nan, risk)
        return risk, err


class _Workspace:
    """Every array an iteration writes, allocated once for the whole run.

    An iteration of a benchmark ensemble (20 seeds, N = 824, width 32) makes about a dozen
    arrays of 4 MB. Allocated afresh, glibc maps each from the system and unmaps it when it
    is freed (or trims its heap back), so that every iteration paid about 500 page
    faults: 16.6 ms an iteration against 9.1 with the memory kept (2 threads). Written
    in place (``out=``), the same kernels compute the same numbers.
    """

    def __init__(self, Ws: list[torch.Tensor], XT: torch.Tensor) -> None:
        S, N = Ws[0].shape[0], XT.shape[1]
        like = {"dtype": Ws[0].dtype, "device": Ws[0].device}
        #: acts[l] = a_l, (S, m_l, N): acts[0] is the shared input, the others hold z_{l-1}
        #: until the ReLU overwrites it
        self.acts = [XT] + [torch.empty((S, W.shape[2], N), **like) for W in Ws[1:]]
        self.err = torch.empty((S, 1, N), **like)
        #: deltas[l] = delta_{l-1} = (W_l^T delta_l) * 1[a_l > 0], (S, m_l, N); deltas[0] unused
        self.deltas = [torch.empty(0, **like)] + [torch.empty_like(a) for a in self.acts[1:]]
        self.grads = [torch.empty_like(W) for W in Ws]


def _residual(Ws: list[torch.Tensor], y_row: torch.Tensor, work: _Workspace) -> torch.Tensor:
    """Forward pass a_{l+1} = relu(W_l a_l), F = W_{L-1} a_{L-1}, the activations into
    ``work.acts``; returns the residual F - y, (S, 1, N), in ``work.err``."""
    acts = work.acts
    for l in range(len(Ws) - 1):
        # layer 0 broadcasts the shared input: one GEMM, (S*m_1, m_0)@(m_0, N)
        torch.matmul(Ws[l], acts[l], out=acts[l + 1]).relu_()
    return torch.matmul(Ws[-1], acts[-1], out=work.err).sub_(y_row)


def _descend(
    Ws: list[torch.Tensor],
    err: torch.Tensor,
    work: _Workspace,
    Xt: torch.Tensor,
    inv_n: float,
    lr: float,
) -> None:
    """One gradient step in place. dR/dF = (F - y)/N; dR/dW_l = delta_l a_l^T;
    delta_{l-1} = (W_l^T delta_l) * 1[a_l > 0]   (sigma'(0) = 0)."""
    acts, grads = work.acts, work.grads
    delta = err.mul_(inv_n)
    for l in range(len(Ws) - 1, 0, -1):
        torch.bmm(delta, acts[l].mT, out=grads[l])
        back = torch.bmm(Ws[l].mT, delta, out=work.deltas[l])
        # autograd's ReLU backward, in place: zero wherever a_l <= 0
        delta = torch.ops.aten.threshold_backward.grad_input(back, acts[l], 0.0, grad_input=back)
    torch.matmul(delta, Xt, out=grads[0])
    torch._foreach_add_(Ws, grads, alpha=-lr)


def train_ensemble(
    Ws0: Sequence[np.ndarray],
    X: np.ndarray,
    y: np.ndarray,
    *,
    lr: float,
    n_iter: int,
    risk_levels: Sequence[float] = (1e-1, 1e-2, 1e-3, 1e-4),
    times: Sequence[float] = (),
    device: str | torch.device = "cpu",
    progress: ProgressLike | None = None,
) -> TrainResult:
    """Train every seed of an ensemble by full-batch gradient descent, all at once.

    Parameters
    ----------
    Ws0
        Initial weights, one ``(S, m_{l+1}, m_l)`` array per layer (e.g. :func:`he_init`).
        Not modified.
    X, y
        Training inputs ``(N, m_0)`` and targets ``(N,)``, shared by all seeds.
    lr, n_iter
        Step size and number of gradient steps: ``W_{i+1} = W_i - lr * grad R(W_i)``.
    risk_levels
        Relative-risk levels ``rho``: a checkpoint is taken at the *first* iteration ``i``
        with ``R(W_i) <= rho * R(W_0)`` (the comparison avoids dividing by ``R(W_0)``, so a
        seed that starts at zero risk reaches every level at iteration 0).
    times
        Fixed training times; ``t`` maps to iteration ``round(t / lr)`` (``t = 0`` is the
        initial weights), which must be ``<= n_iter``.
    device
        ``"cpu"`` or ``"cuda"``. On the CPU the result is bit-identical between runs with the
        same inputs and thread count.
    progress
        ``callable(iteration, n_iter)`` or a tqdm-like object, called about every 1 % of
        ``n_iter`` and once at the end.

    Divergence: a seed whose risk becomes NaN or inf, or exceeds ``DIVERGENCE_FACTOR``
    times its initial risk, at iteration ``i`` is marked diverged (``diverged_at = i``);
    its weights at ``i`` are kept as its final weights, its later risk is NaN and its later
    checkpoints stay unreached (see :class:`_Divergence`).
    """
    lr, n_iter = float(lr), int(n_iter)
    risk_levels, times, time_iters, labels = _schedule(lr, n_iter, risk_levels, times)
    dev = torch.device(device)
    Ws = _as_weights(Ws0, dev)
    S, L = Ws[0].shape[0], len(Ws)
    Xt, yt = _as_data(X, y, Ws[0].shape[2], dev)
    N = Xt.shape[0]
    XT = Xt.T.contiguous()  # (m_0, N): layer 0 is one GEMM over all seeds, (S*m_1, m_0)@(m_0, N)
    y_row = yt.view(1, 1, N)

    checkpoints = _Checkpoints(Ws, risk_levels, time_iters)
    divergence = _Divergence(Ws)
    risk_hist = torch.empty((n_iter + 1, S), dtype=DTYPE, device=dev)  # row writes are contiguous
    hook = _progress_hook(progress, n_iter)
    every = max(1, n_iter // 100)
    inv_n = 1.0 / N
    work = _Workspace(Ws, XT)

    with torch.no_grad():
        for i in range(n_iter + 1):
            err = _residual(Ws, y_row, work)
            risk = torch.linalg.vecdot(err, err).view(S).mul_(0.5 * inv_n)
            risk, err = divergence.update(i, risk, err, Ws, checkpoints)
            risk_hist[i] = risk
            checkpoints.record(i, risk, Ws, divergence.diverged)
            if i == n_iter:
                break
            _descend(Ws, err, work, Xt, inv_n, lr)
            if (i + 1) % every == 0 and i + 1 < n_iter:
                hook(i + 1)
    hook(n_iter)

    diverged = divergence.diverged
    final = [torch.where(diverged.view(S, 1, 1), divergence.frozen[l], Ws[l]) for l in range(L)]
    return TrainResult(
        risk=risk_hist.T.contiguous().cpu().numpy(),
        checkpoint_labels=labels,
        checkpoint_iteration=checkpoints.iteration.cpu().numpy(),
        checkpoint_weights=[w.cpu().numpy() for w in checkpoints.weights],
        final_weights=[w.cpu().numpy() for w in final],
        diverged=diverged.cpu().numpy(),
        diverged_at=divergence.at.cpu().numpy(),
        lr=lr,
        n_iter=n_iter,
        risk_levels=risk_levels,
        times=times,
    )


# --------------------------------------------------------------------------------------
# One experiment of the config
# --------------------------------------------------------------------------------------


def initial_weights(exp: Mapping[str, Any], d_in: int) -> list[np.ndarray]:
    """He initialisation of every seed, then the experiment's rescaling (Section 10.6)."""
    Ws = he_init(widths_of(exp, d_in), seeds_of(exp))
    c = float(exp.get("rescale", {}).get("c", 1.0))
    if c != 1.0:
        Ws = rescale(Ws, int(exp["rescale"]["layer"]), c)
    return Ws


def train_experiment(
    exp: Mapping[str, Any],
    X: np.ndarray,
    y: np.ndarray,
    device: str = "cpu",
    progress: Callable[[int, int], None] | None = None,
) -> TrainResult:
    """Train every seed of ``exp`` at once on (X, y) with its training settings."""
    t = exp["training"]
    return train_ensemble(
        initial_weights(exp, X.shape[1]),
        X,
        y,
        lr=float(t["lr"]),
        n_iter=int(t["iterations"]),
        risk_levels=list(t["risk_levels"]),
        times=list(t["times"]),
        device=device,
        progress=progress,
    )


# --------------------------------------------------------------------------------------
# Straightforward baseline
# --------------------------------------------------------------------------------------


def _reference_model(W_list: Sequence[np.ndarray]) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for l, W in enumerate(W_list):
        lin = torch.nn.Linear(W.shape[1], W.shape[0], bias=False, dtype=DTYPE)
        with torch.no_grad():
            lin.weight.copy_(torch.as_tensor(np.asarray(W, dtype=np.float64)))
        layers.append(lin)
        if l < len(W_list) - 1:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def reference_train_loop(
    Ws0: Sequence[np.ndarray],
    X: np.ndarray,
    y: np.ndarray,
    *,
    lr: float,
    n_iter: int,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """The textbook baseline: a Python loop over seeds, each a ``torch.nn.Sequential`` of
    bias-free ``nn.Linear`` layers and ``nn.ReLU``, trained with autograd and
    ``torch.optim.SGD`` (no momentum) on ``0.5 * mean((F - y)^2)``.

    Returns ``(risk, final_weights)``: ``risk`` is ``(S, n_iter + 1)`` with ``risk[s, i] =
    R(W_i)``, ``final_weights`` one ``(S, m_{l+1}, m_l)`` array per layer. Used to validate
    :func:`train_ensemble` and as the benchmark's baseline. No divergence handling.
    """
    Ws0 = [np.asarray(W, dtype=np.float64) for W in Ws0]
    S = Ws0[0].shape[0]
    Xt = torch.as_tensor(np.asarray(X, dtype=np.float64))
    yt = torch.as_tensor(np.asarray(y, dtype=np.float64))
    risk = np.empty((S, n_iter + 1))
    finals = [np.empty_like(W) for W in Ws0]
    for s in range(S):
        model = _reference_model([W[s] for W in Ws0])
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        for i in range(n_iter):
            opt.zero_grad(set_to_none=True)
            loss = 0.5 * torch.mean((model(Xt).squeeze(-1) - yt) ** 2)
            risk[s, i] = loss.item()
            loss.backward()
            opt.step()
        with torch.no_grad():
            risk[s, n_iter] = (0.5 * torch.mean((model(Xt).squeeze(-1) - yt) ** 2)).item()
        linears = [m for m in model if isinstance(m, torch.nn.Linear)]
        for l, lin in enumerate(linears):
            finals[l][s] = lin.weight.detach().numpy()
    return risk, finals
