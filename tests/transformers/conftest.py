"""Fixtures of the transformer tests: the tiny random models of hand_weights.py."""

import pytest
from hand_weights import tiny_bert_model, tiny_gpt2_model


@pytest.fixture(scope="module")
def tiny_bert():
    return tiny_bert_model()


@pytest.fixture(scope="module")
def tiny_gpt2():
    return tiny_gpt2_model()


@pytest.fixture(scope="module")
def gpt2_dir(tiny_gpt2, tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt2")
    tiny_gpt2.float().save_pretrained(path)
    tiny_gpt2.double()
    return path
