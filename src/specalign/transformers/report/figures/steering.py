"""The steering figure of one model's ``steering.nc`` (Li & Altafini, arXiv:2605.25619,
Section 3.3, paper Figs. 3 and 10): the last layer's W_O changed so that a token's
embedding u becomes an eigenvector of F, and what that does to the alignment with u,
to the per-layer gamma and rho, and to the target's next-token probability."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from specalign import figstyle
from specalign.lazy import LazyModule
from specalign.output import nanmean as _nanmean
from specalign.transformers.report.figures.style import (
    _NULL,
    _integer_x,
    _nanstats,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

xr = LazyModule("xarray")
mpl_figure = LazyModule("matplotlib.figure")


def _method_offsets(pos: np.ndarray, k: int, n_methods: int, width: float) -> np.ndarray:
    """x positions of method ``k``'s markers in a group of ``n_methods`` per c."""
    return pos + (k - (n_methods - 1) / 2) * width


def _steering_target_panel(
    ax: Axes, steer: xr.Dataset, pal: Mapping[str, Any], null_all: float
) -> None:
    """gamma_u after the last layer per (method, c), original (open) vs steered (filled)."""
    methods = [str(m) for m in steer["method"].values]
    cs = [float(c) for c in steer["c"].values]
    pos = np.arange(len(cs), dtype=float)
    width = 0.8 / max(len(methods), 1)
    for k, method in enumerate(methods):
        sub = steer.sel({"method": method})
        off = _method_offsets(pos, k, len(methods), width)
        for v, marker, fill in (("original", "o", "none"), ("steered", "D", pal[method])):
            m, s = _nanstats(sub["gamma_u"].sel(variant=v), "token")
            ax.errorbar(
                off + (0.12 * width if v == "steered" else -0.12 * width),
                m,
                yerr=s,
                fmt=marker,
                color=pal[method],
                mfc=fill,
                capsize=2,
                label=f"{method}, {v}",
            )
    ax.axhline(null_all, color=_NULL, ls="--", lw=1.0, label="random direction")
    ax.set_xticks(pos, [f"c={c:g}" for c in cs])
    ax.set_ylabel("$\\gamma_u = |cos(x_i^T, u)|$ after the last layer")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("alignment with the target u (mean $\\pm$ sd over tokens)")
    ax.legend(fontsize="x-small", ncol=2)


def _steering_size_panel(ax: Axes, steer: xr.Dataset, pal: Mapping[str, Any]) -> None:
    """||Delta W_O||_F / ||W_O||_F per method against c."""
    cs = [float(c) for c in steer["c"].values]
    for method in [str(m) for m in steer["method"].values]:
        sub = steer.sel({"method": method})
        ax.semilogy(cs, sub["relative_change"].values, marker="o", color=pal[method], label=method)
    ax.axhline(1.0, color="tab:red", ls=":", lw=1.0, label="$\\|\\Delta\\| = \\|W_O\\|$")
    ax.set_xlabel("c (target eigenvalue / spectral radius)")
    ax.set_ylabel("$\\|\\Delta W_O\\|_F / \\|W_O\\|_F$")
    ax.set_title("size of the change")
    ax.legend(fontsize="x-small")


def _steered_layers_panels(ax_g: Axes, ax_r: Axes, steer: xr.Dataset, null_all: float) -> None:
    """The paper's per-layer gamma_t and rho_t of every steered model."""
    cs = [float(c) for c in steer["c"].values]
    c_pal = figstyle.sequential(len(cs))
    layers = steer["layer"].values
    for k, method in enumerate(str(m) for m in steer["method"].values):
        sub = steer.sel({"method": method})
        ls = "-" if k == 0 else "--"
        for j, c in enumerate(cs):
            g = _nanstats(sub["gamma_layers"].sel(c=c), "token")[0]
            label = f"{method}, c={c:g}"
            ax_g.plot(layers, g, color=c_pal[j], ls=ls, marker="o", ms=3, label=label)
            rho = sub["rho_layers"].sel(c=c).values
            ax_r.plot(layers, rho, color=c_pal[j], ls=ls, marker="o", ms=3, label=label)
    ax_g.axhline(null_all, color=_NULL, ls="--", lw=1.0, label="random direction")
    ax_g.set_ylabel("$\\gamma_t$ of the steered model")
    ax_g.set_ylim(-0.02, 1.02)
    ax_r.axhline(0.5, color=_NULL, ls="--", lw=1.0, label="0.5 (no preferred sign)")
    ax_r.set_ylabel("$\\rho_t$ of the steered model")
    ax_r.set_ylim(-0.03, 1.03)
    for ax in (ax_g, ax_r):
        ax.set_xlabel("layer $t$")
        _integer_x(ax)
        ax.legend(fontsize="x-small", ncol=2)


def _next_token_panel(ax: Axes, steer: xr.Dataset, pal: Mapping[str, Any]) -> str:
    """Change of the target's next-token probability per (method, c); returns the
    caption sentence."""
    methods = [str(m) for m in steer["method"].values]
    cs = [float(c) for c in steer["c"].values]
    pos = np.arange(len(cs), dtype=float)
    width = 0.8 / max(len(methods), 1)
    for k, method in enumerate(methods):
        sub = steer.sel({"method": method})
        m, s = _nanstats(sub["p_after"] - sub["p_before"], "prompt")
        off = _method_offsets(pos, k, len(methods), width)
        ax.errorbar(off, m, yerr=s, fmt="o", color=pal[method], capsize=2, label=method)
    ax.axhline(0.0, color=_NULL, ls="--", lw=1.0, label="no change")
    ax.set_xticks(pos, [f"c={c:g}" for c in cs])
    ax.set_ylabel("$p_{after} - p_{before}$ (target as next token)")
    ax.legend(fontsize="x-small")
    return (
        " Bottom: change of the probability that the real model (LM head) predicts the "
        f"target token next, mean +- sd over prompts (mean before "
        f"{_nanmean(steer['p_before']):.3g}); null: no change."
    )


def steering_target_text(steer: xr.Dataset) -> str:
    """The token the steering aimed at, as ``steer`` records it: ``'the' (id 1996)``.

    ``target_text`` is only what was configured; with a ``target_id`` (or a text that
    encodes to several tokens) the target is the token in ``target_tokens``/``target_id``.
    """
    import json

    pieces: list[str] = []
    try:
        pieces = [str(p) for p in json.loads(str(steer.attrs.get("target_tokens", "[]")))]
    except ValueError:
        pieces = []
    tid = steer.attrs.get("target_id")
    token = pieces[0] if pieces else str(steer.attrs.get("target_text", "?"))
    return f"'{token}'" + (f" (id {int(tid)})" if tid is not None else "")


def _steering_caption(steer: xr.Dataset, model: str, null_all: float, p_text: str) -> str:
    rows = []
    for method in [str(m) for m in steer["method"].values]:
        for c in [float(c) for c in steer["c"].values]:
            sub = steer.sel({"method": method, "c": c})
            rows.append(
                f"{method} c={c:g}: {_nanmean(sub['gamma_u'].sel(variant='original')):.3f} -> "
                f"{_nanmean(sub['gamma_u'].sel(variant='steered')):.3f} "
                f"(|dW_O|/|W_O| {float(sub['relative_change']):.3g})"
            )
    return (
        f"Steering {model}'s last layer towards the input embedding u of the token "
        f"{steering_target_text(steer)} by changing only W_O so that u is an "
        "eigenvector of F' = W_O' W_V with eigenvalue c r (paper Figs. 3 and 10; r the old "
        "spectral radius). Top left: gamma_u after the last layer of the simplified model "
        "(real attention), original (open) vs steered (filled); null: random unit "
        f"directions, {null_all:.3f} (dashed). Top right: relative Frobenius size of the W_O "
        "change per method (dotted: as large as W_O itself, beyond which the layer is "
        "replaced rather than steered). Middle: the paper's per-layer gamma_t (null: the "
        "same random-direction level) and rho_t (reference 0.5) of the steered models; "
        "only the last layer differs from the original. gamma_u original -> steered: "
        + "; ".join(rows)
        + "."
        + p_text
    )


def steering_figure(steer: xr.Dataset, model: str) -> tuple[Figure, str]:
    """Steering the last layer's W_O towards a token direction u (paper Figs. 3, 10).

    Panels: gamma_u = |cos(x_i, u)| after the last layer, original vs steered, per
    (method, c) with the random-direction null; per-layer gamma and rho of the steered
    models; ||Delta W_O||_F / ||W_O||_F per method; and, when the model is a causal LM
    with finite probabilities, the change of the target token's next-token probability.
    """
    methods = [str(m) for m in steer["method"].values]
    has_p = bool(np.isfinite(steer["p_before"].values).any())
    pal = dict(zip(methods, figstyle.qualitative(len(methods)), strict=True))
    null_all = _nanmean(steer["gamma_u_null"])
    with figstyle.axes_style():
        fig = mpl_figure.Figure(figsize=(11.0, 7.6 if not has_p else 11.0), layout="constrained")
        axes = fig.subplots(3 if has_p else 2, 2)
        _steering_target_panel(axes[0][0], steer, pal, null_all)
        _steering_size_panel(axes[0][1], steer, pal)
        _steered_layers_panels(axes[1][0], axes[1][1], steer, null_all)
        p_text = ""
        if has_p:
            axes[2][1].set_axis_off()
            p_text = _next_token_panel(axes[2][0], steer, pal)
        fig.suptitle(
            f"{model}: steering the last layer towards the token {steering_target_text(steer)}"
        )
    return fig, _steering_caption(steer, model, null_all, p_text)
