"""Ouro's exit in the exported model (docs/ouro.md, "Ouro's exit in the Hugging Face export"): the HF model's
logits equal the torchtitan model's in eval mode at exit_threshold 1 and below 1 (tokens
exiting at different steps), cached generation equals generation without a cache, the exit
gate survives export -> import -> export, and bad exit settings fail by name."""

import json

import pytest
import torch
from test_hf_parts import debug_twin

from grt_titan.checkpoints.load import load_checkpoint, model_from_state
from grt_titan.cli import main as cli
from grt_titan.hf.config_map import model_args_from_hf_config
from grt_titan.hf.convert import SINGLE_FILE, write_hf_folder
from grt_titan.hf.remote.configuration_grt import GRTConfig
from grt_titan.model.methods.ouro import q_exit_steps

from grt_test_helpers import build_model
from hf_helpers import (
    ATOL,
    assert_left_padded_rows_generate_alone,
    cache_class,
    decode_logits,
    greedy,
    perturb,
    prompt,
    static_decode_logits,
)

# Q-exit threshold below 1: with the perturbed gate (lambda ~ 0.5 +- 0.15) tokens exit
# anywhere between step 1 and the last (checked in the test, not assumed).
THRESHOLD = 0.7


@pytest.fixture(scope="module")
def ouro(module_tmp):
    """(torchtitan model at q < 1, exported folder, HF model at q < 1, HF model at q = 1)."""
    from transformers import AutoModelForCausalLM

    args = debug_twin("small_ouro.toml").replace(exit_threshold=THRESHOLD)
    native = perturb(build_model(args))
    folder = module_tmp("ouro") / "hf"
    write_hf_folder(folder, native.state_dict(), args, write_tokenizer=False)
    hf = AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=True).eval()
    # The documented way to change q: a config attribute set at load time.
    hf_last = AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=True, exit_threshold=1.0).eval()
    return native, folder, hf, hf_last


def torchtitan_exit_steps(native, tokens, depth):
    """Each token's 0-based Q-exit step, from the torchtitan model's own readouts."""
    h_pre = native.prelude(native.embed(tokens), native.freqs_cis)
    states = native.recurrence(h_pre, native.freqs_cis, depth, all_states=True).step_states
    hidden = torch.stack([native.final_hidden(h) for h in states])
    return q_exit_steps(native.exit_gate(hidden), native.model_args.exit_threshold)


def test_logits_match_torchtitan_at_both_thresholds(ouro):
    native, folder, hf, hf_last = ouro
    args = native.model_args
    R = args.num_recurrences
    assert json.loads((folder / "config.json").read_text())["exit_threshold"] == THRESHOLD
    assert "model.exit_gate.weight" in dict(hf.named_parameters())
    last = model_from_state(native.state_dict(), args.replace(exit_threshold=1.0)).eval()
    x = prompt(batch=2, seq=24, seed=3)
    with torch.no_grad():
        for r in (None, 2, R):
            out = hf(x, num_recurrences=r, use_cache=False)
            diff = (out.logits - native(x, num_recurrences=r)).abs().max().item()
            assert diff < ATOL, (r, diff)
            expected = torchtitan_exit_steps(native, x, r or R)
            assert torch.equal(out.exit_steps, expected + 1), r
            diff = (hf_last(x, num_recurrences=r).logits - last(x, num_recurrences=r)).abs().max().item()
            assert diff < ATOL, ("q = 1", r, diff)
        out = hf(x, output_step_logits=True, output_hidden_states=True, use_cache=False)
        # The last coda entry of hidden_states is the exit step's, as the logits are.
        assert torch.equal(hf.lm_head(hf.model.norm(out.hidden_states[-1])), out.logits)
    assert len(out.hidden_states) == 1 + args.n_prelude_layers + R + args.n_coda_layers
    steps = out.exit_steps
    # Tokens exit at different steps, some before the last. (Which steps depends on the random
    # weights: on torch 2.11 none of these reaches R, on 2.13 some do; q = 1 above is all at R.)
    assert steps.unique().numel() >= 3 and (steps < R).any(), steps
    # Each token's logits are its exit step's readout, and they differ from the last step's.
    picked = torch.stack(out.step_logits[1:]).gather(0, (steps - 1)[None, ..., None].expand(1, *out.logits.shape))[0]
    assert torch.equal(picked, out.logits)
    assert (out.logits - out.step_logits[-1]).abs().max().item() > 1e-2
    assert hf_last(x).exit_steps is None  # q = 1: the plain forward, no per-step readout


def test_cached_generation_equals_no_cache(ouro):
    native, _, hf, hf_last = ouro
    R = native.model_args.num_recurrences
    ids = prompt(batch=2, seq=16, seed=7)
    with torch.no_grad():
        # Teacher-forced decoding through the cache gives torchtitan's full-sequence logits.
        cached, cache = decode_logits(hf, ids, "per_step", R)
        assert (cached - native(ids)[:, -7:]).abs().max().item() < ATOL
        # One coda K/V per (step, coda block), one core K/V per (step, core block).
        config = hf.config
        assert len(cache.keys) == config.num_prelude_layers + R * (config.num_coda_layers + config.num_core_layers)
        static, _ = static_decode_logits(hf, ids[:, :10], "per_step", prefix=7)
        dynamic, _ = decode_logits(hf, ids[:, :10], "per_step", R, steps=3)
        assert (static - dynamic).abs().max().item() < ATOL
        for model in (hf, hf_last):
            assert torch.equal(greedy(model, ids[:, :6], n=8), greedy(model, ids[:, :6], n=8, use_cache=False))
        # Left padding: each row generates what it would alone.
        assert_left_padded_rows_generate_alone(hf, n=4)


def test_compressed_caches_are_refused_below_threshold_one(ouro):
    _, _, hf, hf_last = ouro
    ids = prompt(seq=6)
    for strategy in ("first", "last", "average"):
        with pytest.raises(
            ValueError,
            match=f"kv_cache_strategy = '{strategy}' cannot be used with objective = "
            "'exit_distribution' and exit_threshold = 0.7 < 1",
        ):
            greedy(hf, ids, n=2, kv_cache_strategy=strategy)
        cache_class(hf_last)(hf_last.config, strategy=strategy)  # q = 1: the plain forward, any cache


def test_export_import_export_keeps_the_exit_gate(ouro, tmp_path):
    native, folder, _, _ = ouro
    args = native.model_args
    assert model_args_from_hf_config(json.loads((folder / "config.json").read_text())) == args
    ckpt = tmp_path / "checkpoint" / "step-0"
    assert cli(["import-hf", "--hf-dir", str(folder), "--out", str(ckpt)]) == 0
    state, _ = load_checkpoint(ckpt, args)
    for key in ("exit_gate.weight", "exit_gate.bias"):
        assert torch.equal(state[key], native.state_dict()[key]), key
    (tmp_path / "again").mkdir()
    again = write_hf_folder(tmp_path / "again" / folder.name, state, args, write_tokenizer=False)
    for name in (SINGLE_FILE, "config.json", "README.md"):
        assert (again / name).read_bytes() == (folder / name).read_bytes(), name


@pytest.mark.parametrize(
    "threshold, message",
    [
        (1.5, r"exit_threshold = 1.5 is invalid; must be in \(0, 1\]"),
        (0.0, r"exit_threshold = 0.0 is invalid; must be in \(0, 1\]"),
        ("0.5", r"exit_threshold = '0.5' is invalid; must be a number in \(0, 1\]"),
    ],
)
def test_bad_exit_threshold_fails_clearly(ouro, threshold, message):
    with pytest.raises(ValueError, match=message):
        GRTConfig(objective="exit_distribution", exit_threshold=threshold)
    _, _, hf, _ = ouro
    hf.config.exit_threshold = threshold  # set after loading: the forward checks it
    try:
        with pytest.raises(ValueError, match=message):
            hf(prompt())
    finally:
        hf.config.exit_threshold = THRESHOLD


def test_exit_settings_need_the_exit_objective():
    with pytest.raises(ValueError, match=r"exit_threshold = 0.5 is used by objective = 'exit_distribution' only"):
        GRTConfig(exit_threshold=0.5)
    with pytest.raises(ValueError, match=r"objective = 'exit_distribution' needs a recurrent model"):
        GRTConfig(objective="exit_distribution", num_core_layers=0, num_recurrences=0)
    with pytest.raises(ValueError, match=r"kv_cache_strategy = 'average' cannot be used"):
        GRTConfig(objective="exit_distribution", exit_threshold=0.9, kv_cache_strategy="average")
    with pytest.raises(ValueError, match=r"objective = 'exit'; allowed: \('final', 'exit_distribution'\)"):
        GRTConfig(objective="exit")
