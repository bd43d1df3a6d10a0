"""The commutator study: spectral alignment in deep ReLU networks (Nyström,
arXiv:2608.22910).

The package follows the data's way through the DAG (``prepare_data`` ->
``train_ensemble`` -> ``diagnostics`` -> tables, figures, report), a stage a
subpackage or module, in :data:`STAGES` order; a stage may import the modules above
and the stages before it, never a later one (``tests/test_layout.py`` holds this):

* the study's common ground, here: ``contracts`` (``trajectories.h5`` and
  ``diagnostics.nc``, read and written, by every stage after ``data``);
* ``data``: the synthetic target and the UCI benchmarks (Secs. 10.1, 10.5);
* ``train``: batched full-batch gradient descent of a whole ensemble (Sec. 10.1);
* ``measure``: the kernels, plain functions on arrays: the network's forward and
  backward pass, the commutators and defects, the four-source recursion, spectral
  localisation, every diagnostic of a batch of networks, the solvable models of Sec. 9;
* ``report``: the published numbers, run selection, the claim rules, paper Tables 1-6
  and Figures 1-5 and the commutator half of ``results/reproduction.md``.

``settings`` (this study's part of the configuration's validation) stands above the
stages, as in :mod:`specalign.transformers`. Import modules directly (``from
specalign.commutators.measure import diagnostics``): no package here imports its
modules, since every rule's fingerprint includes the packages on its way.
"""

#: The stages, in the order of the data's way: a stage imports none after it.
STAGES = ("data", "train", "measure", "report")
