"""Stage ``report`` of the commutator study: the paper's Section 10 beside ours.

``paper`` (the published numbers, as data), ``runs`` (run selection and seed
statistics), ``claims`` (the rules by which a number differs from the paper's),
``tables`` (Tables 1-6 and the text numbers), ``figures`` (Figures 1-5) and
``reproduction`` (the commutator half of ``results/reproduction.md``).

May import: the shared modules, the study's common modules and every earlier stage.
"""
