"""Every train config parses, selects the grt spec and builds its flavor on the meta device."""

import pytest
from torchtitan.protocols.train_spec import get_train_spec

import grt_titan.spec  # noqa: F401  registers the spec
from grt_titan.model import GRTModel
from grt_titan.model.model import build_meta_model

from grt_test_helpers import REPO, parse_config, stand_in_overrides

CONFIGS = sorted((REPO / "train_configs").glob("*.toml"))


def test_all_configs_are_found():
    names = {p.stem for p in CONFIGS}
    assert {
        "grt_debug",
        "grt_small",
        "grt_medium",
        "grt_large",
        "grt_medium_isoparams",
        "grt_large_isoparams",
        "dense_small",
        "dense_medium",
        "dense_large",
        "dense_debug",
        "grt_llama_1b",
        "dense_llama_1b",
    } <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_builds_its_flavor(path, tmp_path):
    config = parse_config(*stand_in_overrides(path, tmp_path), path=path)  # a retrofit preset: its tokenizer
    assert config.model.name == "grt" and config.experimental.custom_import == "grt_titan"
    spec = get_train_spec("grt")
    args = spec.model_args[config.model.flavor].replace()
    args.update_from_config(config)
    model = build_meta_model(args)
    nparams, flops = args.get_nparams_and_flops(model, config.training.seq_len)
    assert nparams > 0 and flops > 0
    grt = config.grt
    if grt.num_recurrences is not None:
        assert args.num_recurrences == grt.num_recurrences


def test_paper_configs_follow_the_recipe():
    for stem in ("grt_small", "grt_medium", "grt_large", "dense_large"):
        c = parse_config(path=CONFIGS[0].parent / f"{stem}.toml")
        assert (c.training.seq_len, c.training.global_batch_size, c.training.steps) == (1024, 480, 20000)
        assert (c.optimizer.lr, c.optimizer.beta1, c.optimizer.beta2, c.optimizer.weight_decay) == (
            6e-4,
            0.9,
            0.95,
            0.1,
        )
        assert (c.lr_scheduler.warmup_steps, c.lr_scheduler.decay_type, c.lr_scheduler.min_lr_factor) == (
            2000,
            "cosine",
            0.1,
        )
        assert c.training.max_norm == 1.0 and c.parallelism.tensor_parallel_degree == 1


def test_toml_overrides_reach_the_model():
    config = parse_config("--grt.num_recurrences", "7", "--grt.gate_temperature", "0.5")
    args = get_train_spec("grt").model_args["debug"].replace()
    args.update_from_config(config)
    assert (args.num_recurrences, args.gate_temperature) == (7, 0.5)


def test_unknown_grt_key_names_it(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[job]\ncustom_config_module = "grt_titan.job_config"\n[grt]\nnum_recurrencez = 3\n')
    with pytest.raises(ValueError, match="num_recurrencez"):
        parse_config(path=bad)


@pytest.mark.parametrize(
    "override,key",
    [
        (["--grt.num_recurrences", "0"], "num_recurrences"),
        (["--grt.min_recurrences", "9"], "min_recurrences"),
        (["--grt.state_noise_std", "-0.5"], "state_noise_std"),
        (["--grt.gate_temperature", "0"], "gate_temperature"),
        (["--training.seq_len", "2048"], "seq_len"),
    ],
)
def test_invalid_grt_values_fail_at_start_up(override, key):
    config = parse_config(*override)
    args = get_train_spec("grt").model_args["debug"].replace()
    with pytest.raises(ValueError, match=key):
        args.update_from_config(config)
    assert get_train_spec("grt").model_args["debug"].num_recurrences == 4  # flavor untouched


def test_import_registers_once():
    import importlib

    importlib.reload(grt_titan)  # re-registering must not raise
    assert get_train_spec("grt").model_cls is GRTModel


def test_hf_assets_path_defaults_to_the_shipped_tokenizer():
    """torchtitan's default (./tests/assets/tokenizer) does not exist outside its repository
    and is warned about on every run; grt_titan's [model] default is the shipped GPT-2 file.
    The debug presets name GPT-2's first 4,096 ranks, which ship too."""
    from grt_titan.model import grt_flavors
    from grt_titan.tokenizer import GPT2_4K_TIKTOKEN_PATH, GPT2_TIKTOKEN_PATH, GPT2Tokenizer, resolve_tokenizer_path

    path = parse_config(path=REPO / "train_configs" / "grt_small.toml").model.hf_assets_path
    assert path == str(GPT2_TIKTOKEN_PATH) and resolve_tokenizer_path(path) == GPT2_TIKTOKEN_PATH
    assert resolve_tokenizer_path(parse_config().model.hf_assets_path).resolve() == GPT2_4K_TIKTOKEN_PATH
    # The debug flavors' rows are exactly that tokenizer's ids.
    assert GPT2Tokenizer(GPT2_4K_TIKTOKEN_PATH).get_vocab_size() == grt_flavors["debug"].vocab_size == 4097
