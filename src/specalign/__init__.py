"""specalign: spectral alignment inside neural networks.

Two studies share this package:

* ``specalign.commutators``: the commutator framework for deep ReLU networks
  (Nyström, arXiv:2608.22910): gate, internal and feature commutators, the exact
  four-source recursion, buffered localisation, batched training.
* ``specalign.transformers``: transformer layers as steps of the power method
  (Li & Altafini, arXiv:2605.25619): F = W_O W_V per layer, eigen-spectra, token
  propagation, steering and self-attention dynamics on the sphere.

Every kernel is a plain function on arrays, usable without Snakemake.
"""

__version__ = "0.1.0"
