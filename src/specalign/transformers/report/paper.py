"""What Li & Altafini (arXiv:2605.25619) publish, as plain data: claims, not numbers.

The paper states few numbers; its results are claims read off figures. Each
:class:`Claim` below holds what the paper says (with the section and figures it comes
from) in the words our reproduction report quotes, so that the report and the figure
captions never paraphrase the paper twice. Nothing here is computed; our readings of
the paper (thresholds, directions when lambda_1 is complex) live beside the code that
applies them, in :mod:`specalign.transformers.report.claims`.
"""

from __future__ import annotations

from typing import NamedTuple


class Claim(NamedTuple):
    """One claim of the paper: its heading in the report and what the paper says."""

    heading: str
    statement: str


#: The paper's claims, keyed by their number in the reproduction report.
CLAIMS: dict[int, Claim] = {
    1: Claim(
        "Passing through a layer tilts tokens towards v1_t",
        "Paper (Sections 2-3, Figs. 1b, 2, 8, 11, 12): after layer t the tokens are more "
        "aligned with the principal eigenvector v1_t of F_t = W_O W_V, psi_t > 0 and rho_t > "
        "0.5, most clearly in the simplified model.",
    ),
    2: Claim(
        "Shared weights: gamma -> 1 with depth at the power-method rate",
        "Paper (Fig. 1b, Fig. 6, the shared-weight analysis): for ALBERT, where all layers "
        "share F, the alignment converges to 1 when the model is prolonged. Prediction: the "
        "angle to v1 shrinks per layer by |mu_2/mu_1| (mu = 1 + eta lambda of I + eta F), and "
        "with n tokens under full attention by max(|mu_2|, 1)/|mu_1|. For a model without "
        "shared weights only the layers past the original depth repeat one layer; the rate "
        "is measured there.",
    ),
    3: Claim(
        "Spectral gaps are small in most layers",
        "Paper (Fig. 7 caption): 'in the vast majority of cases the spectral gap lambda_1,t - "
        "Re(lambda_2,t) (or Re(lambda_1,t) - Re(lambda_3,t) if lambda_1,t is complex) is "
        "small'.",
    ),
    4: Claim(
        "Steering: changing W_O of the last layer makes u an eigenvector and turns the "
        "output towards u",
        "Paper (Section 3.3, Figs. 3, 10): modifying the last layer's output matrix so that "
        "the desired direction u is the principal eigenvector of F_T steers the output "
        "tokens towards u.",
    ),
    5: Claim(
        "Dynamics on the sphere (supplement)",
        "Paper (supplement, Figs. 13, 14): consensus points x_i = v_k are equilibria; "
        "with a small enough step only v1 is locally stable; bipartite consensus along "
        "v1 returns after a small perturbation and escapes after a large one; the "
        "supplement gives the Jacobian eigenvalues at consensus in closed form.",
    ),
    6: Claim(
        "Cosine vs Pearson correlation",
        "The paper writes corr(x, v) without saying whether it centres the vectors.",
    ),
}

#: The checkpoints the paper studies (Section 4), for the report's comparison line.
PAPER_MODELS = "ALBERT (base to xxlarge), BERT, GPT-2 and GPT-Neo checkpoints"

#: The families (config.json ``model_type``) of those checkpoints: a model of another
#: family is measured the same way, but its verdicts extend the paper, not reproduce it.
PAPER_FAMILIES = ("albert", "bert", "gpt2", "gpt_neo")

#: Supplement Fig. 14: the smallest perturbation of a bipartite consensus returns, the
#: largest escapes to consensus at one of +-v1.
FIG14_OUTCOMES = ("returns", "consensus")

#: The paper figure each propagation mode reproduces, for a shared-weight model (ALBERT)
#: and for the others; None where the paper has no counterpart.
MODE_FIGURES: dict[str, tuple[str | None, str | None]] = {
    "simplified_real": ("paper Fig. 1b (ALBERT)", "paper Figs. 2 and 8"),
    "real_model": ("paper Fig. 11 (ALBERT)", "paper Fig. 12 (BERT, GPT-2, GPT-Neo)"),
    "prolonged_real": ("paper Fig. 6 (prolonged transformers)",) * 2,
    "prolonged_full": ("paper Fig. 6 (prolonged transformers)",) * 2,
    "simplified_full": (None, None),
}
