"""Bad configs fail at start-up with a message naming the key and the allowed values.

Most cases run in process, exactly as torchtitan's Trainer handles a config before it builds
anything: parse (ConfigManager), look the flavor up in the registered spec, then
`update_from_config` (which ends in `check_job_config`). A few run the real entry point
(`python -m grt_titan.train`, one process) and check that the traceback ends in grt_titan's
or torchtitan's config code, not deep inside torch.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import pytest
from torchtitan.config import ConfigManager
from torchtitan.protocols.train_spec import get_train_spec

import grt_titan  # noqa: F401  registers the spec
from grt_titan.config_checks import Flavors, UnknownFlavorError, check_job_config
from grt_titan.model import grt_flavors
from reliability_helpers import REPO

DEBUG_TOML = REPO / "train_configs" / "grt_debug.toml"


def parse(*overrides, path=DEBUG_TOML):
    return ConfigManager().parse_args(["--job.config_file", str(path), *overrides])


def start_up(config, **arg_changes):
    """What the Trainer does with the config before building the model (on a copy of the flavor)."""
    args = get_train_spec("grt").model_args[config.model.flavor].replace(**arg_changes)
    args.update_from_config(config)
    return args


def set_value(section: str, key: str, value):
    """A TOML value: torchtitan type-checks command-line values, not TOML ones."""
    def mutate(config):
        setattr(getattr(config, section), key, value)
    return mutate


# (id, command-line overrides, TOML-only values, model-arg changes, regexes the message must match)
CASES = [
    ("R<1", ["--grt.num_recurrences", "0"], None, {}, [r"num_recurrences = 0", r">= 1"]),
    ("r_min>R", ["--grt.min_recurrences", "9"], None, {}, [r"min_recurrences = 9", r"\[1, num_recurrences = 4\]"]),
    ("negative_state_noise", ["--grt.state_noise_std", "-0.5"], None, {}, [r"state_noise_std = -0.5", r">= 0"]),
    ("negative_gate_noise", ["--grt.gate_noise_std", "-1"], None, {}, [r"gate_noise_std = -1", r">= 0"]),
    ("tau<=0", ["--grt.gate_temperature", "0"], None, {}, [r"gate_temperature = 0", r"> 0"]),
    ("tau_nan", [], set_value("grt", "gate_temperature", float("nan")), {}, [r"gate_temperature = nan", r"finite"]),
    ("gate_override>1", ["--grt.gate_override", "1.5"], None, {}, [r"gate_override = 1.5", r"\[0, 1\]"]),
    ("dim%heads", [], None, {"dim": 130}, [r"dim = 130", r"divisible by n_heads = 4"]),
    ("kv_heads", [], None, {"block_style": "llama", "n_kv_heads": 3}, [r"n_kv_heads = 3", r"must divide n_heads = 4"]),
    ("unknown_block_style", [], set_value("grt", "block_style", "mamba"), {}, [r"block_style = 'mamba'", r"'gpt2', 'llama'"]),
    ("unknown_depth_sampling", [], set_value("grt", "depth_sampling", "poisson"), {}, [r"depth_sampling = 'poisson'", r"'uniform', 'fixed'"]),
    ("unknown_recurrence_checkpoint", [], set_value("grt", "recurrence_checkpoint", "layer"), {},
     [r"\[grt\] recurrence_checkpoint = 'layer'", r"'block', 'step'"]),
    ("string_for_int", [], set_value("grt", "num_recurrences", "4"), {}, [r"num_recurrences = '4'", r"allowed: int"]),
    ("tp_vs_heads", ["--parallelism.tensor_parallel_degree", "3"], None, {},
     [r"\[parallelism\] tensor_parallel_degree = 3", r"n_heads = 4", r"allowed: 1, 2, 4"]),
    ("pp>1", ["--parallelism.pipeline_parallel_degree", "2"], None, {},
     [r"\[parallelism\] pipeline_parallel_degree = 2", r"allowed: 1"]),
    ("vocab<tokenizer", [], None, {"vocab_size": 1000}, [r"vocab_size = 1000", r"tokenizer's 50257", r">= 50257"]),
    ("seq_len>positions", ["--training.seq_len", "2048"], None, {}, [r"seq_len = 2048", r"max_seq_len = 1024"]),
    ("val_seq_len>positions", ["--validation.seq_len", "4096"], None, {},
     [r"\[validation\] seq_len = 4096", r"allowed: 1 \.\. 1024"]),
    ("float8_dims", ["--model.converters", "quantize.linear.float8", "--quantize.linear.float8.emulate"], None,
     {"dim": 120}, [r"\[model\] converters", r"multiples of 16", r"prelude\.layers\.0\.attention\.wq \(120 -> 120\)",
                    r"filter_fqns"]),
    ("missing_dataset", ["--training.dataset", "/nonexistent/grt-data"], None, {},
     [r"\[training\] dataset = '/nonexistent/grt-data'", r"no such file", r"'grt_default' or a folder made by `grt-titan prepare`"]),
    ("missing_val_dataset", ["--validation.dataset", "/nonexistent/grt-val"], None, {},
     [r"\[validation\] dataset = '/nonexistent/grt-val'", r"grt-titan prepare"]),
    ("train_dataset_path_not_prepared", ["--training.dataset", "mine", "--training.dataset_path", "/tmp"], None, {},
     [r"\[training\] dataset_path = '/tmp': not a prepared dataset", r"grt-titan prepare"]),
    ("optimizer_name", ["--optimizer.name", "SGD"], None, {}, [r"\[optimizer\] name = 'SGD'", r"Adam, AdamW"]),
    ("negative_lr", ["--optimizer.lr", "-0.001"], None, {}, [r"\[optimizer\] lr = -0.001", r">= 0"]),
    ("on_nonfinite", [], set_value("optimizer", "on_nonfinite", "ignore"), {},
     [r"\[optimizer\] on_nonfinite = 'ignore'", r"'stop', 'skip'"]),
    ("mixed_precision", [], set_value("training", "mixed_precision_param", "bf16"), {},
     [r"\[training\] mixed_precision_param = 'bf16'", r"'bfloat16', 'float32'"]),
    ("checkpoint_interval", ["--checkpoint.enable", "--checkpoint.interval", "0"], None, {},
     [r"\[checkpoint\] interval = 0", r">= 1"]),
    ("keep_latest_1", ["--checkpoint.enable", "--checkpoint.keep_latest_k", "1"], None, {},
     [r"\[checkpoint\] keep_latest_k = 1", r"0 \(keep all\) or >= 2"]),
    ("odd_seq_len", ["--training.seq_len", "63"], None, {}, [r"\[training\] seq_len = 63", r"divisible by 2"]),
]


@pytest.mark.parametrize("overrides,mutate,arg_changes,patterns", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_config_is_named_at_start_up(overrides, mutate, arg_changes, patterns):
    config = parse(*overrides)
    if mutate is not None:
        mutate(config)
    with pytest.raises(ValueError) as info:
        start_up(config, **arg_changes)
    for pattern in patterns:
        assert re.search(pattern, str(info.value)), (pattern, str(info.value))


def test_unknown_flavor_names_the_flavors():
    config = parse("--model.flavor", "tiny")
    with pytest.raises(ValueError, match=r"\[model\] flavor = 'tiny' is not a grt flavor; allowed: .*debug.*large"):
        start_up(config)


def test_flavor_table_keeps_mapping_semantics():
    table = Flavors(grt_flavors)
    assert table["debug"] is grt_flavors["debug"] and "tiny" not in table and table.get("tiny") is None
    with pytest.raises(KeyError):  # UnknownFlavorError is a KeyError too
        table["tiny"]
    assert str(UnknownFlavorError("x")) == "x"


def test_global_batch_must_fit_the_data_parallel_degree(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    config = parse("--training.global_batch_size", "10", "--training.local_batch_size", "4")
    with pytest.raises(ValueError, match=r"global_batch_size = 10 must be a multiple of local_batch_size x "
                                         r"data-parallel degree = 4 x 2"):
        start_up(config)


def test_all_problems_are_reported_together():
    config = parse("--optimizer.lr", "-1", "--parallelism.tensor_parallel_degree", "3",
                   "--training.dataset", "/nonexistent/grt-data")
    with pytest.raises(ValueError) as info:
        start_up(config)
    lines = str(info.value).splitlines()
    assert lines[0] == "invalid job config:" and len(lines) >= 4
    assert any("[optimizer] lr" in line for line in lines)
    assert any("tensor_parallel_degree = 3" in line for line in lines)
    assert any("[training] dataset" in line for line in lines)


def test_real_toml_value_is_checked(tmp_path):
    text = DEBUG_TOML.read_text()
    assert 'depth_sampling = "uniform"' in text
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace('depth_sampling = "uniform"', 'depth_sampling = "poisson"'))
    with pytest.raises(ValueError, match=r"depth_sampling = 'poisson' is invalid; allowed: 'uniform', 'fixed'"):
        start_up(parse(path=bad))


@pytest.mark.parametrize("overrides", [
    [],
    ["--model.converters", "quantize.linear.float8", "--quantize.linear.float8.emulate"],  # head exempt
    ["--parallelism.tensor_parallel_degree", "2"],
    ["--checkpoint.enable", "--checkpoint.keep_latest_k", "2", "--optimizer.on_nonfinite", "skip"],
], ids=["debug", "float8", "tp2", "checkpoint"])
def test_good_configs_pass(overrides):
    start_up(parse(*overrides))


def test_every_shipped_config_passes():
    for path in sorted((REPO / "train_configs").glob("*.toml")):
        config = parse(path=path)
        args = get_train_spec("grt").model_args[config.model.flavor].replace()
        args.update_from_config(config)
        check_job_config(config, args)


# ---- the real entry point ---------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(tmp_path, *overrides, env=None, config=DEBUG_TOML) -> subprocess.CompletedProcess:
    """`python -m grt_titan.train` as one process (rank 0 of 1, or of NGPU on the fake backend)."""
    full_env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1", **(env or {})}
    cmd = [sys.executable, "-m", "grt_titan.train", "--job.config_file", str(config),
           "--job.dump_folder", str(tmp_path / "run"), "--training.seq_len", "64",
           "--validation.no-enable", "--metrics.no-enable-tensorboard", *overrides]
    return subprocess.run(cmd, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=120)


FRAME = re.compile(r'^\s*File "([^"]+)", line \d+', re.MULTILINE)


RANK_PREFIX = re.compile(r"^\[rank\d+\]: ?", re.MULTILINE)


def assert_clear_failure(proc, *patterns):
    output = RANK_PREFIX.sub("", proc.stdout + proc.stderr)  # torch prefixes rank errors
    assert proc.returncode != 0, output[-2000:]
    assert "Training starts" not in output and "Applied FSDP" not in output  # failed before building
    frames = FRAME.findall(output)
    assert frames, output[-2000:]
    last = frames[-1]
    # The raising frame is plugin or torchtitan config code, never torch internals.
    assert "/grt_titan/" in last or "/torchtitan/" in last, last
    assert "/site-packages/torch/" not in last, last
    final = [line for line in output.splitlines() if re.match(r"^[\w.]*(Error|Exception):", line)]
    assert final, output[-2000:]
    for pattern in patterns:
        assert re.search(pattern, output), (pattern, output[-2000:])


ENTRY_CASES = {
    "unknown_flavor": (["--model.flavor", "tiny"], {}, [r"\[model\] flavor = 'tiny' is not a grt flavor; allowed: "]),
    "R<1": (["--grt.num_recurrences", "0"], {}, [r"num_recurrences = 0 is invalid; must be >= 1"]),
    "seq_len>positions": (["--training.seq_len", "2048"], {}, [r"training\.seq_len = 2048 exceeds", r"max_seq_len = 1024"]),
    # Raised by the data loader, which torchtitan builds before the model args.
    "missing_dataset": (["--training.dataset", "/nonexistent/grt-data"], {},
                        [r"\[training\] dataset = '/nonexistent/grt-data': no such file", r"prepared dataset folder"]),
    # 3 fake ranks: a TP degree torchtitan's mesh accepts but the 4-head flavor cannot split.
    "tp_vs_heads": (["--comm.mode", "fake_backend", "--parallelism.tensor_parallel_degree", "3",
                     "--training.seq_len", "96"], {"NGPU": "3"},
                    [r"tensor_parallel_degree = 3 must divide the flavor's n_heads = 4; allowed: 1, 2, 4"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ENTRY_CASES))
def test_entry_point_fails_clearly(name, tmp_path):
    overrides, env, patterns = ENTRY_CASES[name]
    proc = launch(tmp_path, *overrides, env=env)
    assert_clear_failure(proc, *patterns)


@pytest.mark.slow
def test_entry_point_reports_toml_problems_together(tmp_path):
    text = DEBUG_TOML.read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace('\ndtype = "float32"', '\ndtype = "fp32"')
                   .replace('mixed_precision_param = "float32"', 'mixed_precision_param = "bf16"'))
    proc = launch(tmp_path, config=bad)
    assert_clear_failure(proc, r"invalid job config:\n",
                         r"  - \[training\] dtype = 'fp32' is invalid; allowed: 'bfloat16', 'float32'",
                         r"  - \[training\] mixed_precision_param = 'bf16' is invalid; allowed: 'bfloat16', 'float32'")
