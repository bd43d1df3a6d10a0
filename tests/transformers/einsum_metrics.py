"""The per-state metrics as propagate computed them before issue 33: one ``np.einsum``
reduction per direction, the projection as two einsums, rho counting every ``psi > 0``.

Kept only to compare the matrix-product form with it (issue 33: values equal to the
previous method's to 1e-12 relative in float64), with the metrics added since written
the same plain way; not used by the package.
"""

from __future__ import annotations

import numpy as np

from specalign.transformers.measure import directions, linalg


def _unit(X: np.ndarray, corr: str) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if corr == "pearson":
        X = X - X.mean(axis=-1, keepdims=True)
    norm = np.linalg.norm(X, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norm > 0, X / np.where(norm > 0, norm, 1.0), np.nan)


def _align(Sb, Sa, Mb, Ma, v):
    after = np.abs(np.einsum("pnd,d->pn", Sa, v))
    before = np.abs(np.einsum("pnd,d->pn", Sb, v))
    m_after = np.abs(np.einsum("pd,d->p", Ma, v))
    m_before = np.abs(np.einsum("pd,d->p", Mb, v))
    psi, psi_m = after - before, m_after - m_before
    return {
        "gamma": after.reshape(-1),
        "psi": psi.reshape(-1),
        "rho": (psi > 0).mean(),
        "gamma_mean": m_after,
        "psi_mean": psi_m,
        "rho_mean": (psi_m > 0).mean(),
    }


def layer_metrics(mw, S, T, corr, n_null_draws, seed):
    """The metrics of a run's states S (T + 1, P, N, d) against the model's directions,
    per layer, as the previous method computed them: {name: list over layers}."""
    dirs = directions.layer_directions(mw, T)
    rand = linalg.unit(np.random.default_rng(seed).standard_normal((n_null_draws, T, mw.d_model)))
    out: dict[str, list] = {}
    for t in range(1, S.shape[0]):
        i = t - 1
        Sb, Sa = _unit(S[t - 1], corr), _unit(S[t], corr)
        Mb, Ma = _unit(S[t - 1].mean(axis=1), corr), _unit(S[t].mean(axis=1), corr)
        vals = _align(Sb, Sa, Mb, Ma, _unit(dirs["v1"][i], corr))
        vals.update(
            {
                k + "_neg_null": v
                for k, v in _align(Sb, Sa, Mb, Ma, _unit(dirs["v_neg"][i], corr)).items()
            }
        )
        draws = [_align(Sb, Sa, Mb, Ma, _unit(r[i], corr)) for r in rand]
        vals.update({k + "_null": np.mean([dr[k] for dr in draws], axis=0) for k in draws[0]})
        X = S[t]
        Xc = X - X.mean(axis=-1, keepdims=True) if corr == "pearson" else X
        v2 = _unit(dirs["v2"][i], corr)
        vals["gamma_v2"] = np.abs(np.einsum("pnd,d->pn", _unit(Xc, "cosine"), v2)).reshape(-1)
        B = dirs["top2_basis"][i]
        proj = np.einsum("dk,pnk->pnd", B, np.einsum("dk,pnd->pnk", B, X))
        vals["corr_proj"] = np.abs(
            np.einsum("pnd,pnd->pn", _unit(Xc, "cosine"), _unit(proj, corr))
        ).reshape(-1)
        # each token against itself before the layer
        vals["corr_step"] = np.abs(np.einsum("pnd,pnd->pn", Sa, Sb)).reshape(-1)
        for k, v in vals.items():
            out.setdefault(k, []).append(v)
    return out
