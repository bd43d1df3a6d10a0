"""specalign: spectral alignment inside neural networks.

Two studies share this package:

* ``specalign.commutators``: the commutator framework for deep ReLU networks
  (Nyström, arXiv:2608.22910): gate, internal and feature commutators, the exact
  four-source recursion, buffered localisation, batched training.
* ``specalign.transformers``: transformer layers as steps of the power method
  (Li & Altafini, arXiv:2605.25619): F = W_O W_V per layer, eigen-spectra, token
  propagation, steering and self-attention dynamics on the sphere.

Every kernel is a plain function on arrays, usable without Snakemake. The front door is
the ``specalign`` console script (:mod:`specalign.cli`) and, from Python,
:func:`analyze` (run the transformer study on a model, get its per-layer table) and
:func:`load` (one model's finished results as one ``xarray.Dataset``).
"""

import importlib
from typing import Any

__version__ = "0.1.0"
__all__ = ["analyze", "load"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        # Loaded on first use, by name rather than by an import statement: the rule
        # scripts never use the front door, so its modules (the CLI, Snakemake's API)
        # stay out of their code fingerprints (specalign.fingerprint) and an edit of the
        # CLI reruns no job.
        return getattr(importlib.import_module("specalign.api"), name)
    raise AttributeError(f"module 'specalign' has no attribute {name!r}")
