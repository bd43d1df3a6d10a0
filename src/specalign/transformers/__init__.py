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

Modules (import them directly; this package imports nothing on purpose). Kernels:
``families`` (one adapter per model family, its traps named), ``weights`` (the in-memory
form), ``extract`` (checkpoint -> weights, streamed), ``sources`` (hub, local, package
and random models), ``spectra``, ``directions`` (each layer's principal directions),
``propagate`` (the simplified model and the propagate rule's states), ``metrics`` (the
alignment metrics), ``linalg`` (the small kernels those two share), ``steer``, ``sphere``
(the supplement's dynamics on the sphere). Hugging Face access: ``hf`` (tokenizers,
prompts, the model loaded or streamed and its hidden states), on ``streaming`` (the
model run from its checkpoint one unit at a time).

The same roles as in :mod:`specalign.commutators`: ``contracts`` (``weights.h5`` and the
manifests, read and written; the modes of ``propagation.nc``), ``paper`` (the paper's
claims, as data), ``tables``, ``reproduction`` (the transformer half of
``results/reproduction.md``) and ``figures``.
"""
