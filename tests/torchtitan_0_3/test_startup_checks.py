"""0.2.2's start-up checks on torchtitan 0.3 (grt_titan/torchtitan_0_3/checks.py over
grt_titan/config_checks.py's shared checks): a bad config, from its TOML or changed as the command
line changes it, stops in 0.2.2's line before anything is built. 0.2.2's own cases:
tests/test_config_checks.py."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torchtitan.trainer", reason="torchtitan 0.3's Trainer (the 0.3 lane)")

from grt_titan import config_registry  # noqa: E402
from grt_titan.torchtitan_0_3.checks import check_config  # noqa: E402
from grt_titan.torchtitan_0_3.recipe import trainer_config  # noqa: E402
from grt_titan.torchtitan_0_3.trainer import GRTTrainer  # noqa: E402

# grt_debug's model at its sequence length (0.3's default, 2048, exceeds gpt2's learned positions).
DEBUG = {
    "model": {"flavor": "debug", "hf_assets_path": "grt_titan/assets/gpt2_4k.tiktoken"},
    "training": {"seq_len": 128},
}


def toml_config(tmp_path, sections: dict[str, dict]) -> GRTTrainer.Config:
    """The 0.3 config of a TOML holding `sections` (names with dots are nested tables)."""
    lines = []
    for name, keys in sections.items():
        lines += [f"[{name}]", *(f"{key} = {json.dumps(value)}" for key, value in keys.items())]
    path = tmp_path / "bad.toml"
    path.write_text("\n".join(lines) + "\n")
    return trainer_config(path)


def set_values(**changes):
    """Command-line overrides: `section__field=value` on the 0.3 config grt_debug builds."""

    def config(tmp_path):
        config = config_registry.grt_debug()
        for key, value in changes.items():
            section, name = key.split("__")
            setattr(getattr(config, section), name, value)
        return config

    return config


def from_toml(section: str, **keys):
    """DEBUG with `keys` set in `section`, as a TOML sets them (no command-line type checks)."""
    sections = {**DEBUG, section: {**DEBUG.get(section, {}), **keys}}
    return lambda tmp_path: toml_config(tmp_path, sections)


def odd_width_float8(tmp_path) -> GRTTrainer.Config:
    """A flavor of width 120 (not a multiple of 16) with float8 on."""
    flavor = tmp_path / "model_args.json"
    flavor.write_text(json.dumps({"dim": 120, "n_heads": 4, "n_core_layers": 2, "num_recurrences": 4}))
    model = {"flavor": str(flavor), "converters": ["quantize.linear.float8"]}
    return toml_config(tmp_path, {**DEBUG, "model": model, "quantize.linear.float8": {"emulate": True}})


# (id, the config, the one line it stops with after "invalid job config: ")
CASES = [
    (
        "seq_len_under_tp",
        set_values(parallelism__tensor_parallel_degree=2, training__seq_len=66),
        "[training] seq_len = 66 must be divisible by 4 (2 x tensor_parallel_degree x "
        "context_parallel_degree); allowed: a multiple of it",
    ),
    (
        "toml_string_for_int",
        from_toml("training", steps="10"),
        "[training] steps = '10' is invalid; allowed: int",
    ),
    (
        "on_nonfinite_choice",
        from_toml("optimizer", on_nonfinite="ignore"),
        "[optimizer] on_nonfinite = 'ignore' is invalid; allowed: 'stop', 'skip'",
    ),
    ("negative_lr", from_toml("optimizer", lr=-1.0), "[optimizer] lr = -1.0 is invalid; allowed: >= 0"),
    (
        "validation_freq",
        from_toml("validation", enable=True, freq=0),
        "[validation] freq = 0 is invalid; allowed: >= 1",
    ),
    (
        "missing_dataset",
        from_toml("training", dataset="/nonexistent/grt-data"),
        "[training] dataset = '/nonexistent/grt-data': no such file or directory; allowed: 'grt_default' "
        "or a folder made by `grt-titan prepare`",
    ),
    (
        "float8_unconverted_linears",
        odd_width_float8,
        "[model] converters = ['quantize.linear.float8']: float8 needs both dimensions of a linear to be "
        "multiples of 16",
    ),
]


@pytest.mark.parametrize("build, line", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_bad_config_stops_in_one_line_naming_the_key(tmp_path, build, line):
    config = build(tmp_path)
    with pytest.raises(ValueError) as stopped:
        check_config(config)
    message = str(stopped.value)
    assert "\n" not in message and message.startswith(f"invalid job config: {line}"), message


def test_the_global_batch_is_checked_against_the_launch_world_size(monkeypatch):
    config = config_registry.grt_debug()
    config.training.global_batch_size, config.training.local_batch_size = 6, 2
    monkeypatch.setenv("WORLD_SIZE", "2")  # torchrun's, read before the process group exists
    with pytest.raises(ValueError, match=r"global_batch_size = 6 must be a multiple of .* = 2 x 2;"):
        check_config(config)
    monkeypatch.setenv("WORLD_SIZE", "3")
    check_config(config)


def test_every_problem_is_named_together_and_the_trainer_stops_before_building(tmp_path):
    """A TP degree that divides neither the heads nor the MLP width, nor the sequence: the
    trainer's first act after its refusals is the check (no process group, no model)."""
    config = config_registry.grt_debug()
    config.parallelism.tensor_parallel_degree = 3
    with pytest.raises(ValueError) as stopped:
        GRTTrainer(config)
    assert str(stopped.value).splitlines() == [
        "invalid job config:",
        "  - [parallelism] tensor_parallel_degree = 3 must divide the flavor's n_heads = 4; allowed: 1, 2, 4",
        "  - [parallelism] tensor_parallel_degree = 3 must divide the MLP hidden size 512; allowed: 1, 2, 4",
        "  - [training] seq_len = 128 must be divisible by 6 (2 x tensor_parallel_degree x "
        "context_parallel_degree); allowed: a multiple of it",
    ]


@pytest.mark.parametrize("name", ["grt_debug", "grt_large", "paper_small_mor"])
def test_the_presets_pass(name):
    check_config(getattr(config_registry, name)())
