"""Stage ``measure`` of the commutator study: the kernels, plain functions on arrays.

``network`` (the batched forward and backward sensitivity pass, Secs. 3.1-3.3),
``defects`` (gate, internal and feature commutators and the global defects G_D, G_Q,
G_S, Secs. 3.3, 4, 10.1), ``recursion`` (the exact four-source recursion and its
source geometry, Sec. 4), ``localize`` (buffered spectral localisation and the
reliability test, Secs. 5.1, 10.1), ``diagnostics`` (every diagnostic of a batch of
networks, and ``diagnostics.nc``) and ``analytic`` (the solvable two-neuron models of
Sec. 9, with Monte Carlo estimators on the same kernels).

May import: the shared modules, the study's common modules, ``data`` and ``train``.
"""
