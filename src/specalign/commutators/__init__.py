"""The commutator study: spectral alignment in deep ReLU networks (Nyström,
arXiv:2608.22910).

Modules (import them directly; this package imports nothing on purpose, since every
rule's fingerprint includes it). Kernels, plain functions on arrays:

* ``network``: batched forward and backward sensitivity pass (paper Sec. 3.1-3.3).
* ``defects``: gate, internal and feature commutators and their normalised global
  defects G_D, G_Q, G_S (Secs. 3.3, 4, 10.1).
* ``recursion``: the exact four-source recursion of the internal commutator and its
  source geometry (Sec. 4).
* ``localize``: buffered spectral localisation and the spectral reliability test
  (Secs. 5.1, 10.1).
* ``diagnostics``: :func:`~specalign.commutators.diagnostics.evaluate` (every diagnostic
  of a batch of networks) and the ``diagnostics.nc`` builder.
* ``analytic``: the exactly solvable two-neuron models of Sec. 9 with Monte Carlo
  estimators built on the production kernels.
* ``train``: batched full-batch gradient descent of a whole ensemble (Sec. 10.1).
* ``data``: the synthetic target and the UCI benchmarks (Sec. 10.1, 10.5).

The same roles as in :mod:`specalign.transformers`:

* ``contracts``: ``trajectories.h5`` and ``diagnostics.nc``, read and written;
* ``paper``: the published numbers of Section 10, as data;
* ``tables``: paper Tables 1-6 and the text numbers, ours beside the paper's;
* ``reproduction``: the commutator half of ``results/reproduction.md``;
* ``figures``: paper Figures 1-5.
"""
