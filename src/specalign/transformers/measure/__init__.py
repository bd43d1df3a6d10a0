"""Stage ``measure`` of the transformer study: the kernels, plain functions on arrays.

``spectra`` (eigenpairs of F = W_O W_V per layer; ``hessenberg``: the eigenvalues and
chosen eigenvectors of one matrix from its Hessenberg form), ``directions`` (each layer's
principal directions), ``metrics`` (the alignment metrics psi, rho, gamma), ``linalg``
(the small kernels those share), ``propagate`` (the simplified model and the propagate
rule's states), ``steer`` (steering along an eigenvector) and ``sphere`` (the
supplement's self-attention dynamics on the sphere).

May import: the shared modules, the study's common modules, ``train`` and ``load``.
"""
