import hashlib
import shutil

import pytest

from grt_titan import tokenizer as tok_mod
from grt_titan.tokenizer import (
    GPT2_TIKTOKEN_PATH,
    GPT2_TIKTOKEN_SHA256,
    GPT2Tokenizer,
    build_tokenizer,
)


def test_hello_world(tokenizer):
    assert tokenizer.encode("Hello world") == [15496, 995]
    assert tokenizer.decode([15496, 995]) == "Hello world"


def test_round_trip_mixed_text(tokenizer):
    text = (
        "Mr. Darcy's 10,000 a-year!\n\n\tCafé — naïve 東京 🙂  double  spaces\u3000"
        "and a literal <|endoftext|> token string\r\n"
    )
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert tokenizer.eos_id not in ids  # literal special-token text is ordinary text
    assert tokenizer.encode_batch([text, "Hello world"], num_threads=2) == [ids, [15496, 995]]


def test_ids_and_sizes(tokenizer):
    assert tokenizer.eos_id == 50256
    assert tokenizer.bos_id is None
    assert tokenizer.get_vocab_size() == 50257
    assert tokenizer.name == "gpt2"
    assert tokenizer.encode("Hello world", add_bos=True, add_eos=True) == [15496, 995, 50256]
    assert tokenizer.decode([50256]) == "<|endoftext|>"


def test_shipped_file_sha256(tokenizer):
    digest = hashlib.sha256(GPT2_TIKTOKEN_PATH.read_bytes()).hexdigest()
    assert digest == GPT2_TIKTOKEN_SHA256 == tokenizer.sha256
    assert (GPT2_TIKTOKEN_PATH.parent / "LICENSE-whisper").is_file()


def _corrupt_copy(tmp_path, name="gpt2.tiktoken"):
    bad = tmp_path / name
    lines = GPT2_TIKTOKEN_PATH.read_bytes().splitlines(keepends=True)
    lines[100], lines[101] = lines[101], lines[100]  # still parses, other ranks
    bad.write_bytes(b"".join(lines))
    return bad


def test_wrong_sha_gives_clear_error(tmp_path, monkeypatch):
    bad = _corrupt_copy(tmp_path)
    with pytest.raises(ValueError, match=r"gpt2\.tiktoken: sha256 .* does not match"):
        GPT2Tokenizer(bad, expected_sha256=GPT2_TIKTOKEN_SHA256)
    # A damaged shipped file is caught on load, naming the file.
    monkeypatch.setattr(tok_mod, "GPT2_TIKTOKEN_PATH", bad)
    with pytest.raises(ValueError, match=str(bad)):
        tok_mod.GPT2Tokenizer()


def test_build_tokenizer_from_hf_assets_path(tmp_path):
    from torchtitan.config import JobConfig

    jc = JobConfig()  # default hf_assets_path (./tests/assets/tokenizer) has no .tiktoken
    assert build_tokenizer(jc).path == GPT2_TIKTOKEN_PATH

    custom = tmp_path / "assets"
    custom.mkdir()
    shutil.copy(GPT2_TIKTOKEN_PATH, custom / "mine.tiktoken")
    jc.model.hf_assets_path = str(custom)  # a folder holding one .tiktoken file
    t = build_tokenizer(jc)
    assert t.path == custom / "mine.tiktoken" and t.name == "gpt2"  # same ranks -> gpt2

    other = _corrupt_copy(tmp_path, "other.tiktoken")
    jc.model.hf_assets_path = str(other)  # a file; other ranks -> named after the file
    t = build_tokenizer(jc)
    assert (t.path, t.name) == (other, "other")
    assert t.sha256 != GPT2_TIKTOKEN_SHA256 and t.get_vocab_size() == 50257

    jc.model.hf_assets_path = str(tmp_path / "missing.tiktoken")
    with pytest.raises(FileNotFoundError, match="missing.tiktoken"):
        build_tokenizer(jc)


def test_one_encoding_per_rank_file_content_and_a_bad_file_refused_every_time(tmp_path):
    """A process builds a rank file's encoding once (the start-up check and the trainer both
    build the tokenizer); another content or name gets its own, and a bad file is never kept."""
    first, second = GPT2Tokenizer(), GPT2Tokenizer()
    assert first.encoding is second.encoding and first.eos_id == second.eos_id == 50256
    copy = tmp_path / "mine.tiktoken"
    shutil.copy(GPT2_TIKTOKEN_PATH, copy)
    assert GPT2Tokenizer(copy).encoding is first.encoding  # same ranks, same name (gpt2)

    lines = GPT2_TIKTOKEN_PATH.read_bytes().splitlines()
    (a, rank_a), (b, rank_b) = lines[100].split(), lines[101].split()
    lines[100:102] = [a + b" " + rank_b, b + b" " + rank_a]  # two tokens trade ranks
    swapped_file = tmp_path / "swapped.tiktoken"
    swapped_file.write_bytes(b"\n".join(lines) + b"\n")
    swapped = GPT2Tokenizer(swapped_file)
    assert swapped.encoding is not first.encoding and swapped.name == "swapped"
    byte = first.encoding.decode_single_token_bytes(100)
    assert swapped.encoding.encode_single_token(byte) == 101  # its own ranks, not the cached ones

    broken = tmp_path / "broken.tiktoken"
    broken.write_bytes(GPT2_TIKTOKEN_PATH.read_bytes() + b"not-a-rank-line\n")
    for _ in range(2):
        with pytest.raises(ValueError, match=r"broken\.tiktoken:50257: not a tiktoken rank line"):
            GPT2Tokenizer(broken)
