"""The exported tokenizer files tokenize exactly like the training tokenizer (tiktoken)."""

import pytest

from grt_titan.tokenizer import GPT2Tokenizer

MIXED = [
    "Hello world",
    "Mr. Darcy's 10,000 a-year!\n\n\tCafé — naïve 東京 🙂  double  spaces\u3000end",
    "   leading spaces, trailing spaces   \r\n\r\n",
    "Numbers 3.14159, 1e-5, 2026-11-29, 0x7fff; code: def f(x): return x**2  # ok",
    "I'm, you're, they've, he'll, she'd, it's, 'quoted' \"double\" «guillemets»",
    "ÀÉÎÕÜ ßø łę čš ğı ﬁ ligature, Ελληνικά, русский, עברית, العربية, हिन्दी",
    "emoji 👩‍👩‍👧‍👦🏳️‍🌈 and combining e\u0301 a\u0308",
    "a literal <|endoftext|> inside text, and <|endoftext|>",
    "-" * 70 + "\n" + "=" * 33 + " " * 17 + "x" * 301,
]


@pytest.fixture(scope="module")
def tokenizers(debug_export):
    from transformers import AutoTokenizer

    return GPT2Tokenizer(), AutoTokenizer.from_pretrained(str(debug_export))


def test_ids_equal_on_mixed_text(tokenizers):
    train, hf = tokenizers
    for text in MIXED:
        assert hf(text)["input_ids"] == train.encode(text), text
        assert hf.encode(text) == train.encode(text)
    joined = "\n".join(MIXED)
    assert hf(joined)["input_ids"] == train.encode(joined)
    assert hf(MIXED)["input_ids"] == train.encode_batch(MIXED, num_threads=1)


def test_decode_and_special_tokens(tokenizers):
    train, hf = tokenizers
    assert hf.eos_token == "<|endoftext|>" and hf.eos_token_id == train.eos_id == 50256
    assert hf.bos_token_id == 50256 and len(hf) == train.get_vocab_size() == 50257
    for text in MIXED:
        assert hf.decode(train.encode(text)) == text
    # A literal "<|endoftext|>" in text is text (as in training), never the EOS id.
    assert train.eos_id not in hf("x <|endoftext|> y")["input_ids"]
    assert hf.decode([15496, 50256]) == "Hello<|endoftext|>"
