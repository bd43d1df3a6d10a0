"""The transformer study: transformer layers as steps of the power method (Li &
Altafini, arXiv:2605.25619).

Weight convention used everywhere in this subpackage (one convention, all families):
column vectors, y = W x + b, every W stored as (out, in) in float64. For a model with
``n_heads`` heads of size ``d_head`` and model width ``d_model``:

* ``W_Q, W_K, W_V``: (n_heads * d_head, d_model); head h uses rows h*d_head:(h+1)*d_head.
* ``W_O``: (d_model, n_heads * d_head); head h uses the same columns.
* ``F = W_O W_V`` = sum_h W_O^h W_V^h: (d_model, d_model), the matrix whose principal
  eigenvector tokens tilt towards.
* With grouped-query attention (``n_kv_heads`` < ``n_heads``) query head h reads
  key/value head h // (n_heads / n_kv_heads); in memory W_K and W_V are kept expanded to
  n_heads heads, so the two lines above hold as written (``weights.h5`` stores them once
  per key/value head). ``d_head`` may differ from d_model / n_heads (a family's
  ``head_dim``). F = W_O' W_V' has rank <= r = n_kv_heads * d_head
  (``ModelWeights.ov_factors``); when r < d the model is *factored* and no d x d F is
  formed: spectra, propagation and steering use the factors.

The package follows the data's way through the DAG, a stage a subpackage, in
:data:`STAGES` order; a stage may import the modules above and the stages before it,
never a later one (``tests/test_layout.py`` holds this):

* the study's common ground, here: ``weights`` (the in-memory form of the convention
  above), ``variables`` (every output variable's name, dims and description),
  ``metric_table`` (each metric of propagation.nc declared once: kernel, dims,
  description, table columns, figure row) and ``lineage`` (what each result file was
  made from);
* ``train``: models trained here, whose checkpoints the series analyse (optional: a
  hub model starts at ``load``);
* ``load``: checkpoints in, ``weights.h5`` and manifests out; families, sources,
  streaming, the random twins, resources and limits;
* ``measure``: the kernels: spectra, directions, metrics, propagation, steering and
  the dynamics on the sphere;
* ``report``: tables, figures, the claims and their verdicts, series over training,
  the reproduction text and the summaries ``specalign analyze`` prints.

Import modules directly (``from specalign.transformers.measure import spectra``): no
package here imports its modules, since every rule's fingerprint includes the
packages on its way.
"""

#: The stages, in the order of the data's way: a stage imports none after it.
STAGES = ("train", "load", "measure", "report")
