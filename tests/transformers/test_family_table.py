"""The family table of docs/transformers.md is the registry's (every registered family,
in its words, and no other), and every family fact the size estimate reads is an
attribute of its adapter."""

from pathlib import Path

from specalign.transformers.load.families import FAMILIES, family_table
from specalign.transformers.load.families.base import replace_family_table


def test_the_docs_table_is_the_registry_s(repo: Path) -> None:
    text = (repo / "docs" / "transformers.md").read_text()
    assert replace_family_table(text, family_table()) == text, (
        "docs/transformers.md's family table differs from the adapters': "
        "run python -m specalign.transformers.load.families"
    )
    rows = family_table().splitlines()[2:]
    assert len(rows) == len(FAMILIES) == 18
    for model_type, row in zip(FAMILIES, rows, strict=True):
        assert f"(`{model_type}`)" in row


def test_every_adapter_has_its_row_and_its_facts() -> None:
    for model_type, cls in FAMILIES.items():
        for attr in ("doc_title", "doc_layout", "doc_notes"):
            assert isinstance(cls.__dict__.get(attr), str) and cls.__dict__[attr], (
                f"{cls.__name__} ({model_type}) must set its own {attr}"
            )
        assert isinstance(cls.gated_ffn, bool) and isinstance(cls.fused_gate_up, bool)
        assert isinstance(cls.ffn_key, str)
    gated = {m for m, c in FAMILIES.items() if c.gated_ffn}
    assert gated == {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text",
                     "phi3"}  # fmt: skip
    assert {m for m, c in FAMILIES.items() if c.fused_gate_up} == {"phi3"}


def test_replacing_the_table_keeps_the_rest() -> None:
    text = "intro\n\n| family (model_type) | a |\n| --- | --- |\n| old | row |\n\nafter\n"
    out = replace_family_table(text, "| family (model_type) | x |\n| --- | --- |\n")
    assert out == "intro\n\n| family (model_type) | x |\n| --- | --- |\n\nafter\n"
