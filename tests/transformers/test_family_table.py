"""The family table of docs/transformers.md is the registry's (every registered family,
in its words, and no other), and every family fact the size estimate reads is an
attribute of its adapter."""

from pathlib import Path

from specalign.doctables import replace_table
from specalign.transformers.load.families import FAMILIES, family_table
from specalign.transformers.load.families.llama import LlamaAdapter


def test_the_docs_table_is_the_registry_s(repo: Path) -> None:
    text = (repo / "docs" / "transformers.md").read_text()
    assert replace_table(text, family_table()) == text, (
        "docs/transformers.md's family table differs from the adapters': "
        "run python -m specalign.transformers.load.families"
    )
    rows = family_table().splitlines()[2:]
    assert len(rows) == len(FAMILIES)
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
    # the gated feed-forward is the Llama lineage's, and only Phi-3 fuses gate and up
    gated = {m for m, c in FAMILIES.items() if c.gated_ffn}
    assert gated == {m for m, c in FAMILIES.items() if issubclass(c, LlamaAdapter)}
    assert {"llama", "mistral", "qwen2", "gemma", "phi3"} <= gated
    assert not gated & {"bert", "albert", "gpt2", "gpt_neox", "falcon", "opt"}
    assert {m for m, c in FAMILIES.items() if c.fused_gate_up} == {"phi3"}


def test_replacing_the_table_keeps_the_rest() -> None:
    text = "intro\n\n| family (model_type) | a |\n| --- | --- |\n| old | row |\n\nafter\n"
    out = replace_table(text, "| family (model_type) | x |\n| --- | --- |\n")
    assert out == "intro\n\n| family (model_type) | x |\n| --- | --- |\n\nafter\n"
