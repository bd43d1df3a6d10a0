"""The paper's alignment metrics of token states, per layer t and token i (Li &
Altafini, arXiv:2605.25619, Section 3, Figures 2, 4, 5):

* ``gamma_t = |corr(x_i^t, v1_t)|``: alignment after layer t with the principal direction
  v1_t of F_t (:mod:`specalign.transformers.measure.directions`);
* ``psi_t = |corr(x_i^t, v1_t)| - |corr(x_i^{t-1}, v1_t)|``: the tilt layer t produces
  towards its own v1_t;
* ``rho_t``: the fraction of tokens with ``psi_t > 0``, a rise larger than round-off
  (:func:`psi_round_off`: ``d * eps``);
* the same for the mean token of each prompt (``*_mean``), ``|corr(x_i, v2_t)|``,
  ``|corr(x_i, x_i_proj)|`` and the mean inter-token distance (Figure 4);
* null levels: the same metrics against random unit directions (several seeded draws,
  averaged) and against the eigenvector of the most negative eigenvalue of F_t.

Correlation. ``corr="cosine"`` (default) is the cosine of the angle, the quantity the
power-method analogy is about (tokens on the sphere turning towards v1) and invariant to
the scale of real hidden states; ``corr="pearson"`` centres both vectors over their d
components first (the statistical correlation of the coordinate lists, which ignores any
common offset such as the large constant components of GPT-2's residual stream).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import numpy as np
import xarray as xr

from specalign.transformers.measure.directions import layer_directions, layer_schedule
from specalign.transformers.measure.linalg import stacked_matmul, unit
from specalign.transformers.metric_table import METRICS, LayerReading, StateReading, dims
from specalign.transformers.weights import ModelWeights

Corr = Literal["cosine", "pearson"]

__all__ = [
    "Corr",
    "alignment",
    "correlation",
    "correlations",
    "propagation_metrics",
    "psi_round_off",
    "token_distance",
]


def correlation(X: np.ndarray, v: np.ndarray, corr: Corr = "cosine") -> np.ndarray:
    """Signed correlation of each row of X (..., d) with v (d,) or with matched rows of v.

    ``cosine``: <x, v>/(|x||v|). ``pearson``: the same after subtracting each vector's mean
    over its d components. Zero-norm vectors give NaN.
    """
    Xc = _centred(X, corr)
    return _correlation(Xc, np.linalg.norm(Xc, axis=-1), _centred(v, corr))


def correlations(X: np.ndarray, V: np.ndarray, corr: Corr = "cosine") -> np.ndarray:
    """Signed correlation of each row of X (..., d) with each of the directions V (k, d),
    (k, ...): :func:`correlation` for many directions, as one matrix product."""
    return _products(_unit_rows(X, corr), _unit_rows(np.atleast_2d(V), corr))


def _centred(X: np.ndarray, corr: Corr) -> np.ndarray:
    """X in float64, less each vector's mean over its d components for Pearson."""
    X = np.asarray(X, dtype=np.float64)
    if corr == "pearson":
        return X - X.mean(axis=-1, keepdims=True)
    if corr != "cosine":
        raise ValueError(f"corr must be 'cosine' or 'pearson', got {corr!r}")
    return X


def _correlation(X: np.ndarray, X_norm: np.ndarray, v: np.ndarray) -> np.ndarray:
    """:func:`correlation` of rows already :func:`_centred`, with their norms given: a
    layer correlates its state with two things (v2 and its projection), and at d 4096 the
    norms of 1000 tokens cost as much as the dot products."""
    num = np.einsum("...d,...d->...", X, v)  # no (..., d) temporary for large models
    den = X_norm * np.linalg.norm(v, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def token_distance(states: np.ndarray, normalize: bool = True) -> np.ndarray:
    """Mean pairwise distance ``mean_{i<j} |x_i - x_j|`` per prompt (Figure 4).

    states: (..., n_tokens, d) -> (...). With ``normalize`` the tokens are first put on
    the unit sphere, so real hidden states and simplified states are on one scale.
    """
    X = unit(states) if normalize else np.asarray(states, dtype=np.float64)
    n = X.shape[-2]
    if n < 2:
        return np.full(X.shape[:-2], np.nan)
    # via the Gram matrix: an explicit (..., n, n, d) difference array would take
    # gigabytes for 33 layers x 100 prompts of 2560-dim GPT-Neo tokens
    G = stacked_matmul(X, np.swapaxes(X, -1, -2))
    sq = np.diagonal(G, axis1=-2, axis2=-1)
    D = np.sqrt(np.clip(sq[..., :, None] + sq[..., None, :] - 2.0 * G, 0.0, None))
    iu = np.triu_indices(n, 1)
    return D[..., iu[0], iu[1]].mean(axis=-1)


def _unit_rows(X: np.ndarray, corr: Corr) -> np.ndarray:
    """Rows of X prepared so that a dot product is the correlation: centred over the d
    components for Pearson, then divided by their norm (zero rows become NaN)."""
    X = np.asarray(X, dtype=np.float64)
    centred = corr == "pearson"
    if centred:
        X = X - X.mean(axis=-1, keepdims=True)
    # the norms a leading slice at a time (each row's own sum: the same values), so that
    # norm's squared temporary is a slice's, not the states'; and one result array (the
    # centred copy itself for Pearson) rather than the quotient and its np.where copy:
    # for the (T + 1, P, N, d) states of a 7B model each is 1.6 GB (issue 14)
    if X.ndim > 2:
        norm = np.stack([np.linalg.norm(x, axis=-1, keepdims=True) for x in X])
    else:
        norm = np.linalg.norm(X, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.divide(X, np.where(norm > 0, norm, 1.0), out=X if centred else None)
    out[~(norm[..., 0] > 0)] = np.nan
    return out


def psi_round_off(d: int) -> float:
    """The largest ``|psi_t|`` that round-off alone can make, for width ``d``.

    gamma is a dot product of two unit vectors in float64, whose computed value is
    within about ``d * u`` of the exact one (u = eps/2, the unit round-off; Higham,
    *Accuracy and Stability of Numerical Algorithms*, 2nd ed., Section 3.1), and psi the
    difference of two of them: ``|psi| <= d * eps`` can come from the summation order
    alone. A token a layer leaves where it was (psi = 0 exactly) otherwise counts as a
    rise or not by the order in which a BLAS kernel happened to add (issue 33)."""
    return float(d) * float(np.finfo(np.float64).eps)


def _products(rows: np.ndarray, dirs: np.ndarray) -> np.ndarray:
    """``<row, dir>`` of every row (..., d) with every direction (k, d): (k, ...).

    One matrix product for all directions (the paper's v1, v_neg, the null draws):
    BLAS runs it at its GEMM rate, where a reduction per direction ran 20-45x below it
    (bench/bench_metrics.py)."""
    d = rows.shape[-1]
    prod = np.asarray(rows).reshape(-1, d) @ np.asarray(dirs).T
    return prod.T.reshape(dirs.shape[0], *rows.shape[:-1])


def _dots(rows: np.ndarray, dirs: np.ndarray) -> np.ndarray:
    """``|<row, dir>|``: the absolute :func:`_products`, what gamma and psi are made of."""
    return np.abs(_products(rows, dirs))


def _direction_metrics(reading: LayerReading) -> dict[str, np.ndarray]:
    """Every metric measured against directions (:data:`METRICS` with ``nulls``), for
    the K directions of ``reading``: the one definition of these metrics, for the
    stream and for whole runs."""
    return {m.name: m.kernel(reading) for m in METRICS if m.nulls}


def alignment(S: np.ndarray, dirs: np.ndarray, corr: Corr = "cosine") -> dict[str, np.ndarray]:
    """gamma, psi, rho and their mean-token versions of states ``S`` (T+1, P, N, d)
    against per-layer directions ``dirs`` (T, d): the alignment metrics of
    :func:`propagation_metrics` for one run, without the nulls (see the module doc)."""
    S = np.asarray(S, dtype=np.float64)
    Su, Mu = _unit_rows(S, corr), _unit_rows(S.mean(axis=2), corr)
    D = _unit_rows(dirs, corr)

    def per_layer(X: np.ndarray) -> np.ndarray:
        """Layer t's rows X[t] against its own direction D[t]."""
        return np.stack([_dots(x, D[t : t + 1])[0] for t, x in enumerate(X)])

    return _direction_metrics(
        LayerReading(
            per_layer(Su[1:]),
            per_layer(Su[:-1]),
            per_layer(Mu[1:]),
            per_layer(Mu[:-1]),
            psi_round_off(S.shape[-1]),
        )
    )


def propagation_metrics(
    mw: ModelWeights,
    states: Mapping[str, np.ndarray],
    corr: Corr = "cosine",
    n_null_draws: int = 8,
    seed: int = 0,
    proj: Literal["top2", "v1"] = "top2",
    normalize_distance: bool = True,
    directions: Sequence[Mapping[str, Any]] | None = None,
) -> xr.Dataset:
    """All per-layer metrics and null levels for several runs ("modes") of one model.

    ``states`` maps a mode name (e.g. "simplified_real", "simplified_full",
    "real_model") to states (T_mode + 1, n_prompts, n_tokens, d) as returned by
    :func:`~specalign.transformers.measure.propagate.simplified_forward` /
    :func:`~specalign.transformers.load.hf.real_forward_hidden_states`; all modes share the
    prompts. Layer t is measured against the directions of ``F_t`` (prolonged runs repeat
    the last layer's); modes shorter than the longest are NaN-padded.

    Dataset layout (dims: ``mode``, ``layer`` = 1..T, ``token`` = prompt-major flattened
    (prompt, position) with coords ``token_prompt``/``token_position``, ``prompt``,
    ``state`` = 0..T where state 0 is the input):

    * ``gamma``, ``psi``, ``gamma_v2``, ``corr_proj`` (mode, layer, token)
    * ``rho``, ``rho_mean`` (mode, layer); ``gamma_mean``, ``psi_mean`` (mode, layer, prompt)
    * ``token_distance`` (mode, state, prompt)
    * random-direction nulls, averaged over ``n_null_draws`` unit directions per layer drawn
      from ``numpy.random.default_rng(seed)`` (the same draws for every mode):
      ``gamma_null``, ``psi_null`` (mode, layer, token), ``rho_null``, ``rho_mean_null``
      (mode, layer), ``gamma_mean_null``, ``psi_mean_null`` (mode, layer, prompt)
    * most-negative-eigenvector nulls with the same dims: ``gamma_neg_null``,
      ``psi_neg_null``, ``rho_neg_null``, ``gamma_mean_neg_null``, ``psi_mean_neg_null``,
      ``rho_mean_neg_null``
    * per-layer eigenvalues ``lambda_v1``, ``lambda_v2``, ``lambda_neg`` and flag
      ``lambda1_is_complex`` (layer)

    ``corr_proj = |corr(x_i, x_i_proj)|`` with ``x_i_proj`` the orthogonal projection of x_i
    onto a principal subspace of F_t (Figure 5, third panel). ``proj="v1"`` projects onto
    span(v1_t); then x_i_proj is a multiple of v1_t and, for cosine correlation,
    ``corr_proj == gamma`` identically, so it carries no information of its own.
    ``proj="top2"`` (default) projects onto the real invariant subspace of the two
    eigenvalues with the largest real part (``top2_basis`` of
    :func:`~specalign.transformers.measure.directions.principal_directions`: span(v1, v2), or the
    plane of a complex leading pair), the reading under which the panel measures how much
    of each token lies in the principal eigenspace.

    The mean token of a prompt is the plain mean of its states (of the raw hidden states
    for the real model, so larger tokens weigh more).
    Distances use unit-normalised tokens unless ``normalize_distance=False``.
    ``directions``: the blocks' directions from ``spectra.nc`` (see
    :func:`~specalign.transformers.measure.directions.layer_directions`).

    The states are consumed one at a time by :class:`MetricsStream`, which the propagate
    rule feeds as the states are computed; this function feeds it from arrays.
    """
    T, P, N, _ = _states_shape(mw, states)
    stream = MetricsStream(
        mw,
        {mode: np.shape(s)[0] - 1 for mode, s in states.items()},
        P,
        N,
        corrs=(corr,),
        n_null_draws=n_null_draws,
        seed=seed,
        proj=proj,
        normalize_distance=normalize_distance,
        directions=directions,
    )
    for mode, S in states.items():
        for X in S:
            stream.add(mode, X)
    return stream.dataset(corr)


class MetricsStream:
    """The metrics of :func:`propagation_metrics`, computed as the states arrive.

    Every value of layer t is a function of its own two states, x^{t-1} and x^t (psi_t
    compares them against v1_t; gamma_t, the projections and the distances read one),
    so a mode's states are added one at a time, ``add(mode, X)`` with X (n_prompts,
    n_tokens, d) for state 0, 1, ..., T_mode in order, and only the previous state's
    unit rows are kept. A run of T + 1 states is never held: at Llama-3-70B's width a
    48-layer run of 1000 tokens is 3.2 GB in float64, per mode (issue 14). A layer's
    directions (v1, v_neg, v2 and the null draws) meet its states in one matrix product
    per state, and the values are those of :func:`alignment` of the whole run to
    round-off (tested to 1e-12 relative).

    ``modes`` maps each mode to its number of layers T_mode, in the dataset's order;
    ``corrs`` are the correlations computed in the one pass (the propagate rule writes
    both), side by side on ``threads`` cores. ``first_nonfinite[mode]`` is the first
    state with a NaN or inf, if any.
    """

    def __init__(
        self,
        mw: ModelWeights,
        modes: Mapping[str, int],
        n_prompts: int,
        n_tokens: int,
        corrs: Sequence[Corr] = ("cosine",),
        n_null_draws: int = 8,
        seed: int = 0,
        proj: Literal["top2", "v1"] = "top2",
        normalize_distance: bool = True,
        directions: Sequence[Mapping[str, Any]] | None = None,
        threads: int = 1,
    ) -> None:
        if proj not in ("top2", "v1"):
            raise ValueError(f"proj must be 'top2' or 'v1', got {proj!r}")
        if n_null_draws < 1:
            raise ValueError("n_null_draws must be >= 1")
        if not modes:
            raise ValueError("states is empty")
        T = max(modes.values())
        if T < 1:
            raise ValueError("states need at least one layer (T + 1 >= 2)")
        self.mw, self.T, self.P, self.N = mw, T, int(n_prompts), int(n_tokens)
        self.modes = dict(modes)
        self.corrs = tuple(corrs)
        self.n_null_draws, self.seed, self.proj = int(n_null_draws), int(seed), proj
        self.normalize_distance = bool(normalize_distance)
        self.threads = max(int(threads), 1)
        self.dirs = layer_directions(mw, T, directions)
        rng = np.random.default_rng(seed)
        self.rand = unit(rng.standard_normal((n_null_draws, T, mw.d_model)))
        if proj == "v1":
            self.bases = np.zeros((T, mw.d_model, 3))
            self.bases[:, :, 0] = self.dirs["v1"]
        else:
            self.bases = self.dirs["top2_basis"]
        sizes = {"mode": len(modes), "layer": T, "token": self.P * self.N, "prompt": self.P}
        sizes["state"] = T + 1
        self.out = {
            c: {k: np.full([sizes[x] for x in dm], np.nan) for k, dm in _DIMS.items()}
            for c in self.corrs
        }
        self.n_added = dict.fromkeys(modes, 0)
        self.first_nonfinite: dict[str, int] = {}
        self._prev: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}

    def add(self, mode: str | Sequence[str], X: np.ndarray) -> None:
        """The next state (state 0 first), (n_prompts, n_tokens, d), of ``mode``, or of
        each of several modes that share it (a simplified run and its prolonged
        continuation, at the same state): their metrics are computed once."""
        modes = (mode,) if isinstance(mode, str) else tuple(mode)
        for m in modes:
            if m not in self.modes:
                raise ValueError(f"mode {m!r} is not one of {list(self.modes)}")
        t = self.n_added[modes[0]]
        for m in modes:
            if self.n_added[m] != t:
                raise ValueError(f"modes {modes} are not at the same state ({m}: {t})")
            if t > self.modes[m]:
                raise ValueError(f"mode {m!r} has {self.modes[m]} layers: no state {t}")
        S = np.asarray(X, dtype=np.float64)
        if S.shape != (self.P, self.N, self.mw.d_model):
            raise ValueError(
                f"mode {modes[0]!r} state {t}: {S.shape} must be "
                f"({self.P}, {self.N}, {self.mw.d_model})"
            )
        if not np.isfinite(S).all():
            for m in modes:
                self.first_nonfinite.setdefault(m, t)
        index = [list(self.modes).index(m) for m in modes]
        # a state's metrics read no direction, so no correlation: computed once
        state = StateReading(S, self.normalize_distance, token_distance)
        per_state = {m.name: m.kernel(state) for m in METRICS if m.per == "state"}

        def reading(corr: Corr) -> None:
            out = self.out[corr]
            # as a whole run's rows would be: the leading axis is the state's
            Su, Mu = _unit_rows(S[None], corr)[0], _unit_rows(S[None].mean(axis=2), corr)[0]
            rows = {}
            if t > 0:
                rows = self._layer(self._prev[(corr, modes[0])], (Su, Mu), S, t - 1, corr)
            for mi, m in zip(index, modes, strict=True):
                for k, val in per_state.items():
                    out[k][mi, t] = val
                for k, val in rows.items():
                    out[k][mi, t - 1] = val
                self._prev[(corr, m)] = (Su, Mu)

        # the correlations side by side on the job's cores: their norms and dot products
        # are numpy loops on one core each (numpy lets go of the GIL in them), the same
        # operations on the same rows either way; each writes only its own arrays
        n = min(self.threads, len(self.corrs))
        if n > 1:
            with ThreadPoolExecutor(n) as pool:
                list(pool.map(reading, self.corrs))
        else:
            for corr in self.corrs:
                reading(corr)
        for m in modes:
            self.n_added[m] = t + 1
            if t == self.modes[m]:  # the mode's last state: nothing more to compare with
                for corr in self.corrs:
                    del self._prev[(corr, m)]

    def _layer(
        self,
        before: tuple[np.ndarray, np.ndarray],
        after: tuple[np.ndarray, np.ndarray],
        S: np.ndarray,
        i: int,
        corr: Corr,
    ) -> dict[str, np.ndarray]:
        """The values of layer i + 1 (index i), from the unit rows of its input and
        output states (tokens, mean tokens) and the output state S."""
        # the directions in one (R + 3, d) array: v1, v_neg, the R draws, then v2, which
        # only the output is measured against (gamma_v2)
        D = _unit_rows(
            np.vstack(
                [self.dirs["v1"][i], self.dirs["v_neg"][i], self.rand[:, i], self.dirs["v2"][i]]
            ),
            corr,
        )
        a_tok, a_mean = _dots(after[0], D), _dots(after[1], D)
        reading = LayerReading(
            after=a_tok[:-1],
            before=_dots(before[0], D[:-1]),
            mean_after=a_mean[:-1],
            mean_before=_dots(before[1], D[:-1]),
            round_off=psi_round_off(self.mw.d_model),
            rows_before=before[0],
            rows_after=after[0],
            state=S,
            after_v2=a_tok[-1],
            basis=self.bases[i],
            centred=corr == "pearson",
        )
        rows = {}
        for m in METRICS:
            if m.per == "state":
                continue
            value = m.kernel(reading)
            if m.nulls:
                # v1's, then the nulls: v_neg's, and the mean over the random draws
                rows[m.name], rows[m.name + "_neg_null"] = value[0], value[1]
                rows[m.name + "_null"] = value[2:].mean(axis=0)
            else:
                rows[m.name] = value
        return rows

    def dataset(self, corr: Corr) -> xr.Dataset:
        """The metrics under ``corr`` (one of ``corrs``) as :func:`propagation_metrics`
        returns them; every mode must have all its states."""
        missing = {m: n for m, n in self.n_added.items() if n != self.modes[m] + 1}
        if missing:
            raise ValueError(
                "states missing: "
                + ", ".join(f"{m} has {n} of {self.modes[m] + 1}" for m, n in missing.items())
            )
        mw, T, P, N, dirs = self.mw, self.T, self.P, self.N, self.dirs
        data_vars: dict[str, Any] = {k: (_DIMS[k], a) for k, a in self.out[corr].items()}
        for k in ("lambda_v1", "lambda_v2", "lambda_neg"):
            data_vars[k] = (("layer",), dirs[k].astype(np.float64))
        data_vars["lambda1_is_complex"] = (("layer",), dirs["lambda1_is_complex"].astype(np.int8))
        schedule = layer_schedule(mw, T)
        coords = {
            "mode": list(self.modes),
            # layers 1..T as the paper counts them, each with its block (the repeated
            # layer's past the model's depth); state t is the output of layer t, state 0
            # the embedding
            "layer": np.arange(1, T + 1),
            "layer_block": ("layer", np.array([s[0] for s in schedule], dtype=np.int64)),
            "state": np.arange(T + 1),
            "prompt": np.arange(P),
            "token": np.arange(P * N),
            "token_prompt": ("token", np.repeat(np.arange(P), N)),
            "token_position": ("token", np.tile(np.arange(N), P)),
        }
        return xr.Dataset(
            data_vars,
            coords=coords,
            attrs={
                "corr": corr,
                "n_null_draws": self.n_null_draws,
                "null_seed": self.seed,
                "proj": self.proj,
                "normalize_distance": int(self.normalize_distance),
                "family": mw.family,
                "source": mw.source,
                "description": (
                    "Li & Altafini (arXiv:2605.25619) alignment metrics: "
                    "gamma=|corr(x_t, v1_t)|, psi=|corr(x_t, v1_t)|-|corr(x_{t-1}, v1_t)|, "
                    "rho=P(psi>d*eps), a rise above round-off; *_mean for the mean token "
                    "of each prompt; *_null "
                    "against random unit directions, *_neg_null against the eigenvector "
                    "of the most negative eigenvalue."
                ),
            },
        )


_DIMS = dims()


def _states_shape(mw: ModelWeights, states: Mapping[str, np.ndarray]) -> tuple[int, ...]:
    """(T, n_prompts, n_tokens, d) shared by all modes, T the longest; checked."""
    if not states:
        raise ValueError("states is empty")
    shapes = {m: np.asarray(s).shape for m, s in states.items()}
    base = next(iter(shapes.values()))
    for m, sh in shapes.items():
        if len(sh) != 4 or sh[1:] != base[1:] or sh[-1] != mw.d_model:
            raise ValueError(
                f"mode {m!r}: states {sh} must be (T+1, n_prompts, n_tokens, {mw.d_model}) "
                f"with the same prompts as the others {base}"
            )
    T = max(sh[0] for sh in shapes.values()) - 1
    if T < 1:
        raise ValueError("states need at least one layer (T + 1 >= 2)")
    return (T, *base[1:])
