"""Stage ``load`` of the transformer study: checkpoints in, ``weights.h5`` out.

``sources`` (hub, local, package and random models), ``families`` (one adapter per
model family), ``checkpoint`` (safetensors headers, the content digest of a model
folder), ``extract`` (checkpoint -> ``weights.h5``, streamed), ``streaming`` (the model
run from its checkpoint a unit at a time), ``twin`` (random-weight twins), ``hf``
(tokenizers, prompts, hidden states), ``contracts`` (``weights.h5`` and the manifests),
``resources`` and ``limits`` (what a job will need, checked before it starts).

May import: the shared modules, the study's common modules and ``train``.
"""
