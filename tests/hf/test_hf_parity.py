"""The exported transformers model computes the torchtitan model's logits."""

import json
import shutil

import pytest
import torch

from grt_titan.hf.convert import write_hf_folder
from grt_titan.model import grt_flavors
from grt_titan.model.methods.table import RRT

from grt_test_helpers import MOR_PARTS, build_model
from hf_helpers import ATOL, SMALL_VOCAB, load_hf, seeded_model


def tokens(batch=2, seq=24, seed=3):
    return torch.randint(0, SMALL_VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("style", ["gpt2", "llama"])
@pytest.mark.parametrize("depth", ["0", "1", "R", "R+2"])
def test_logits_match_torchtitan(style, depth, native_models, hf_models):
    native, hf = native_models[style], hf_models[style]
    R = native.model_args.num_recurrences
    r = {"0": 0, "1": 1, "R": R, "R+2": R + 2}[depth]
    x = tokens()
    with torch.no_grad():
        ref = native(x, num_recurrences=r)
        got = hf(x, num_recurrences=r).logits
    assert got.shape == ref.shape
    assert (got - ref).abs().max().item() < ATOL


@pytest.mark.parametrize("style", ["gpt2", "llama"])
def test_default_depth_is_the_eval_depth(style, native_models, hf_models):
    native, hf = native_models[style], hf_models[style]
    assert hf.config.num_recurrences == native.model_args.num_recurrences
    x = tokens(seed=4)
    with torch.no_grad():
        assert (hf(x).logits - native(x)).abs().max().item() < ATOL


def test_eval_recurrences_becomes_the_default_depth(tmp_path):
    args = grt_flavors["debug"].replace(vocab_size=SMALL_VOCAB, eval_recurrences=2)
    native = seeded_model(args)
    out = write_hf_folder(tmp_path / "m", native.state_dict(), args, write_tokenizer=False)
    config = json.loads((out / "config.json").read_text())
    assert config["eval_recurrences"] == 2 and config["num_recurrences"] == 4
    hf = load_hf(out)
    x = tokens()
    with torch.no_grad():
        assert (hf(x).logits - native(x)).abs().max().item() < ATOL


def old_form(config: dict) -> dict:
    """config.json as grt-titan exports wrote it before R had one name: `num_recurrences` the
    default depth (the run's eval depth, 0 without core layers), `train_recurrences` R (None
    without core layers), no `eval_recurrences`."""
    old = {k: v for k, v in config.items() if k != "eval_recurrences"}
    recurrent = config["num_core_layers"] > 0
    depth = config["num_recurrences"] if config["eval_recurrences"] is None else config["eval_recurrences"]
    old["num_recurrences"] = depth if recurrent else 0
    old["train_recurrences"] = config["num_recurrences"] if recurrent else None
    return old


OLD_FORM_CASES = {  # (flavor, overrides)
    "grt": ("debug", {}),  # depth R
    "eval_depth": ("debug", dict(eval_recurrences=2)),  # depth 2, R = 4
    "rrt": ("debug", dict(**RRT.parts, lora_rank=4, eval_recurrences=3)),  # an adapter set per step up to R
    "mor": ("debug", dict(**MOR_PARTS, eval_recurrences=3)),  # a router per step up to R
    "dense": ("dense_debug", {}),
}


@pytest.mark.parametrize("case", list(OLD_FORM_CASES))
def test_an_old_form_config_json_loads_and_computes_the_same(case, tmp_path):
    """An export made before `eval_recurrences` (config.json: `num_recurrences` = the default
    depth, `train_recurrences` = R) loads with R = num_recurrences and its default depth as
    eval_recurrences, the same weights (per-step adapters and routers: R of them) and the
    same logits at every depth; saved again, its config has the new keys."""
    flavor, overrides = OLD_FORM_CASES[case]
    args = grt_flavors[flavor].replace(vocab_size=SMALL_VOCAB, **overrides)
    native = seeded_model(args) if args.router == "none" else build_model(args).eval()  # MoR: no gate to perturb
    new = write_hf_folder(tmp_path / "new", native.state_dict(), args, write_tokenizer=False)
    old = tmp_path / "old"
    shutil.copytree(new, old)
    config = json.loads((new / "config.json").read_text())
    (old / "config.json").write_text(json.dumps(old_form(config), indent=2))
    hf_new, hf_old = load_hf(new), load_hf(old)
    R, depth = (args.num_recurrences, args.eval_depth) if args.is_recurrent else (0, 0)
    for hf in (hf_new, hf_old):
        assert (hf.config.num_recurrences, hf.config.eval_depth) == (R, depth)
        assert not hasattr(hf.config, "train_recurrences")
    x = tokens(batch=1, seq=12)
    with torch.no_grad():
        for r in (None,) if not R else (None, 1, R):
            assert torch.equal(hf_old(x, num_recurrences=r).logits, hf_new(x, num_recurrences=r).logits), r
        if args.router == "none":  # MoR's export routes by threshold, the native model by its own rule
            assert (hf_old(x).logits - native(x)).abs().max().item() < ATOL
    hf_old.config.save_pretrained(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert "train_recurrences" not in saved
    assert (saved["num_recurrences"], saved["eval_recurrences"]) == (
        config["num_recurrences"],
        hf_old.config.eval_recurrences,
    )


def test_old_and_new_depth_keys_do_not_mix():
    from grt_titan.hf.remote.configuration_grt import GRTConfig

    legacy = GRTConfig(num_recurrences=3, train_recurrences=6)  # old form: depth 3, R = 6
    assert (legacy.num_recurrences, legacy.eval_recurrences) == (6, 3)
    with pytest.raises(ValueError, match="train_recurrences .* and eval_recurrences = 2 cannot be combined"):
        GRTConfig(num_recurrences=3, train_recurrences=6, eval_recurrences=2)


def test_dense_twin(tmp_path):
    args = grt_flavors["dense_debug"].replace(vocab_size=SMALL_VOCAB, n_prelude_layers=3)
    native = seeded_model(args)
    out = write_hf_folder(tmp_path / "dense", native.state_dict(), args, write_tokenizer=False)
    hf = load_hf(out)
    assert hf.config.num_recurrences == 0 and not hasattr(hf.model, "core")
    x = tokens()
    with torch.no_grad():
        assert (hf(x).logits - native(x)).abs().max().item() < ATOL
    with pytest.raises(ValueError, match="without core layers"):
        hf(x, num_recurrences=2)


@pytest.mark.parametrize("style", ["gpt2", "llama"])
def test_bf16_load(style, exported, native_models):
    hf = load_hf(exported[style], dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in hf.parameters())
    x = tokens()
    with torch.no_grad():
        got = hf(x).logits.float()
        ref = native_models[style](x)
    assert torch.isfinite(got).all()
    # bf16 keeps ~3 significant digits; through ~10 blocks the logits drift by a few 1e-2.
    assert (got - ref).abs().max().item() < 0.25
    # ... and the argmax mostly agrees.
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean().item() > 0.9
    # generate() in bf16, with the cache (greedy) and sampling.
    greedy = hf.generate(x[:1, :6], max_new_tokens=5, do_sample=False)
    sampled = hf.generate(x[:1, :6], max_new_tokens=5, do_sample=True, top_k=20)
    assert greedy.shape == sampled.shape == (1, 11)


def test_gate_override_model(tmp_path):
    args = grt_flavors["debug"].replace(vocab_size=SMALL_VOCAB, gate_override=1.0)
    native = seeded_model(args)
    hf = load_hf(write_hf_folder(tmp_path / "g1", native.state_dict(), args, write_tokenizer=False))
    x = tokens()
    with torch.no_grad():
        # g = 1 copies the state: every depth gives the prelude-only logits.
        assert (hf(x, num_recurrences=5).logits - hf(x, num_recurrences=0).logits).abs().max() == 0
        assert (hf(x).logits - native(x)).abs().max().item() < ATOL


@pytest.mark.parametrize("style", ["gpt2", "llama"])
def test_recurrence_outputs_for_analysis(style, hf_models):
    hf = hf_models[style]
    x = tokens(batch=1, seq=12)
    r = 3
    with torch.no_grad():
        out = hf(x, num_recurrences=r, output_recurrence=True, output_step_logits=True, use_cache=False)
        d = hf.config.hidden_size
        assert len(out.recurrence_states) == r + 1 and len(out.gate_values) == r == len(out.proposals)
        assert all(s.shape == (1, 12, d) for s in out.recurrence_states + out.gate_values + out.proposals)
        assert all(((g >= 0) & (g <= 1)).all() for g in out.gate_values)
        # h_s = g_s h_{s-1} + (1 - g_s) o_s
        for s in range(r):
            g, h = out.gate_values[s], out.recurrence_states[s]
            expected = g * h + (1 - g) * out.proposals[s]
            assert torch.allclose(out.recurrence_states[s + 1], expected, atol=1e-6)
        # Exit after s steps == a forward at depth s.
        assert len(out.step_logits) == r + 1
        assert torch.equal(out.step_logits[-1], out.logits)
        for s in range(r + 1):
            direct = hf(x, num_recurrences=s, use_cache=False).logits
            assert (out.step_logits[s] - direct).abs().max().item() < ATOL


@pytest.mark.parametrize("style", ["gpt2", "llama"])
def test_base_model_returns_base_model_output(style, native_models, hf_models):
    from transformers.modeling_outputs import BaseModelOutputWithPast

    hf = hf_models[style]
    x = tokens(batch=1, seq=10, seed=5)
    with torch.no_grad():
        out = hf.model(x, use_cache=True, output_hidden_states=True)
        assert isinstance(out, BaseModelOutputWithPast)
        assert out.last_hidden_state.shape == (1, 10, hf.config.hidden_size)
        cache = out.cache if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else out.past_key_values
        assert type(cache).__name__ == "GRTCache" and cache.get_seq_length() == 10
        c = hf.config
        assert len(out.hidden_states) == 1 + c.num_prelude_layers + c.num_recurrences + c.num_coda_layers
        assert out.attentions is None
        # The head on the base model's state gives the causal LM's logits (and torchtitan's).
        logits = hf.lm_head(out.last_hidden_state)
        assert torch.equal(logits, hf(x, use_cache=False).logits)
        assert (logits - native_models[style](x)).abs().max().item() < ATOL
        as_tuple = hf.model(x, use_cache=False, return_dict=False)
        assert isinstance(as_tuple, tuple) and torch.equal(as_tuple[0], out.last_hidden_state)
