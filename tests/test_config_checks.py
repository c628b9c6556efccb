"""grt_titan/config_checks.py: bad configs fail at start-up with a message naming the key and
the allowed values.

Every case runs in process, exactly as torchtitan's Trainer handles a config before it builds
anything: parse (ConfigManager), look the flavor up in the registered spec, then
`update_from_config` (which ends in `check_job_config`). The same failures through the real
entry point: tests/reliability/test_startup_errors.py.
"""

from __future__ import annotations

import dataclasses
import re
import shutil

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torchtitan.protocols.train_spec import get_train_spec

import grt_titan.spec  # noqa: F401  registers the spec
from grt_titan.config_checks import Flavors, UnknownFlavorError, check_job_config
from grt_titan.model import grt_flavors

from grt_test_helpers import (
    DEBUG_TOML,
    MOR_OVERRIDES,
    REGISTERED_CONVERTERS,
    REPO,
    parse_config,
)


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
    (
        "unknown_block_style",
        [],
        set_value("grt", "block_style", "mamba"),
        {},
        [r"block_style = 'mamba'", r"'gpt2', 'llama'"],
    ),
    (
        "unknown_depth_sampling",
        [],
        set_value("grt", "depth_sampling", "poisson"),
        {},
        [r"depth_sampling = 'poisson'", r"'uniform', 'fixed'"],
    ),
    (
        "unknown_recurrence_checkpoint",
        [],
        set_value("grt", "recurrence_checkpoint", "layer"),
        {},
        [r"\[grt\] recurrence_checkpoint = 'layer'", r"'block', 'step'"],
    ),
    ("string_for_int", [], set_value("grt", "num_recurrences", "4"), {}, [r"num_recurrences = '4'", r"allowed: int"]),
    (
        "tp_vs_heads",
        ["--parallelism.tensor_parallel_degree", "3"],
        None,
        {},
        [r"\[parallelism\] tensor_parallel_degree = 3", r"n_heads = 4", r"allowed: 1, 2, 4"],
    ),
    (
        "pp>1",
        ["--parallelism.pipeline_parallel_degree", "2"],
        None,
        {},
        [r"\[parallelism\] pipeline_parallel_degree = 2", r"allowed: 1"],
    ),
    ("vocab<tokenizer", [], None, {"vocab_size": 1000}, [r"vocab_size = 1000", r"tokenizer's 4097", r">= 4097"]),
    ("seq_len>positions", ["--training.seq_len", "2048"], None, {}, [r"seq_len = 2048", r"max_seq_len = 1024"]),
    (
        "val_seq_len>positions",
        ["--validation.seq_len", "4096"],
        None,
        {},
        [r"\[validation\] seq_len = 4096", r"allowed: 1 \.\. 1024"],
    ),
    (
        "float8_dims",
        ["--model.converters", "quantize.linear.float8", "--quantize.linear.float8.emulate"],
        None,
        {"dim": 120},
        [
            r"\[model\] converters",
            r"multiples of 16",
            r"prelude\.layers\.0\.attention\.wq \(120 -> 120\)",
            r"filter_fqns",
        ],
    ),
    (
        "missing_dataset",
        ["--training.dataset", "/nonexistent/grt-data"],
        None,
        {},
        [
            r"\[training\] dataset = '/nonexistent/grt-data'",
            r"no such file",
            r"'grt_default' or a folder made by `grt-titan prepare`",
        ],
    ),
    (
        "missing_val_dataset",
        ["--validation.dataset", "/nonexistent/grt-val"],
        None,
        {},
        [r"\[validation\] dataset = '/nonexistent/grt-val'", r"grt-titan prepare"],
    ),
    (
        "train_dataset_path_not_prepared",
        ["--training.dataset", "mine", "--training.dataset_path", "/tmp"],
        None,
        {},
        [r"\[training\] dataset_path = '/tmp': not a prepared dataset", r"grt-titan prepare"],
    ),
    ("optimizer_name", ["--optimizer.name", "SGD"], None, {}, [r"\[optimizer\] name = 'SGD'", r"Adam, AdamW"]),
    ("negative_lr", ["--optimizer.lr", "-0.001"], None, {}, [r"\[optimizer\] lr = -0.001", r">= 0"]),
    (
        "on_nonfinite",
        [],
        set_value("optimizer", "on_nonfinite", "ignore"),
        {},
        [r"\[optimizer\] on_nonfinite = 'ignore'", r"'stop', 'skip'"],
    ),
    (
        "mixed_precision",
        [],
        set_value("training", "mixed_precision_param", "bf16"),
        {},
        [r"\[training\] mixed_precision_param = 'bf16'", r"'bfloat16', 'float32'"],
    ),
    (
        "checkpoint_interval",
        ["--checkpoint.enable", "--checkpoint.interval", "0"],
        None,
        {},
        [r"\[checkpoint\] interval = 0", r">= 1"],
    ),
    (
        "keep_latest_1",
        ["--checkpoint.enable", "--checkpoint.keep_latest_k", "1"],
        None,
        {},
        [r"\[checkpoint\] keep_latest_k = 1", r"0 \(keep all\) or >= 2"],
    ),
    ("odd_seq_len", ["--training.seq_len", "63"], None, {}, [r"\[training\] seq_len = 63", r"divisible by 2"]),
    (
        "rrt_tp",
        ["--parallelism.tensor_parallel_degree", "2", "--grt.step_adapter", "lora", "--grt.depth_sampling", "fixed"],
        None,
        {},
        [
            r"\[grt\] step_adapter = 'lora' \(RRT\) does not support \[parallelism\] tensor_parallel_degree = 2",
            r"allowed: tensor_parallel_degree = 1",
        ],
    ),
    (
        "random_state_tp",
        ["--parallelism.tensor_parallel_degree", "2", "--grt.initial_state", "random"],
        None,
        {},
        [r"\[grt\] initial_state = 'random' does not support \[parallelism\] tensor_parallel_degree = 2"],
    ),
    (
        "lora_needs_fixed_depth",
        ["--grt.step_adapter", "lora"],
        None,
        {},
        [r"step_adapter = 'lora' is invalid", r"depth_sampling = 'fixed'"],
    ),
    ("unknown_update", [], set_value("grt", "update", "add"), {}, [r"update = 'add'", r"'gate', 'overwrite'"]),
    (
        "spike_factor",
        ["--checkpoint.enable", "--loss_spike.enable", "--loss_spike.factor", "0.5"],
        None,
        {},
        [r"\[loss_spike\] factor = 0.5 is invalid; allowed: > 1"],
    ),
    (
        "spike_skip",
        ["--checkpoint.enable", "--loss_spike.enable", "--loss_spike.skip_batches", "0"],
        None,
        {},
        [r"\[loss_spike\] skip_batches = 0 is invalid; allowed: >= 1"],
    ),
    (
        "spike_no_checkpoint",
        ["--loss_spike.enable"],
        None,
        {},
        [r"\[loss_spike\] enable = True is invalid; allowed: false unless \[checkpoint\] enable = true"],
    ),
    (
        "trainable_matches_nothing",
        ["--training.trainable", "parts,encoder.*"],
        None,
        {},
        [r"\[training\] trainable entry 'encoder\.\*' matches nothing", r"'prelude\.", r"recurrent, parts, adapter"],
    ),
    (
        "trainable_adapter_without_adapters",
        ["--training.trainable", "adapter"],
        None,
        {},
        [r"entry 'adapter' matches nothing: this model has no per-step adapters", r'step_adapter = "lora"'],
    ),
    (
        "trainable_empty",
        [],
        set_value("training", "trainable", []),
        {},
        [r"\[training\] trainable = \[\] freezes every"],
    ),
]


@pytest.mark.parametrize("overrides,mutate,arg_changes,patterns", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_config_is_named_at_start_up(overrides, mutate, arg_changes, patterns):
    config = parse_config(*overrides)
    if mutate is not None:
        mutate(config)
    with pytest.raises(ValueError) as info:
        start_up(config, **arg_changes)
    for pattern in patterns:
        assert re.search(pattern, str(info.value)), (pattern, str(info.value))


def test_unknown_flavor_names_the_flavors():
    config = parse_config("--model.flavor", "tiny")
    with pytest.raises(ValueError, match=r"\[model\] flavor = 'tiny' is not a grt flavor; allowed: .*debug.*large"):
        start_up(config)


def test_flavor_table_keeps_mapping_semantics():
    table = Flavors(grt_flavors)
    assert table["debug"] is grt_flavors["debug"] and "tiny" not in table and table.get("tiny") is None
    with pytest.raises(KeyError):  # UnknownFlavorError is a KeyError too
        table["tiny"]
    assert str(UnknownFlavorError("x")) == "x"


def test_the_spec_hands_torchtitan_args_that_check_the_job(monkeypatch):
    """The spec's flavors are JobModelArgs, a fresh copy per lookup: their update_from_config
    takes the job's forwards per step and runs the start-up checks; GRTModelArgs' own does neither."""
    from grt_titan.spec import JobModelArgs
    from grt_titan.teacher import build_teacher

    monkeypatch.setenv("WORLD_SIZE", "1")
    spec = get_train_spec("grt")
    args = spec.model_args["debug"]
    assert type(args) is JobModelArgs and args is not spec.model_args["debug"]
    assert dataclasses.asdict(args) == dataclasses.asdict(grt_flavors["debug"])
    batch = ["--training.global_batch_size", "8", "--training.local_batch_size", "2"]
    args.update_from_config(parse_config(*batch))
    assert args.forwards_per_step == 4
    bad = parse_config(*batch, "--optimizer.lr", "-1")
    with pytest.raises(ValueError, match=r"\[optimizer\] lr"):
        spec.model_args["debug"].update_from_config(bad)
    plain = grt_flavors["debug"].replace()
    plain.update_from_config(bad)
    assert plain.forwards_per_step == 1
    assert spec.build_teacher_fn is build_teacher


def test_global_batch_must_fit_the_data_parallel_degree(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    config = parse_config("--training.global_batch_size", "10", "--training.local_batch_size", "4")
    with pytest.raises(
        ValueError,
        match=r"global_batch_size = 10 must be a multiple of local_batch_size x "
        r"data-parallel degree = 4 x 2",
    ):
        start_up(config)


def test_all_problems_are_reported_together():
    config = parse_config(
        "--optimizer.lr",
        "-1",
        "--parallelism.tensor_parallel_degree",
        "3",
        "--training.dataset",
        "/nonexistent/grt-data",
    )
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
        start_up(parse_config(path=bad))


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["--model.converters", "quantize.linear.float8", "--quantize.linear.float8.emulate"],  # head exempt
        ["--parallelism.tensor_parallel_degree", "2"],
        ["--checkpoint.enable", "--checkpoint.keep_latest_k", "2", "--optimizer.on_nonfinite", "skip"],
        ["--checkpoint.enable", "--loss_spike.enable", "--checkpoint.no-checksums"],
        ["--training.trainable", "recurrent,coda.layers.*.attention.*"],
    ],
    ids=["debug", "float8", "tp2", "checkpoint", "loss_spike", "trainable"],
)
def test_good_configs_pass(overrides):
    start_up(parse_config(*overrides))


# ---- [model] converters -----------------------------------------------------------------
# torchtitan would end in a bare `KeyError` after building the model.


@pytest.mark.parametrize(
    "name,hint",
    [
        ("float8", " (did you mean 'quantize.linear.float8'?)"),
        ("quantize.linear.fp8", " (did you mean 'quantize.linear.float8'?)"),
        ("fused_rmsnorm", ""),
    ],
)
def test_unknown_converter_is_named_with_the_registered_ones(name, hint):
    with pytest.raises(ValueError) as info:
        start_up(parse_config("--model.converters", name))
    assert str(info.value) == (
        f"invalid job config: [model] converters: unknown converter {name!r}{hint}; allowed: {REGISTERED_CONVERTERS}"
    )


# ---- resuming from a model-only last checkpoint -----------------------------------------
# torchtitan saves the last step model-only (`[checkpoint] last_save_model_only`, default
# true): extending a finished run would end in DCP's `Missing key in checkpoint state_dict:
# dataloader.dp_rank_0`.

# dcp.save in one process, no process group (the fabricated checkpoints below)
NO_PROCESS_GROUP = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def save_step(folder, step: int, full: bool) -> None:
    """A DCP `step-N` folder as torchtitan writes it: model entries by FQN, plus (full) the
    flattened train_state / optimizer / lr_scheduler / dataloader entries."""
    state = {"tok_embeddings.weight": torch.zeros(4, 2)}
    if full:
        state |= {
            "train_state": {"step": step},
            "optimizer": {"state": {"w": torch.zeros(2)}},
            "lr_scheduler": {"last_epoch": step},
            "dataloader": {"dp_rank_0": b"pos"},
        }
    dcp.save(state, checkpoint_id=str(folder / "checkpoint" / f"step-{step}"))


def resume_config(dump, *overrides):
    return parse_config("--checkpoint.enable", "--job.dump_folder", str(dump), *overrides)


@NO_PROCESS_GROUP
def test_model_only_last_checkpoint_stops_the_resume(tmp_path):
    save_step(tmp_path, 4, full=False)
    path = tmp_path / "checkpoint" / "step-4"
    with pytest.raises(ValueError) as info:
        start_up(resume_config(tmp_path))
    assert str(info.value) == (
        f"invalid job config: [checkpoint] last_save_model_only: {path} holds only the model weights "
        "(torchtitan saves the last step model-only while last_save_model_only = true), so the run "
        "cannot resume from it (no train_state, optimizer, lr_scheduler, dataloader); allowed: start "
        "from these weights with a fresh optimizer and LR schedule in a new folder (--job.dump_folder "
        f"<new> --checkpoint.initial_load_path {path} --checkpoint.initial_load_model_only); set "
        "last_save_model_only = false in runs you may extend"
    )


@NO_PROCESS_GROUP
def test_model_only_message_names_an_earlier_full_checkpoint(tmp_path):
    save_step(tmp_path, 2, full=True)
    save_step(tmp_path, 4, full=True)
    save_step(tmp_path, 6, full=False)
    with pytest.raises(
        ValueError,
        match=r"step-6 holds only the model weights .* allowed: resume from the "
        r"newest full checkpoint with --checkpoint\.load_step 4, or start",
    ):
        start_up(resume_config(tmp_path))


@NO_PROCESS_GROUP
def test_hf_last_save_is_model_only_too(tmp_path):
    save_step(tmp_path, 2, full=True)
    hf = tmp_path / "checkpoint" / "step-4"
    hf.mkdir()
    (hf / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(ValueError, match=r"step-4 holds only the model weights.*--checkpoint\.load_step 2"):
        start_up(resume_config(tmp_path))


@NO_PROCESS_GROUP
@pytest.mark.parametrize(
    "overrides",
    [
        [],  # the newest is full
        ["--checkpoint.no-enable"],  # not resuming
        ["--checkpoint.load_step", "2"],  # an earlier full one, chosen
        ["--checkpoint.exclude_from_loading", "train_state,optimizer,lr_scheduler,dataloader"],
    ],
    ids=["full", "disabled", "load_step", "exclude_all"],
)
def test_resumable_checkpoints_pass(tmp_path, overrides):
    save_step(tmp_path, 2, full=True)
    save_step(tmp_path, 4, full=not overrides)
    start_up(resume_config(tmp_path, *overrides))


@NO_PROCESS_GROUP
def test_half_written_newest_is_left_to_torchtitan(tmp_path):
    """A `step-N` without `.metadata` is never loaded (docs: Rank failure); the check skips it too."""
    save_step(tmp_path, 2, full=True)
    (tmp_path / "checkpoint" / "step-4").mkdir()
    start_up(resume_config(tmp_path))


# ---- [checkpoint] initial_load_path -------------------------------------------------------
# Loaded whenever the run has nothing of its own to resume, with checkpointing off too
# (GRTCheckpointManager.load_initial; the run: tests/reliability/test_initial_load.py), so it
# must be a checkpoint then; a resume ignores it, as torchtitan does.


def initial_load_config(dump, path, *overrides):
    return parse_config("--job.dump_folder", str(dump / "run"), "--checkpoint.initial_load_path", str(path), *overrides)


def initial_load_error(config) -> str:
    with pytest.raises(ValueError) as info:
        start_up(config)
    return str(info.value)


DCP_FOLDER = (
    "allowed: a torchtitan DCP checkpoint folder (holding .metadata), such as a run's "
    "checkpoint/step-N or the model/ folder `grt-titan retrofit` writes, or no initial_load_path (random weights)"
)


@pytest.mark.parametrize("overrides", [[], ["--checkpoint.enable"]], ids=["checkpointing_off", "on"])
def test_missing_initial_load_path_is_named(tmp_path, overrides):
    missing = tmp_path / "retrofit" / "model"
    assert initial_load_error(initial_load_config(tmp_path, missing, *overrides)) == (
        f"invalid job config: [checkpoint] initial_load_path = {str(missing)!r}: no such folder; {DCP_FOLDER}"
    )


@NO_PROCESS_GROUP
def test_initial_load_path_that_is_no_checkpoint_is_named_with_the_likely_one(tmp_path):
    """A retrofit's folder instead of its model/, a run's checkpoint/ instead of a step, an HF
    folder without initial_load_in_hf, an empty folder: each named, with the likely fix."""
    retrofit = tmp_path / "retrofit"
    dcp.save({"w": torch.zeros(2)}, checkpoint_id=str(retrofit / "model"))
    message = initial_load_error(initial_load_config(tmp_path, retrofit))
    assert message == (
        f"invalid job config: [checkpoint] initial_load_path = {str(retrofit)!r}: not a checkpoint (no "
        f".metadata in it; did you mean {str(retrofit / 'model')!r}, the checkpoint of a `grt-titan "
        f"retrofit` folder?); {DCP_FOLDER}"
    )
    save_step(tmp_path / "old", 4, full=True)
    message = initial_load_error(initial_load_config(tmp_path, tmp_path / "old" / "checkpoint"))
    assert f"; did you mean {str(tmp_path / 'old' / 'checkpoint' / 'step-4')!r}, its newest complete step?)" in message
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "model.safetensors").write_bytes(b"")
    message = initial_load_error(initial_load_config(tmp_path, hf))
    assert "; it holds safetensors: set [checkpoint] initial_load_in_hf = true to read them)" in message
    (hf / "model.safetensors").unlink()
    assert initial_load_error(initial_load_config(tmp_path, hf, "--checkpoint.initial_load_in_hf")) == (
        f"invalid job config: [checkpoint] initial_load_path = {str(hf)!r}: not a checkpoint (no *.safetensors "
        "in it); allowed: a Hugging Face folder holding *.safetensors ([checkpoint] initial_load_in_hf = true), "
        "or no initial_load_path (random weights)"
    )


@NO_PROCESS_GROUP
def test_initial_load_settings_torchtitan_asserts_are_named(tmp_path):
    model_only = tmp_path / "model"
    dcp.save({"w": torch.zeros(2)}, checkpoint_id=str(model_only))
    assert initial_load_error(initial_load_config(tmp_path, model_only, "--checkpoint.no-initial_load_model_only")) == (
        f"invalid job config: [checkpoint] initial_load_model_only = false: [checkpoint] initial_load_path = "
        f"{str(model_only)!r} holds only the model weights (no train_state, optimizer, lr_scheduler, dataloader); "
        "allowed: initial_load_model_only = true"
    )
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "model.safetensors").write_bytes(b"")
    message = initial_load_error(
        initial_load_config(tmp_path, hf, "--checkpoint.initial_load_in_hf", "--checkpoint.no-initial_load_model_only")
    )
    assert message == (
        "invalid job config: [checkpoint] initial_load_in_hf = true loads the model weights only; allowed: "
        "initial_load_model_only = true with it, or initial_load_in_hf = false"
    )


def test_initial_load_in_hf_without_a_path_reads_hf_assets_path_or_is_refused(tmp_path):
    """`initial_load_in_hf` with no initial_load_path reads `[model] hf_assets_path`'s
    safetensors (torchtitan's fallback, which it skips with checkpointing off; grt_titan loads
    it then too: tests/hf/test_hf_torchtitan_checkpoint.py), so that folder is checked at
    start-up, with checkpointing on or off, and refused by its key."""
    tiktoken = REPO / "grt_titan" / "assets" / "gpt2_4k.tiktoken"  # grt_debug's
    no_weights = tmp_path / "tokenizer_only"
    no_weights.mkdir()
    shutil.copy(tiktoken, no_weights)
    key = "[checkpoint] initial_load_in_hf = true with no initial_load_path reads [model] hf_assets_path"
    allowed = (
        "allowed: a Hugging Face folder holding *.safetensors ([checkpoint] initial_load_in_hf = true) as "
        "initial_load_path or hf_assets_path, or initial_load_in_hf = false (random weights)"
    )
    for overrides in ([], ["--checkpoint.enable"]):
        config = parse_config(
            "--job.dump_folder", str(tmp_path / "run"), "--model.hf_assets_path", str(no_weights),
            "--checkpoint.initial_load_in_hf", *overrides,
        )  # fmt: skip
        assert initial_load_error(config) == (
            f"invalid job config: {key} = {str(no_weights)!r}: not a checkpoint (no *.safetensors in it); {allowed}"
        )
    (no_weights / "model.safetensors").write_bytes(b"")  # a folder with weights: nothing to refuse
    start_up(parse_config("--model.hf_assets_path", str(no_weights), "--checkpoint.initial_load_in_hf"))
    # Without initial_load_in_hf, hf_assets_path is the tokenizer's and no weights are read.
    start_up(parse_config("--model.hf_assets_path", str(tiktoken)))


@NO_PROCESS_GROUP
def test_initial_load_path_is_checked_only_when_it_would_be_loaded(tmp_path):
    """A resume (the run's folder has a complete step) ignores initial_load_path, as torchtitan
    does: a deleted one does not stop it. A folder holding only a half-written step resumes
    nothing, so the path is loaded then, and checked."""
    missing = tmp_path / "gone"
    (tmp_path / "run" / "checkpoint" / "step-4").mkdir(parents=True)  # half-written
    message = initial_load_error(initial_load_config(tmp_path, missing, "--checkpoint.enable"))
    assert message.startswith("invalid job config: [checkpoint] initial_load_path = ")
    save_step(tmp_path / "run", 2, full=True)
    start_up(initial_load_config(tmp_path, missing, "--checkpoint.enable"))
    # With checkpointing off nothing is resumed: the path is loaded, so checked.
    assert "no such folder" in initial_load_error(initial_load_config(tmp_path, missing))


def test_initial_load_without_checkpointing_is_refused_under_torchtitans_own_trainer(tmp_path, monkeypatch):
    """torchtitan's Trainer (-m torchtitan.train) skips initial_load_path with checkpointing off:
    refused by name there; grt_titan.train's GRTTrainer loads it."""
    from grt_titan.components.plain_trainer import plain_trainer_initial_load_problems
    from grt_titan.components.trainer import starting_grt_trainer

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    config = initial_load_config(tmp_path, tmp_path / "model")
    (problem,) = plain_trainer_initial_load_problems(config)
    assert problem.startswith(f"[checkpoint] initial_load_path = {str(tmp_path / 'model')!r} is not loaded by")
    assert "python -m grt_titan.train" in problem
    with starting_grt_trainer():  # as GRTTrainer.__init__ runs torchtitan's
        assert plain_trainer_initial_load_problems(config) == []
    assert plain_trainer_initial_load_problems(initial_load_config(tmp_path, tmp_path, "--checkpoint.enable")) == []


OURO = [
    "--grt.objective",
    "exit_distribution",
    "--grt.injection",
    "none",
    "--grt.update",
    "overwrite",
    "--grt.depth_sampling",
    "fixed",
]


def test_ouro_refuses_a_per_token_exit_under_tensor_parallel_by_name():
    with pytest.raises(ValueError) as info:
        start_up(parse_config(*OURO, "--grt.exit_threshold", "0.5", "--parallelism.tensor_parallel_degree", "2"))
    assert re.search(
        r"\[grt\] exit_threshold = 0.5 is not supported with \[parallelism\] "
        r"tensor_parallel_degree = 2 .*allowed: 1.0",
        str(info.value),
    ), str(info.value)
    start_up(parse_config(*OURO, "--parallelism.tensor_parallel_degree", "2"))  # the last step: fine


def test_ouro_exit_gate_is_left_out_of_the_float8_check():
    # Linear(d, 1) cannot be float8 (torchtitan skips it by itself); it is not reported.
    args = start_up(
        parse_config(*OURO, "--model.converters", "quantize.linear.float8", "--quantize.linear.float8.emulate")
    )
    assert args.per_step_readout


# ---- Mixture-of-Recursions ([grt] router) -----------------------------------------------------


@pytest.mark.parametrize(
    "overrides,patterns",
    [
        (
            ["--parallelism.tensor_parallel_degree", "2"],
            [
                r"\[parallelism\] tensor_parallel_degree = 2 is not supported with \[grt\] router = 'expert_choice' "
                r"\(Mixture-of-Recursions\)",
                r"allowed: 1",
            ],
        ),
        (
            ["--grt.block_style", "llama"],
            [r"block_style = 'llama'", r"router = 'expert_choice' needs block_style = 'gpt2'"],
        ),
        (["--grt.depth_sampling", "uniform"], [r"depth_sampling = 'uniform'", r"needs depth_sampling = 'fixed'"]),
        (["--grt.injection", "proj"], [r"injection = 'proj'", r"needs injection = 'none'"]),
        (
            ["--grt.router_capacity", "1", "0.5"],
            [r"router_capacity = \[1.0, 0.5\]", r"one capacity per step \(num_recurrences = 4\)"],
        ),
        (
            ["--compile.enable", "--grt.router_capacity", "1", "0.5", "0.25", "0.005"],
            [
                r"\[grt\] router_capacity = \[1.0, 0.5, 0.25, 0.005\] keeps a single token at \[training\] seq_len = 128",
                r"Mixture-of-Recursions",
                r"\[compile\] enable",
                r"capacity x seq_len >= 2",
            ],
        ),
        (
            ["--compile.enable", "--grt.router_inference", "threshold"],
            [
                r"\[grt\] router_inference = 'threshold' with \[grt\] router = 'expert_choice' \(Mixture-of-Recursions\) "
                r"and \[compile\] enable",
                r"allowed: router_inference = 'top_k'",
            ],
        ),
    ],
    ids=["tp2", "llama", "sampled_depth", "re-injection", "capacity_count", "compile_one_token", "compile_threshold"],
)
def test_what_mor_cannot_do_is_named(overrides, patterns):
    with pytest.raises(ValueError) as info:
        start_up(parse_config(*MOR_OVERRIDES, *overrides))
    for pattern in patterns:
        assert re.search(pattern, str(info.value)), (pattern, str(info.value))


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["--compile.enable", "--activation_checkpoint.mode", "full", "--grt.recurrence_checkpoint", "step"],
        ["--model.converters", "quantize.linear.float8", "--quantize.linear.float8.emulate"],  # routers exempt
        ["--parallelism.data_parallel_replicate_degree", "2", "--parallelism.data_parallel_shard_degree", "1"],
    ],
    ids=["mor", "compile_ac_step", "float8", "ddp"],
)
def test_good_mor_configs_pass(overrides, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    args = start_up(parse_config(*MOR_OVERRIDES, *overrides))
    assert args.method_name == "MoR"


def test_router_capacity_must_be_a_list_of_floats():
    config = parse_config(*MOR_OVERRIDES)
    config.grt.router_capacity = "1,0.5,0.5,0.25"  # a TOML string: torchtitan does not type-check it
    with pytest.raises(
        ValueError,
        match=r"\[grt\] overrides: router_capacity = '1,0.5,0.5,0.25' is invalid; "
        r"allowed: a list of float or unset",
    ):
        start_up(config)
    config.grt.router_capacity = [1.0, 0.5, 0.5, 0.25]
    assert start_up(config).router_tokens_kept(128) == [128, 64, 64, 32]


def test_router_inference_is_checked_by_name():
    config = parse_config(*MOR_OVERRIDES)
    config.grt.router_inference = "greedy"  # a TOML string: torchtitan does not check the choice
    with pytest.raises(
        ValueError,
        match=r"\[grt\] overrides: router_inference = 'greedy' is invalid; "
        r"allowed: 'top_k', 'threshold'",
    ):
        start_up(config)
    config.grt.router_inference = "threshold"
    assert start_up(config).router_inference == "threshold"
    with pytest.raises(
        ValueError, match=r"router_inference = 'threshold' is invalid; is used by router = 'expert_choice'"
    ):
        start_up(parse_config("--grt.router_inference", "threshold"))


@pytest.mark.parametrize("where", ["missing", "empty"])
def test_a_set_hf_assets_path_without_a_tokenizer_is_named(tmp_path, where):
    """A folder someone named (a retrofit's source) that holds no tokenizer stops the start, not
    a silent fall back to GPT-2's ids; torchtitan's default path keeps the shipped GPT-2."""
    folder = tmp_path / "Qwen3-0.6B"
    if where == "empty":
        folder.mkdir()
    config = parse_config("--model.hf_assets_path", str(folder))
    reason = "does not exist" if where == "missing" else "holds no .tiktoken file and no tokenizer.json"
    with pytest.raises(ValueError, match=rf"\[model\] hf_assets_path = '{re.escape(str(folder))}' {reason}; allowed"):
        check_job_config(config, start_up(config))
    from torchtitan.config import JobConfig

    from grt_titan.tokenizer import resolve_tokenizer_source

    assert resolve_tokenizer_source(JobConfig().model.hf_assets_path) is None  # the shipped GPT-2


def test_the_checks_live_beside_their_features():
    """config_checks.py keeps the ordered list of checks and the one-line reporting; each
    feature's own checks are in the feature's module, so the file stays short."""
    source = (REPO / "grt_titan" / "config_checks.py").read_text()
    assert len(source.splitlines()) <= 250
