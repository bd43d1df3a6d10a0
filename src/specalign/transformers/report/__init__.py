"""Stage ``report`` of the transformer study: what a reader sees.

``tables``, ``figures`` (one module per figure family), ``paper`` (the paper's claims,
as data), ``claims`` (each claim's summary and verdict under fixed rules), ``series``
(the claims along a series' checkpoints: ``training.nc``), ``reproduction`` (the
transformer half of ``results/reproduction.md``) and ``summary`` (the lines
``specalign analyze`` prints).

May import: the shared modules, the study's common modules and every earlier stage.
"""
