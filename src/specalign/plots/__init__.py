"""Figures of the two studies, one module per study.

Each figure function takes the loaded results, returns ``(matplotlib Figure, caption)``
(or ``None`` when the run lacks the experiments the figure needs), and leaves saving
to :func:`specalign.plots.commutators.save_figure`, which writes atomically. Figures
are built on ``matplotlib.figure.Figure`` directly, not through ``pyplot``, so that a
script producing many figures holds no global figure state and leaks no memory.

* :mod:`specalign.plots.commutators`: paper Figures 1-5 of Nyström,
  arXiv:2608.22910 (commutator diagnostics of bias-free ReLU networks).
"""
