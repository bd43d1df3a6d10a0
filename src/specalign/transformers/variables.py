"""What every variable of the transformer study's netCDF files is, in the files themselves.

Each file's writer ends with :func:`describe`, which gives every variable (coordinates
included) the ``description`` of the tables below, unless the writer set one itself, and
states the conventions shared by all files as file attributes (:data:`CONVENTIONS`).

Layer numbering (one for every file, table and figure): layers are t = 1..L as Li &
Altafini count them, layer t mapping the state x_{t-1} to x_t; where a file holds states,
``state`` t is the output of layer t and state 0 the embedding output. Blocks are the
distinct attention weights, 0-based, and appear only under the name ``block``; the
``layer_block`` coordinate maps each layer to its block (all layers to block 0 for a
shared-weight model such as ALBERT; past the model's depth, for the prolonged runs, the
block of the layer that is repeated). Every quantity here is dimensionless (ratios of
activations of the residual stream, eigenvalues of maps from it to itself, correlations,
probabilities), so no variable has a ``units`` attribute.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from specalign.transformers import metric_table

if TYPE_CHECKING:
    import xarray as xr

#: File attributes written into every transformer netCDF file.
CONVENTIONS: dict[str, str] = {
    "layer_numbering": (
        "layer t = 1..L as the paper counts them (layer t maps x_{t-1} to x_t); state t is "
        "the output of layer t, state 0 the embedding output; block b = 0..n_blocks-1 "
        "indexes distinct attention weights; layer_block[t] is the block of layer t"
    ),
    "vector_convention": (
        "column vectors, y = W x + b with W stored (out, in); F = W_O W_V maps the residual "
        "stream to itself, so eigenvectors are right eigenvectors F v = lambda v. "
        "TransformerLens's row-vector W_OV[h] = W_V[h] @ W_O[h] (shape (d_model, d_model), "
        "x W_OV) is the transpose of this F^h: F = sum_h W_OV[h].T, with the same eigenvalues "
        "and these vectors as its left eigenvectors"
    ),
    "units": "every quantity is dimensionless; no variable has a units attribute",
}

_LAYER = "layer t = 1..L (paper numbering; layer t maps x_{t-1} to x_t)"
_BLOCK = "0-based index of a distinct block of attention weights"
_LAYER_BLOCK = "block whose attention weights layer t uses (shared-weight models: all 0)"
_COMMON: dict[str, str] = {
    "layer": _LAYER,
    "block": _BLOCK,
    "layer_block": _LAYER_BLOCK,
    "component": "component of a vector in the residual stream (0..d_model-1)",
    "token": "token index, prompt-major: token = prompt * n_tokens + position",
    "prompt": "0-based prompt index",
    "token_prompt": "the prompt this token belongs to",
    "token_position": "0-based position of this token in its prompt",
}

SPECTRA: dict[str, str] = {
    **_COMMON,
    "eig": "1-based rank of the eigenvalue in the sort order",
    "plane": "index of the two basis vectors of the plane of a complex lambda_1",
    "basis": "index of the (zero-padded) basis vectors of direction_basis",
    "eigenvalues_real": "Re lambda_i of F_b = W_O W_V, sorted by real part descending",
    "eigenvalues_imag": "Im lambda_i of F_b, same order (conjugate pairs: + first)",
    "v1_real": "Re v1: eigenvector of lambda_1, unit 2-norm, largest component real positive",
    "v1_imag": "Im v1 (0 when lambda_1 is real)",
    "v2_real": "Re v2: eigenvector of lambda_2, normalised as v1",
    "v2_imag": "Im v2",
    "v1_leading_real": (
        "the direction gamma measures against: v1 if lambda_1 is real, else the eigenvector "
        "of the real eigenvalue with the largest real part (NaN if F has none)"
    ),
    "v1_plane": ("orthonormal basis of span{Re v1, Im v1} when lambda_1 is complex, NaN otherwise"),
    "gap": "spectral gap Re l1 - Re l2, or Re l1 - Re l3 when l2 = conj(l1) (paper Fig. 7)",
    "spectral_radius": "max |lambda_i| of F_b",
    "radius_is_negative": "1 when the eigenvalue attaining the spectral radius has Re < 0",
    "lambda1_is_complex": "1 when lambda_1 (largest real part) is complex",
    "leading_real_index": "0-based sorted index of the leading real eigenvalue, -1 if none",
    "n_zero_eigenvalues": (
        "eigenvalues of F that are exactly 0 because rank F <= rank_bound = n_kv_heads * "
        "d_head < d_model (grouped-query attention); not listed in eigenvalues_real/_imag "
        "(0 for a block decomposed densely)"
    ),
    "zero_eigenvalues_index": (
        "how many listed eigenvalues precede F's exact zeros in the sort order: the zeros "
        "hold ranks index+1 .. index+n_zero_eigenvalues of F's spectrum (-1: there are none)"
    ),
    "eigenpair_residual": (
        "max over the returned eigenpairs (v1, v2, direction_v1, direction_v2, "
        "direction_v_neg) of |F v - lambda v|_2 / spectral_radius, v of unit norm"
    ),
    "head": "0-based query head index within the block",
    "head_eig": "1-based rank of a head eigenvalue in the sort order",
    "head_eigenvalues_real": (
        "Re of the eigenvalues of W_V^h W_O^h (d_head x d_head): the nonzero eigenvalues of "
        "head h's OV circuit F_h = W_O^h W_V^h, sorted as eigenvalues_real"
    ),
    "head_eigenvalues_imag": "Im of the eigenvalues of head_eigenvalues_real, same order",
    "head_lambda1_real": (
        "Re of F_h's leading eigenvalue (largest real part; 0 when every eigenvalue of "
        "W_V^h W_O^h has negative real part, F_h's exact zeros then leading)"
    ),
    "head_lambda1_imag": "Im of F_h's leading eigenvalue",
    "head_positive_fraction": (
        "sum_k max(Re lambda_k, 0) / sum_k |lambda_k| over F_h's eigenvalues: the share of "
        "the head's eigenvalue mass on the positive real side (1: a copying head); NaN when "
        "F_h = 0"
    ),
    "lambda_I_plus_etaF_real": "Re of the dominant (largest-modulus) eigenvalue of I + eta F",
    "lambda_I_plus_etaF_imag": "Im of the dominant eigenvalue of I + eta F",
    "dominant_is_lambda1": (
        "1 when the dominant eigenvalue of I + eta F is 1 + eta lambda_1, i.e. the power "
        "method on I + eta F converges to v1's direction"
    ),
    "eta_bound": "step-size bound 2/|Re l1 + Re ld| when -Re ld > Re l1, else inf (Theorem 3)",
    "direction_v1": (
        "real unit eigenvector of the real eigenvalue with the largest real part (sign: "
        "largest component positive); what propagation's gamma measures against"
    ),
    "direction_v2": "real unit eigenvector of the real eigenvalue with the 2nd largest real part",
    "direction_v_neg": "real unit eigenvector of the most negative real eigenvalue (the null)",
    "lambda_v1": "the eigenvalue of direction_v1",
    "lambda_v2": "the eigenvalue of direction_v2",
    "lambda_neg": "the eigenvalue of direction_v_neg",
    "direction_basis": (
        "orthonormal basis (zero-padded to 3 columns) of the real invariant subspace of the "
        "first two eigenvalues in the sort order (corr_proj's projection)"
    ),
}

PROPAGATION: dict[str, str] = {
    **_COMMON,
    "layer_block": _LAYER_BLOCK + "; past the model's depth, the repeated layer's block",
    "mode": (
        "forward pass: simplified_real / simplified_full (the paper's simplified model, real "
        "/ full attention), real_model (the real model's hidden states), prolonged_real / "
        "prolonged_full (the simplified model repeating the last layer, Fig. 6)"
    ),
    "state": "state t = output of layer t; state 0 is the embedding output",
    # the metrics, from the one table that declares them
    **metric_table.descriptions(),
    "lambda_v1": "eigenvalue of v1_t, the leading real eigenvalue of F_t",
    "lambda_v2": "eigenvalue of v2_t",
    "lambda_neg": "the most negative real eigenvalue of F_t",
    "lambda1_is_complex": "1 when lambda_1 of F_t is complex (v1_t is then the leading real one)",
}

STEERING: dict[str, str] = {
    **_COMMON,
    "layer_block": _LAYER_BLOCK + " (of the unsteered model)",
    "method": (
        "construction of the W_O change (min_norm or lstsq; specalign.transformers.measure.steer)"
    ),
    "c": "target eigenvalue of u as a multiple of the spectral radius r of the last F",
    "variant": "original: the unchanged model; steered: the last layer's W_O changed",
    "component": "component of the residual stream",
    "gamma_u": "gamma_u = |cos(x_i, u)| of each token after the last layer",
    "gamma_u_mean": "gamma_u of the mean token of each prompt after the last layer",
    "gamma_u_null": "|cos(x_i, r)| for random unit r, averaged over null_draws (chance level)",
    "gamma_layers": (
        "gamma_t = |corr(x_t, v1_t)| per token of the steered model; layers before the last "
        "are the unchanged model's"
    ),
    "rho_layers": "rho_t = fraction of tokens with psi_t > d*eps, steered model",
    "relative_change": "||W_O' - W_O||_F / ||W_O||_F",
    "residual": "||F' u - c r u|| / |c r| (/ r, the old spectral radius, for c = 0): 0 "
    "when u is an exact eigenvector of the new F'",
    "target_eigenvalue": "c r, the eigenvalue u was given",
    "u_is_leading": "1 when c r is (one of) the eigenvalues of F' of largest real part",
    "p_before": "next-token probability of the target, original model (NaN if not a causal LM)",
    "p_after": "the same with the steered W_O (NaN if the model is not a causal LM)",
    "u": "the target direction: the unit input embedding of the target token",
}

SPHERE: dict[str, str] = {
    "row": "row index of F (output component)",
    "col": "column index of F (input component)",
    "k": "0-based index of the consensus point x_i = v_k (by decreasing eigenvalue)",
    "component": "coordinate of R^d",
    "step": "step of the dynamics (0 = the initial state)",
    "token": "token index",
    "perturbation": "size of the random perturbation of the bipartite consensus",
    "mode": "index of the sorted moduli of the tangent Jacobian's eigenvalues (n d - n)",
    "mode_supplement": "index of the supplement's listed eigenvalues (n d), NaN-padded",
    "F": "F = Q diag(eigenvalues) Q^T, Q a seeded random orthogonal matrix (symmetric)",
    "eigenvalues": "eigenvalues lambda_k of F, decreasing",
    "eigenvectors": "unit eigenvectors v_k of F (columns)",
    "traj_single": "token trajectories, one head with softmax attention (Figure 13)",
    "traj_multi": "token trajectories, heads with softmax attention, F split across them",
    "traj_full": "token trajectories, full attention A = 1/n (power method on I + eta F)",
    "corr_v1_single": "x_i . v1 along traj_single",
    "corr_v1_multi": "x_i . v1 along traj_multi",
    "traj_bipartite": "trajectories from the perturbed bipartite consensus +-v1 (Figure 14)",
    "bipartite_distance": "Frobenius distance of traj_bipartite from the bipartite consensus",
    "jacobian_numeric": "sorted |eigenvalues| of the float64 autograd tangent Jacobian at v_k",
    "jacobian_closed_form": "sorted |eigenvalues| of the closed-form tangent Jacobian at v_k",
    "jacobian_supplement": "sorted |values| of the supplement's list at v_k (incl. radial ones)",
    "jacobian_max_abs_diff": "max |jacobian_numeric - jacobian_closed_form| (identity residual)",
    "jacobian_spectral_radius": "largest |eigenvalue| of the tangent Jacobian at v_k",
    "stable": "1 when jacobian_spectral_radius < 1 (consensus at v_k is attracting)",
    "gamma_full": "|x_i . v1| along traj_full",
}


def describe(ds: xr.Dataset, table: Mapping[str, str], conventions: bool = True) -> xr.Dataset:
    """``ds`` with a ``description`` on every variable of ``table`` that lacks one, and
    (with ``conventions``) the :data:`CONVENTIONS` attributes. Variables named
    ``<var>_<corr>`` (the other correlation's copies) keep the one their writer gave."""
    for name in ds.variables:
        if not ds[name].attrs.get("description") and name in table:
            ds[name].attrs["description"] = table[name]
    if conventions:
        ds.attrs.update(CONVENTIONS)
    return ds


def undescribed(ds: xr.Dataset) -> list[str]:
    """The variables (coordinates included) of ``ds`` without a non-empty description."""
    return [str(n) for n in ds.variables if not str(ds[n].attrs.get("description", "")).strip()]
