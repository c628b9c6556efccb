"""Fixtures of the data tests (helpers live in data_helpers.py)."""

import pytest

from grt_titan.tokenizer import GPT2Tokenizer


@pytest.fixture(scope="session")
def tokenizer() -> GPT2Tokenizer:
    return GPT2Tokenizer()
