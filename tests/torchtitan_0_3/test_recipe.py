"""Presets as torchtitan 0.3 configs (grt_titan/config_registry.py, torchtitan_0_3/recipe.py):
every preset name resolves, TOML values land where 0.3 reads them, and what this host does not
run yet is refused in one line naming the key and the host."""

from pathlib import Path

import pytest

pytest.importorskip("torchtitan.trainer", reason="torchtitan 0.3's Trainer (the 0.3 lane)")

from torchtitan.distributed.activation_checkpoint import SelectiveAC  # noqa: E402

from grt_titan import config_registry  # noqa: E402
from grt_titan.torchtitan_0_3.recipe import trainer_config  # noqa: E402
from grt_titan.torchtitan_0_3.refusals import HostRefusal, refusals  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def test_every_preset_name_resolves_or_is_refused_by_name():
    names = config_registry.presets()
    assert {"grt_debug", "grt_large", "dense_large", "retrofit_qwen3_0_6b", "paper_small_grt"} <= set(names)
    assert set(names) <= set(dir(config_registry))
    for name in names:
        try:
            config = getattr(config_registry, name)()
        except HostRefusal as refused:
            assert "is not supported on torchtitan 0.3 yet" in str(refused) and str(names[name]) in str(refused)
            continue
        assert config.model_spec.name == "grt" and config.config_file == str(names[name])


def test_an_unknown_preset_name_lists_the_allowed():
    with pytest.raises(AttributeError):
        config_registry.grt_debgu  # noqa: B018  torchtitan's lookup: getattr
    with pytest.raises(ValueError, match="'grt_debgu' is not a grt_titan preset; allowed: .*grt_debug"):
        config_registry.preset("grt_debgu")


def test_the_debug_recipe_lands_where_torchtitan_0_3_reads_it():
    config = config_registry.grt_debug()
    assert config.model_spec.flavor == "debug" and config.dump_folder == "./outputs/grt_debug"
    assert config.grt.num_recurrences == 4 and config.grt.gate_bias_init == 4.0
    group = config.optimizer.param_groups[0]
    assert group.optimizer_name == "AdamW" and group.pattern == ".*"
    assert group.optimizer_kwargs == {"lr": 3e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
    lr = config.lr_scheduler
    assert (lr.warmup_steps, lr.decay_type, lr.min_lr_factor) == (10, "cosine", 0.1)
    t = config.training
    assert (t.local_batch_size, t.seq_len, t.steps, t.dtype, t.mixed_precision_param) == (
        8,
        128,
        60,
        "float32",
        "float32",
    )
    assert config.dataloader.dataset == "grt_default" and config.validator.dataloader.split == "val"
    assert (config.validator.enable, config.validator.freq, config.validator.steps) == (True, 30, 4)
    assert (config.metrics.log_freq, config.metrics.enable_tensorboard) == (5, True)
    assert config.parallelism.spmd_backend == "partial_dtensor" and config.activation_checkpoint is None


@pytest.mark.parametrize(
    "toml, named",
    [
        ('[activation_checkpoint]\nmode = "memory_budget"\n', "[activation_checkpoint] mode = 'memory_budget'"),
        ('[distill]\nteacher = "t"\n', "[distill] teacher = 't'"),
        ("[fault_tolerance]\nenable = true\n", "[fault_tolerance] enable = True"),
        ('[quantize.linear.mx]\nrecipe_name = "mxfp8"\n', "[quantize.linear] mx = {'recipe_name': 'mxfp8'}"),
        (
            "[validation]\nseq_len = 64\n[training]\nseq_len = 128\n",
            "[validation] seq_len (unlike [training] seq_len) = 64",
        ),
        ("[training]\nsteps_per_epoch = 3\n", "[training] steps_per_epoch = 3"),
    ],
)
def test_what_0_3_does_not_run_is_refused_in_one_line(tmp_path, toml, named):
    path = tmp_path / "bad.toml"
    path.write_text('[model]\nname = "grt"\nflavor = "debug"\n' + toml)
    with pytest.raises(HostRefusal) as refused:
        trainer_config(path)
    line = str(refused.value)
    assert (
        line == f"{path}: {named} is not supported on torchtitan 0.3 yet; run it on torchtitan 0.2.2 "
        "(docs/training.md, 'torchtitan 0.2.2 and 0.3')"
    )


def test_command_line_overrides_that_0_3_does_not_run_are_refused():
    config = config_registry.grt_debug()
    assert refusals(config) == []
    config.parallelism.tensor_parallel_degree = 2  # runs on 0.3 (test_tensor_parallel.py)
    assert refusals(config) == []
    config.parallelism.pipeline_parallel_degree = 2
    assert refusals(config) == [
        "[parallelism] pipeline_parallel_degree = 2 is not supported (the shared core cannot be split across "
        "stages); allowed: 1",
    ]


def test_parallelisms_the_grt_has_on_neither_host_are_refused_as_on_0_2_2(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[model]\nflavor = "debug"\n[parallelism]\ncontext_parallel_degree = 2\n')
    with pytest.raises(ValueError) as refused:
        trainer_config(path)
    assert str(refused.value) == (
        f"{path}: [parallelism] context_parallel_degree = 2 is not supported (the GRT's plans do not shard "
        "attention over context); allowed: 1"
    )


def test_the_gpu_recipe_keeps_its_activation_checkpointing_and_compile():
    config = config_registry.grt_large()
    assert type(config.activation_checkpoint) is SelectiveAC.Config
    assert config.compile.enable and config.compile.components == ["model", "loss"]
    assert config.training.mixed_precision_param == "bfloat16"


def test_the_parallelize_fn_freezes_what_trainable_leaves_out_and_checkpoints_each_step():
    """0.3's parallelize_fn on one rank (no FSDP): `[training] trainable` and per-step AC, as
    the 0.2.2 host applies them (grt_titan/infra/parallelize.py's helpers)."""
    import torch
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.activation_checkpoint import FullAC

    from grt_titan.torchtitan_0_3.trainer import wire_sections

    config = config_registry.grt_debug()
    config.training.trainable = ["recurrent"]
    config.grt.recurrence_checkpoint = "step"
    wire_sections(config)
    model_config = config.model_spec.model
    model_config.update_from_config(config=config)
    with torch.device("meta"):
        model = model_config.build()
    model = config.model_spec.parallelize_fn(
        model,
        parallel_dims=ParallelDims.from_config(config.parallelism, world_size=1),
        training=config.training,
        parallelism=config.parallelism,
        compile_config=config.compile,
        ac_config=FullAC.Config(),
        dump_folder="",
    )
    trained = {name.split(".")[0] for name, p in model.named_parameters() if p.requires_grad}
    assert trained == {"recurrence"}
    assert isinstance(model.recurrence.step, CheckpointWrapper)
    assert all(isinstance(block, CheckpointWrapper) for block in model.prelude.layers.values())
    assert not any(
        isinstance(m, CheckpointWrapper) for m in model.recurrence.step.modules() if m is not model.recurrence.step
    )
