"""Fixtures of the data tests (helpers live in data_helpers.py)."""

import pytest

from grt_titan.tokenizer import GPT2Tokenizer

from data_helpers import STYLES, make_hf_tokenizer


@pytest.fixture(scope="session")
def tokenizer() -> GPT2Tokenizer:
    return GPT2Tokenizer()


@pytest.fixture(scope="session")
def hf_dirs(tmp_path_factory) -> dict:
    """Tiny Hugging Face tokenizer folders by style (data_helpers.STYLES)."""
    root = tmp_path_factory.mktemp("hf_tokenizers")
    return {style: make_hf_tokenizer(root / style, style) for style in STYLES}


@pytest.fixture(scope="session")
def hf_big_dir(tmp_path_factory):
    """The llama3 style with 70,002 ids (BOS 70000, EOS 70001: beyond uint16, as Llama 3's
    128,256 and Qwen3's 151,669)."""
    return make_hf_tokenizer(tmp_path_factory.mktemp("hf_big") / "big", "llama3", vocab_size=70_000)
