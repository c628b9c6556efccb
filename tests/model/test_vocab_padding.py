"""`vocab_multiple_of`: embedding / LM head rows padded to a multiple (GPT-2 50257 -> 50304)."""

from pathlib import Path

import pytest
import torch

from grt_titan.model import GRTModel, grt_flavors
from grt_titan.model.args import CONFIGURABLE_FIELDS
from grt_titan.model.model import build_meta_model

from grt_test_helpers import REPO, build_model, matmul_flops

DEBUG_TOML = REPO / "train_configs" / "grt_debug.toml"
VOCAB = 500  # small true vocabulary: 128 pads it to 512


@pytest.mark.parametrize(
    "vocab,multiple,padded",
    [
        (50257, 1, 50257),
        (50257, 128, 50304),
        (50257, 64, 50304),
        (500, 128, 512),
        (512, 128, 512),
        (50257, 50257, 50257),
        (3, 8, 8),
    ],
)
def test_padded_vocab_size_rounds_up(vocab, multiple, padded):
    args = grt_flavors["debug"].replace(vocab_size=vocab, vocab_multiple_of=multiple)
    assert args.padded_vocab_size == padded
    assert args.vocab_size == vocab  # still the tokenizer's vocabulary


@pytest.mark.parametrize("block_style", ["gpt2", "llama"])
def test_gpt2_vocab_padded_to_50304_rows(block_style):
    args = grt_flavors["debug"].replace(block_style=block_style, vocab_size=50257, vocab_multiple_of=128)
    model = build_meta_model(args)
    assert model.tok_embeddings.weight.shape == (50304, args.dim)
    assert model.output.weight.shape == (50304, args.dim)
    assert (model.output.weight is model.tok_embeddings.weight) == (block_style == "gpt2")
    # Even tensor-parallel shards of the vocabulary: 50304 / 2 = 25152 (50257 would be 25129 + 25128).
    assert args.padded_vocab_size % 2 == 0 and args.vocab_size % 2 == 1
    unpadded = build_meta_model(args.replace(vocab_multiple_of=1))
    n_padded = sum(p.numel() for p in model.parameters())
    n_unpadded = sum(p.numel() for p in unpadded.parameters())
    heads = 1 if block_style == "gpt2" else 2  # the gpt2 head is the (tied) embedding
    assert n_padded - n_unpadded == heads * (50304 - 50257) * args.dim


@pytest.mark.parametrize("block_style", ["gpt2", "llama"])
def test_padded_model_gives_the_unpadded_logits_on_the_true_ids(block_style):
    """A padded model holding an unpadded model's weights in its first vocab_size rows
    computes the same logits for every real token; only the extra columns are new."""
    changes = dict(block_style=block_style, vocab_size=VOCAB, n_kv_heads=2 if block_style == "llama" else None)
    plain = build_model(seed=0, **changes).eval()
    padded = build_model(seed=1, vocab_multiple_of=128, **changes).eval()
    state = padded.state_dict()
    with torch.no_grad():
        for key, value in plain.state_dict().items():
            if key in ("tok_embeddings.weight", "output.weight"):
                assert state[key].shape == (512, value.shape[1])
                state[key][:VOCAB].copy_(value)
            else:
                state[key].copy_(value)
    x = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for r in (0, 2, 4):
            ref = plain(x, num_recurrences=r)
            got = padded(x, num_recurrences=r)
            assert ref.shape[-1] == VOCAB and got.shape[-1] == 512
            # Same weights, same op order; only the head's output width differs.
            torch.testing.assert_close(got[..., :VOCAB], ref, rtol=1e-6, atol=1e-6)
    # The padded rows of the head really are in use (logits of ids >= VOCAB exist, nonzero).
    assert got[..., VOCAB:].abs().min() > 0


def test_flops_count_the_padded_head():
    args = grt_flavors["debug"]
    padded = args.replace(vocab_multiple_of=128)
    S = 1024
    # The debug flavor's 4097 ids (gpt2_4k.tiktoken) padded to 4224 rows.
    assert padded.forward_flops_per_token(S) - args.forward_flops_per_token(S) == 2 * args.dim * (4224 - 4097)
    # ... which is what the head matmul computes (FlopCounterMode, linear layers only).
    model = build_model(padded).eval()
    S, r = 16, 2
    x = torch.randint(0, args.vocab_size, (1, S))
    measured_mm = matmul_flops(model, x, num_recurrences=r)
    blocks = padded.n_prelude_layers + padded.n_core_layers * r + padded.n_coda_layers
    assert measured_mm == S * (padded.forward_flops_per_token(S, r) - blocks * 4 * S * padded.dim)


@pytest.mark.parametrize("value", [0, -1, -128])
def test_bad_vocab_multiple_of_names_the_key(value):
    with pytest.raises(ValueError, match=rf"vocab_multiple_of = {value} is invalid; must be >= 1"):
        grt_flavors["debug"].replace(vocab_multiple_of=value).validate()
    with pytest.raises(ValueError, match="vocab_multiple_of"):
        GRTModel(grt_flavors["debug"].replace(vocab_multiple_of=value))


def test_non_integer_vocab_multiple_of_names_the_key():
    with pytest.raises(ValueError, match=r"vocab_multiple_of = 2\.5 is invalid"):
        grt_flavors["debug"].replace(vocab_multiple_of=2.5).validate()


def _parse(*overrides, path=DEBUG_TOML):
    from grt_titan.job_config import GRTConfigManager

    return GRTConfigManager().parse_args(["--job.config_file", str(path), *overrides])


def _toml_with(tmp_path: Path, line: str) -> Path:
    text = DEBUG_TOML.read_text()
    assert "\n[grt]\n" in text
    path = tmp_path / "padded.toml"
    path.write_text(text.replace("\n[grt]\n", f"\n[grt]\n{line}\n", 1))
    return path


def test_grt_section_sets_vocab_multiple_of(tmp_path):
    assert "vocab_multiple_of" in CONFIGURABLE_FIELDS
    from grt_titan.sections import GRTSection

    assert GRTSection().vocab_multiple_of is None  # unset keeps the flavor's value (1)
    args = grt_flavors["debug"].replace()
    args.update_from_config(_parse())
    assert args.vocab_multiple_of == 1 and args.padded_vocab_size == 4097  # gpt2_4k.tiktoken's ids
    args = grt_flavors["debug"].replace()
    args.update_from_config(_parse(path=_toml_with(tmp_path, "vocab_multiple_of = 128")))
    assert args.padded_vocab_size == 4224 and args.vocab_size == 4097
    args = grt_flavors["debug"].replace()
    args.update_from_config(_parse("--grt.vocab_multiple_of", "64"))
    assert args.padded_vocab_size == 4160


@pytest.mark.parametrize("value", [0, -1])
def test_bad_grt_section_value_names_the_key(tmp_path, value):
    config = _parse(path=_toml_with(tmp_path, f"vocab_multiple_of = {value}"))
    with pytest.raises(ValueError, match=rf"\[grt\] overrides: vocab_multiple_of = {value} is invalid; must be >= 1"):
        grt_flavors["debug"].replace().update_from_config(config)
