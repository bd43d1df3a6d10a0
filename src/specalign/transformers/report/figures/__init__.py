"""Figures of the transformer study (Li & Altafini, arXiv:2605.25619) from its data files.

One module per kind of figure, each reading one kind of file:

* :mod:`.spectra`: per model, from ``spectra.nc``
  (:func:`specalign.transformers.measure.spectra.spectra_dataset`): the eigenvalues of F (paper
  Fig. 1a) and the per-head OV circuits;
* :mod:`.propagation`: per model, from ``propagation.nc``
  (:func:`specalign.transformers.measure.propagate.propagation_dataset`): alignment, tilt and
  rho per layer (Figs. 1b, 2, 8, 11, 12), correlations (Fig. 5), the correlation choice;
* :mod:`.depth`: per model, from ``propagation.nc``: inter-token distance (Fig. 4) and
  the prolonged runs (Fig. 6);
* :mod:`.steering`: per model, from ``steering.nc``
  (:func:`specalign.transformers.measure.steer.steering_dataset`; Figs. 3, 10);
* :mod:`.model`: the per-model bundle (:func:`model_figures`, :data:`MODEL_FIGURES`);
* :mod:`.overview`: across models (Fig. 7, our reading of Fig. 9) and
  :data:`OVERVIEW_FIGURES`;
* :mod:`.sphere`: the supplement's sphere dynamics, from ``sphere.nc``
  (:func:`specalign.transformers.measure.sphere.sphere_dataset`; Figs. 13, 14);
* :mod:`.style`: what they draw alike (null colours, curves with bands, legends).

Every function returns ``(Figure, caption)`` or ``None`` when the data it needs is
absent; saving is left to :func:`specalign.output.save_figure`.

Every figure draws a null level beside the measured curve, because an alignment
|corr| of 0.2 means nothing without the level a direction unrelated to F would give:

* random-direction null (dashed gray, band = token sd): the same metric against random
  unit directions (``*_null`` variables). Under cosine correlation its expectation is
  E|<x, r>| = Gamma(d/2) / (sqrt(pi) Gamma((d+1)/2)) ~ sqrt(2/(pi d)) for any x;
* most-negative-eigenvector null (dotted purple): the same metric against the
  eigenvector of F_t's most negative real eigenvalue (``*_neg_null``), a direction of F
  that the power-method reading says tokens should *not* tilt to;
* cross-model figures overlay the random-weight twin of a model (the random model
  whose ``like:`` names it; ``like`` maps random models to the models they copy) in
  gray, the chance level of every trained-model curve.

Layer indices are 1-based in every figure (layer t = 1..T, state 0 is the input), as in
every file and the paper (specalign.transformers.variables); blocks are 0-based.
"""

from specalign.transformers.report.figures.depth import prolonged_figure, token_distance_figure
from specalign.transformers.report.figures.model import (
    MODEL_FIGURES,
    model_figures,
    unavailable_figure,
)
from specalign.transformers.report.figures.overview import (
    OVERVIEW_FIGURES,
    eigvec_continuity_figure,
    spectrum_overview_figure,
)
from specalign.transformers.report.figures.propagation import (
    alignment_figure,
    corr_choice_figure,
    correlations_figure,
)
from specalign.transformers.report.figures.spectra import eigenvalue_figure, heads_figure
from specalign.transformers.report.figures.sphere import sphere_figure13, sphere_figure14
from specalign.transformers.report.figures.steering import steering_figure, steering_target_text
from specalign.transformers.report.figures.style import MODE_NAMES, mode_name
from specalign.transformers.report.tables import (
    layer_eigenvalues,
    leading_vector_overlaps,
    random_unit_overlap,
)

__all__ = [
    "MODE_NAMES",
    "MODEL_FIGURES",
    "OVERVIEW_FIGURES",
    "alignment_figure",
    "corr_choice_figure",
    "correlations_figure",
    "eigenvalue_figure",
    "eigvec_continuity_figure",
    "heads_figure",
    "layer_eigenvalues",
    "leading_vector_overlaps",
    "mode_name",
    "model_figures",
    "prolonged_figure",
    "random_unit_overlap",
    "sphere_figure13",
    "sphere_figure14",
    "spectrum_overview_figure",
    "steering_figure",
    "steering_target_text",
    "token_distance_figure",
    "unavailable_figure",
]
