"""The supplement's sphere figures (Li & Altafini, arXiv:2605.25619, supplement Figs. 13,
14) from ``sphere.nc``: self-attention dynamics on S^{d-1}, single- and multi-head, and
the bipartite consensus under each configured perturbation, drawn in F's eigenbasis."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from specalign import figstyle
from specalign.lazy import LazyModule
from specalign.transformers.report.figures.style import (
    _NULL,
)
from specalign.transformers.report.tables import (
    bipartite_outcomes,
    random_unit_overlap,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from mpl_toolkits.mplot3d.axes3d import Axes3D

xr = LazyModule("xarray")
mpl_figure = LazyModule("matplotlib.figure")

#: Seeded random unit directions averaged for the null of Fig. 13's |corr(x_i, v1)|.
_SPHERE_NULL_DIRECTIONS = 64


def _eigen_coords(traj: np.ndarray, V: np.ndarray) -> np.ndarray:
    """Coordinates of (..., d) states in F's first three eigenvectors (x . v_k), so a
    d > 3 example still lands on a 3-D picture; for d = 3 a rotation of S^2."""
    k = min(3, V.shape[1])
    out = np.zeros((*traj.shape[:-1], 3))
    out[..., :k] = traj @ V[:, :k]
    return out


def _sphere_axes(ax: Axes3D, V: np.ndarray) -> None:
    u, v = np.mgrid[0 : 2 * np.pi : 24j, 0 : np.pi : 12j]
    ax.plot_wireframe(np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v), color="0.85", lw=0.4)
    ax.scatter(
        [1, -1],
        [0, 0],
        [0, 0],
        marker="*",
        s=90,
        color="tab:red",
        depthshade=False,
        label="$\\pm v_1$",
    )
    ax.set_xlabel("$\\langle x, v_1\\rangle$", fontsize="small", labelpad=-4)
    ax.set_ylabel("$\\langle x, v_2\\rangle$", fontsize="small", labelpad=-4)
    ax.set_zlabel("$\\langle x, v_3\\rangle$", fontsize="small", labelpad=-4)
    # three ticks per axis: the default eight run together at this size
    for axis in (ax.xaxis, ax.yaxis, ax.zaxis):
        axis.set_ticks([-1.0, 0.0, 1.0])
    ax.tick_params(labelsize="x-small", pad=0)
    ax.set_box_aspect((1, 1, 1))


def _trajectories_3d(ax: Axes3D, coords: np.ndarray) -> None:
    """coords (step, token, 3): one line per token and a solid dot at its endpoint."""
    pal = figstyle.cyclic(coords.shape[1])
    for i in range(coords.shape[1]):
        c = coords[:, i]
        ax.plot(c[:, 0], c[:, 1], c[:, 2], color=pal[i], lw=1.0)
        ax.scatter(
            c[-1:, 0],
            c[-1:, 1],
            c[-1:, 2],
            color=pal[i],
            s=28,
            depthshade=False,
        )
        ax.scatter(
            c[:1, 0],
            c[:1, 1],
            c[:1, 2],
            color=pal[i],
            s=10,
            marker="o",
            facecolors="none",
            depthshade=False,
        )


def _random_direction_corr(traj: np.ndarray, seed: int) -> np.ndarray:
    """Mean over tokens and over seeded random unit directions r of |<x_i(step), r>|:
    what |corr(x_i, v1)| would read if v1 were unrelated to F."""
    d = traj.shape[-1]
    R = np.random.default_rng(seed).standard_normal((_SPHERE_NULL_DIRECTIONS, d))
    R /= np.linalg.norm(R, axis=1, keepdims=True)
    return np.abs(traj @ R.T).mean(axis=(1, 2))


def sphere_figure13(sphere: xr.Dataset) -> tuple[Figure, str]:
    """Supplement Fig. 13: single-head and multi-head softmax self-attention dynamics on
    S^{d-1}: trajectories with their endpoints, and |corr(x_i, v1)| against the step with
    the random-direction null."""
    V = np.asarray(sphere["eigenvectors"].values, dtype=float)
    seed = int(sphere.attrs.get("seed", 0))
    d, n, H = int(sphere.attrs["d"]), int(sphere.attrs["n"]), int(sphere.attrs["heads"])
    finals = {}
    with figstyle.axes_style():
        fig = mpl_figure.Figure(figsize=(10.0, 8.6), layout="constrained")
        gs = fig.add_gridspec(2, 2, width_ratios=[1.0, 1.2])
        for row, (key, label) in enumerate(
            (("single", "single head"), ("multi", f"multi-head ({H} heads)"))
        ):
            traj = np.asarray(sphere[f"traj_{key}"].values, dtype=float)
            ax3 = fig.add_subplot(gs[row, 0], projection="3d")
            _sphere_axes(ax3, V)
            _trajectories_3d(ax3, _eigen_coords(traj, V))
            ax3.set_title(
                f"({'ab'[row]}) {label}: trajectories on $S^{{{d - 1}}}$", fontsize="medium"
            )
            ax3.legend(fontsize="x-small", loc="upper left")
            ax = fig.add_subplot(gs[row, 1])
            corr = np.abs(np.asarray(sphere[f"corr_v1_{key}"].values, dtype=float))
            steps = sphere["step"].values
            ax.plot(steps, corr, color="0.6", lw=0.6)
            ax.plot(steps, corr.mean(axis=1), color="tab:red", lw=2.0, label="mean over tokens")
            ax.plot(
                steps,
                _random_direction_corr(traj, seed),
                color=_NULL,
                ls="--",
                label=f"random direction ({_SPHERE_NULL_DIRECTIONS} draws)",
            )
            ax.set_ylim(-0.02, 1.02)
            ax.set_xlabel("step")
            ax.set_ylabel("$|corr(x_i, v_1)|$")
            ax.set_title(f"{label}: alignment with $v_1$", fontsize="medium")
            ax.legend(fontsize="x-small")
            finals[key] = (float(corr[-1].min()), float(corr[-1].mean()))
    null = random_unit_overlap(d)
    lam = ", ".join(f"{v:g}" for v in np.asarray(sphere["eigenvalues"].values, dtype=float))
    caption = (
        f"Self-attention dynamics on the sphere, d = {d}, n = {n} tokens (supplement Fig. 13): "
        f"(a) single head, (b) {H} heads, softmax attention with beta = "
        f"{sphere.attrs.get('beta', '?')}, eta = {sphere.attrs.get('eta', '?')}, symmetric "
        f"F with eigenvalues {lam}. Left: token trajectories in F's eigenbasis "
        "(coordinates <x, v_k>), open dot = start, solid dot = endpoint, stars = +-v1. "
        "Right: |corr(x_i, v1)| per token (gray) and its mean (red) against the step (absolute "
        "value: the consensus may form at -v1). Null (dashed): the same for random unit "
        f"directions, expectation {null:.3f} for d = {d}. Final min/mean |corr(x_i, v1)|: "
        f"single head {finals['single'][0]:.4f}/{finals['single'][1]:.4f}, multi-head "
        f"{finals['multi'][0]:.4f}/{finals['multi'][1]:.4f}."
    )
    return fig, caption


def sphere_figure14(sphere: xr.Dataset) -> tuple[Figure, str]:
    """Supplement Fig. 14: bipartite consensus along v1 perturbed by each configured size:
    trajectories and the distance to the bipartite equilibrium against the step."""
    V = np.asarray(sphere["eigenvectors"].values, dtype=float)
    d, n = int(sphere.attrs["d"]), int(sphere.attrs["n"])
    n1, n2 = n // 2, n - n // 2  # as sphere.sphere_dataset builds the equilibrium
    perts = [float(p) for p in sphere["perturbation"].values]
    dist = np.asarray(sphere["bipartite_distance"].values, dtype=float)
    steps = sphere["step"].values
    pal = figstyle.qualitative(len(perts))
    outcomes = bipartite_outcomes(sphere)
    with figstyle.axes_style():
        height = 4.4 * max(len(perts), 1) ** 0.8
        fig = mpl_figure.Figure(figsize=(10.0, height), layout="constrained")
        left, right = fig.subfigures(1, 2, width_ratios=[1.0, 1.1])
        for k, p in enumerate(perts):
            ax3 = left.add_subplot(len(perts), 1, k + 1, projection="3d")
            _sphere_axes(ax3, V)
            traj = np.asarray(sphere["traj_bipartite"].isel(perturbation=k).values, dtype=float)
            _trajectories_3d(ax3, _eigen_coords(traj, V))
            ax3.set_title(
                f"({'abcdefgh'[k % 8]}) perturbation {p:g}: {outcomes[k]['outcome']}",
                fontsize="medium",
            )
        ax = right.subplots()
        for k, p in enumerate(perts):
            ax.semilogy(
                steps, np.maximum(dist[k], 1e-16), color=pal[k], label=f"perturbation {p:g}"
            )
        # Every token sitting at +-v1 puts the distance on a lattice: 2 sqrt(m) for m
        # tokens on the other side; full consensus is m = n1 or n2, one switch is m = 1.
        # One line per level: with an even split full consensus is at sqrt(2n), the
        # random-token level, and is drawn (and listed) once, saying both.
        random_level = math.sqrt(2.0 * n)
        levels = sorted({2 * math.sqrt(n1), 2 * math.sqrt(n2)})
        for lv in levels:
            same = math.isclose(lv, random_level, rel_tol=1e-12)
            ax.axhline(
                lv,
                color="k",
                ls=":",
                lw=1.0,
                label=f"full consensus at $\\pm v_1$ ({lv:.2f})"
                + (" = random tokens ($\\sqrt{2n}$)" if same else ""),
            )
        ax.axhline(2.0, color="k", ls="-.", lw=0.8, label="one token switched sides (2)")
        if not any(math.isclose(lv, random_level, rel_tol=1e-12) for lv in levels):
            ax.axhline(
                random_level,
                color=_NULL,
                ls="--",
                lw=1.0,
                label=f"random tokens ($\\sqrt{{2n}}$ = {random_level:.2f})",
            )
        ax.set_xlabel("step")
        ax.set_ylabel("$\\|X_t - X_{bip}\\|_F$")
        ax.set_title("distance to the bipartite equilibrium", fontsize="medium")
        # below the axes: inside, it would cover the reference levels near the top
        ax.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.1))
    caption = (
        f"Bipartite consensus on the sphere, d = {d}, n = {n} ({n1} tokens at v1, {n2} at "
        "-v1), single-head softmax attention (supplement Fig. 14): each configured "
        "perturbation of the bipartite equilibrium. Left: trajectories in F's eigenbasis "
        "(solid dot = endpoint, stars = +-v1). Right: Frobenius distance to the bipartite "
        "state against the step (log scale). Null level (dashed): sqrt(2n), the expected "
        "distance of independent uniformly random tokens in high dimension; reference "
        "levels (dotted, dash-dotted): full consensus at +-v1, where the paper's escaping "
        "trajectory ends (equal to sqrt(2n) for an even split), and one token switched to "
        "the other side. "
        + "; ".join(
            f"perturbation {o['perturbation']:g}: distance {o['distance_start']:.3g} -> "
            f"{o['distance_end']:.3g} ({o['text']})"
            for o in outcomes
        )
        + "."
    )
    return fig, caption
