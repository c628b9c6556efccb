"""Mixture-of-Recursions in the Hugging Face export (docs/mor.md, "Hugging Face export"):
the routers and the routed update (delta, and the released code's block update; exports without
the field run delta), threshold routing (causal) with recursion-wise KV caching
for generation, top_k routing for a full forward; each against the torchtitan model."""

import importlib
import json

import pytest
import torch

from grt_titan.checkpoints.load import load_checkpoint
from grt_titan.cli import main as cli
from grt_titan.hf.config_map import model_args_from_hf_config
from grt_titan.hf.convert import write_hf_folder
from grt_titan.hf.remote.configuration_grt import GRTConfig
from grt_titan.model import GRTModel

from grt_test_helpers import MOR_PARTS
from hf_helpers import (
    ATOL,
    assert_left_padded_rows_generate_alone,
    assert_prompt_lookup_is_greedy,
    greedy,
    load_hf,
    prompt,
    small_args,
)


@pytest.fixture(scope="module")
def mor(module_tmp):
    """(torchtitan MoR model in eval mode, exported folder, loaded HF model); `verify` compares
    the two models' logits once more at export."""
    args = small_args("gpt2").replace(**MOR_PARTS)
    torch.manual_seed(3)
    native = GRTModel(args)
    with torch.no_grad():
        native.init_weights()
        for p in native.parameters():  # far from the init: routers with varied decisions
            p.add_(torch.randn_like(p) * 0.05)
    native.eval()
    folder = module_tmp("mor") / "hf"
    write_hf_folder(folder, native.state_dict(), args, write_tokenizer=False, verify=True)
    return native, folder, load_hf(folder)


def routed(native, rule):
    native.recurrence.router.inference = rule
    return native


def mor_cache(hf):
    return importlib.import_module(type(hf).__module__).MoRCache(hf.config)


def test_config_names_the_router_and_routes_causally_by_default(mor):
    native, folder, hf = mor
    config = json.loads((folder / "config.json").read_text())
    assert config["router"] == "expert_choice" and config["router_inference"] == "threshold"
    assert config["router_scale"] == native.model_args.router_scale and config["router_capacity"] is None
    assert [k for k in hf.state_dict() if ".router." in k] == [f"model.router.{i}.weight" for i in range(4)]


def test_logits_match_torchtitan_under_both_rules(mor):
    native, _, hf = mor
    x = prompt(batch=2, seq=24, seed=3)
    with torch.no_grad():
        for r in (None, 2):  # None: R = 4
            threshold = hf(x, num_recurrences=r).logits - routed(native, "threshold")(x, num_recurrences=r)
            top_k = hf(x, num_recurrences=r, router_inference="top_k").logits - routed(native, "top_k")(
                x, num_recurrences=r
            )
            assert threshold.abs().max().item() < ATOL and top_k.abs().max().item() < ATOL, r
        # The rules differ (else the test above could not tell them apart).
        assert (hf(x).logits - hf(x, router_inference="top_k").logits).abs().max().item() > 1e-3


def test_tokens_stop_at_different_steps_and_the_cache_keeps_only_theirs(mor):
    _, _, hf = mor
    cache = mor_cache(hf)
    x = prompt(batch=2, seq=24, seed=3)
    with torch.no_grad():
        hf(x, past_key_values=cache)
    lengths = [[cache.routed_length(step, row) for step in range(4)] for row in range(2)]
    for row in lengths:  # each step keeps a subset of the previous one's tokens
        assert all(b <= a for a, b in zip(row, row[1:])) and row[0] < 24, lengths
    # Tokens stop after 0, 1, 2 and 3 steps; the rows route differently.
    assert len({n for row in lengths for n in row}) >= 4 and lengths[0] != lengths[1], lengths
    assert max(row[2] for row in lengths) > 0, lengths
    keys = cache.row_keys[(1, 1)]  # step 1, core block 1: exactly the tokens routed there
    assert [k.shape[2] for k in keys] == [lengths[0][1], lengths[1][1]]
    # fp32 K and V: every token in the prelude and coda blocks, the routed ones in the core's.
    d, core_blocks = hf.config.hidden_size, hf.config.num_core_layers
    assert cache.nbytes() == 4 * 2 * d * (2 * 2 * 24 + core_blocks * sum(map(sum, lengths)))


def test_cached_decoding_equals_the_full_forward(mor):
    native, _, hf = mor
    ids = prompt(seq=20, seed=7)
    full = routed(native, "threshold")
    with torch.no_grad():
        cache = mor_cache(hf)
        steps = [hf(ids[:, :12], past_key_values=cache).logits[:, -1]]
        for t in range(12, 20):  # one token at a time, teacher-forced
            steps.append(hf(ids[:, t : t + 1], past_key_values=cache).logits[:, -1])
        expected = full(ids)[:, 11:]
    assert (torch.stack(steps, 1) - expected).abs().max().item() < ATOL
    # Greedy generation: token for token the same with and without the cache.
    assert torch.equal(greedy(hf, ids[:, :6], n=10), greedy(hf, ids[:, :6], n=10, use_cache=False))
    # Left padding: padding never enters the core; each row generates what it would alone.
    assert_left_padded_rows_generate_alone(hf, n=6)


def test_prompt_lookup_decoding_equals_greedy(mor):
    """Assisted decoding opens MoR's recursion-wise cache and crops the rejected draft tokens."""
    out = assert_prompt_lookup_is_greedy(mor[2], n=8)
    assert type(out.cache).__name__ == "MoRCache"


def test_export_import_round_trip(mor, tmp_path):
    native, folder, _ = mor
    args = native.model_args
    assert model_args_from_hf_config(json.loads((folder / "config.json").read_text())) == args
    ckpt = tmp_path / "checkpoint" / "step-0"
    assert cli(["import-hf", "--hf-dir", str(folder), "--out", str(ckpt)]) == 0
    state, _ = load_checkpoint(ckpt, args)
    expected = native.state_dict()
    assert all(torch.equal(state[k], expected[k]) for k in state if k.startswith("recurrence.router."))
    assert all(torch.equal(v, expected[k]) for k, v in state.items() if k in expected)


def test_released_update_exports_and_matches_torchtitan(module_tmp):
    """router_update = "block" (the released code's h + g core(h)): config.json says so, the HF
    model computes it under both rules and with the cache, and import gives it back."""
    args = small_args("gpt2").replace(**MOR_PARTS, router_update="block")
    torch.manual_seed(3)
    native = GRTModel(args)
    with torch.no_grad():
        native.init_weights()
        for p in native.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    native.eval()
    folder = write_hf_folder(
        module_tmp("mor_block") / "hf", native.state_dict(), args, write_tokenizer=False, verify=True
    )
    config = json.loads((folder / "config.json").read_text())
    assert config["router_update"] == "block"
    assert model_args_from_hf_config(config) == args
    hf = load_hf(folder)
    x = prompt(batch=2, seq=24, seed=3)
    with torch.no_grad():
        for rule, kwargs in (("threshold", {}), ("top_k", {"router_inference": "top_k"})):
            diff = hf(x, **kwargs).logits - routed(native, rule)(x)
            assert diff.abs().max().item() < ATOL, rule
        cache = mor_cache(hf)
        steps = [hf(x[:1, :12], past_key_values=cache).logits[:, -1]]
        for t in range(12, 16):
            steps.append(hf(x[:1, t : t + 1], past_key_values=cache).logits[:, -1])
        assert (torch.stack(steps, 1) - routed(native, "threshold")(x[:1, :16])[:, 11:]).abs().max().item() < ATOL


def test_an_export_without_router_update_runs_the_delta_update(mor, tmp_path):
    """Exports made before the field existed have no `router_update` anywhere: they load with the
    update they were trained with (delta), in the HF model and on import."""
    native, folder, hf = mor
    config = json.loads((folder / "config.json").read_text())
    assert config["router_update"] == "delta"
    del config["router_update"]
    del config["training_settings"]["grt_model_args"]["router_update"]
    assert GRTConfig(**config).router_update == "delta"
    assert model_args_from_hf_config(config).router_update == "delta"
    old = tmp_path / "old"
    old.mkdir()
    for path in folder.iterdir():
        (old / path.name).write_bytes(path.read_bytes())
    (old / "config.json").write_text(json.dumps(config))
    x = prompt(batch=2, seq=24, seed=3)
    with torch.no_grad():
        assert torch.equal(load_hf(old)(x).logits, hf(x).logits)


def test_what_is_refused_is_named(mor):
    _, _, hf = mor
    x = prompt(seq=8)
    kwargs = {k: v for k, v in hf.config.to_dict().items() if k in ("num_recurrences", "injection", "update")}
    with pytest.raises(ValueError, match=r"router_inference = 'greedy' is invalid; allowed: \('threshold', 'top_k'\)"):
        GRTConfig(router="expert_choice", router_inference="greedy", **kwargs)
    with pytest.raises(ValueError, match=r"router_update = 'residual' is invalid; allowed: \('delta', 'block'\)"):
        GRTConfig(router="expert_choice", router_update="residual", **kwargs)
    with pytest.raises(ValueError, match=r"router_inference = 'greedy' is invalid"):
        hf(x, router_inference="greedy")
    with pytest.raises(ValueError, match=r"router_inference = 'top_k' ranks the whole sequence"):
        hf(x, router_inference="top_k", use_cache=True)
    with pytest.raises(ValueError, match="one router per step up to R = 4"):
        hf(x, num_recurrences=5)
    module = importlib.import_module(type(hf).__module__)
    # MoR's recursive KV sharing is not the `first` strategy (docs/mor.md, "Hugging Face export").
    with pytest.raises(ValueError, match=r"kv_cache_strategy = 'first' is not supported with router = 'expert_choice'"):
        module.MoRCache(hf.config, strategy="first")
    with pytest.raises(TypeError, match="needs a MoRCache"):
        hf(x, past_key_values=module.GRTCache(hf.config))
