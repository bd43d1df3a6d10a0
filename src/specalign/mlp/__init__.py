"""Commutator diagnostics for bias-free, fully connected, scalar-output ReLU networks.

Modules (import them directly; this package imports nothing heavy on purpose):

* ``network``: batched forward and backward sensitivity pass (paper Sec. 3.1-3.3).
* ``commutators``: gate, internal and feature commutators and their normalised
  global defects (Secs. 3.3, 4, 10.1).
* ``sources``: the four-source recursion of the internal commutator and its
  source geometry (Sec. 4).
* ``localize``: buffered spectral localisation and the spectral reliability test
  (Secs. 5.1, 10.1).
* ``analytic``: the exactly solvable two-neuron models of Sec. 9 with Monte Carlo
  estimators built on the production kernels.
* ``diagnostics``: :func:`~specalign.mlp.diagnostics.evaluate`, the single entry
  point used by the workflow.
"""
