"""Tensor parallelism (loss parallel included) and float8 on torchtitan 0.3: the 0.2.2 host's
plans (grt_titan/infra/parallelize.py) applied by 0.3's parallelize_fn
(grt_titan/torchtitan_0_3/model.py), and `[model] converters` / `[quantize.linear.float8]` read
from the same TOML (grt_titan/torchtitan_0_3/recipe.py).

The TP run is held to torchtitan 0.2.2's golden losses of the same job on FSDP 2
(tests/golden/grt_debug_losses.json, `fsdp2_seed_ckpt_no_noise`): a seed checkpoint of one
rank, noise and clipping off, the golden run's learning-rate curve. float8's kernels need an
SM89 GPU; on CPU the conversion (emulated linears) and the choice of torchao's float8 TP
styles are checked on a meta model, the TP mesh on a fake process group.
"""

import json
import logging
from pathlib import Path

import pytest

pytest.importorskip("torchtitan.trainer", reason="torchtitan 0.3's Trainer (the 0.3 lane)")

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

from grt_titan import config_registry  # noqa: E402
from grt_titan.torchtitan_0_3.model import Float8Converter  # noqa: E402
from grt_titan.torchtitan_0_3.recipe import trainer_config  # noqa: E402
from grt_titan.torchtitan_0_3.refusals import HostRefusal, refusals  # noqa: E402
from grt_titan.torchtitan_0_3.trainer import wire_sections  # noqa: E402

from grt_test_helpers import REPO, torchrun  # noqa: E402
from tests.golden import make_golden as mg  # noqa: E402

STEPS = 6
# make_golden's job in 0.3's spelling: sequence 64, global batch 4, seed 0, noise and clipping
# off; the learning-rate curve of its 20 steps (warmup 10) over the first STEPS.
JOB = [
    *("--training.seq_len", "64", "--metrics.log_freq", "1", "--validator.no-enable", "--debug.seed", "0"),
    *("--grt.state_noise_std", "0", "--grt.gate_noise_std", "0", "--training.max_norm", "1e6"),
    *("--training.steps", str(STEPS), "--lr_scheduler.total_steps", str(mg.STEPS), "--checkpoint.enable"),
]
# 0.2.2's TP parity bound against one rank (tests/infra/test_parallel_parity.py): fp32 sums
# over other splits agree to ~1e-7 (measured here: 1.8e-7 at worst, step 1, 2026-12-06). A
# 0.1% larger learning rate moves a loss by 3e-4 (tests/infra/test_golden_losses.py); a short
# run's own schedule in place of the golden curve moved step 2 by 3e-3; gradients doubled on
# every TP rank (which AdamW all but normalises away) moved step 6 by 1.5e-5.
TP_REL = 1e-5


def run(dump: Path, nproc: int, *args: str) -> str:
    """grt_debug under `-m torchtitan.train` on `nproc` gloo ranks; rank 0's output."""
    proc = torchrun(
        nproc,
        ["--module", "grt_titan", "--config", "grt_debug", *JOB, "--dump_folder", str(dump), *args],
        dump.parent,
        module="torchtitan.train",
        env={"OMP_NUM_THREADS": "1"},
        log_name=f"{dump.name}.log",
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def seed_checkpoint(module_tmp) -> Path:
    """make_golden's seed checkpoint, written by one 0.3 rank (its weights are 0.2.2's: step 1
    of the run below equals the golden step 1)."""
    dump = module_tmp("tensor_parallel") / "seed"
    run(dump, 1, "--checkpoint.create_seed_checkpoint", "--parallelism.data_parallel_shard_degree", "1")
    return dump / "checkpoint" / "step-0"


@pytest.mark.slow
def test_tensor_parallel_with_loss_parallel_trains_as_0_2_2_fsdp(seed_checkpoint, tmp_path):
    golden = json.loads(mg.GOLDEN.read_text())["variants"]["fsdp2_seed_ckpt_no_noise"]["losses"]
    output = run(
        tmp_path / "tp2",
        2,
        *("--checkpoint.initial_load_path", str(seed_checkpoint), "--checkpoint.interval", "1000"),
        *("--parallelism.data_parallel_shard_degree", "1", "--parallelism.tensor_parallel_degree", "2"),
        *("--training.local_batch_size", "4"),
    )
    assert "Applied Tensor Parallelism to the GRT" in output and "Applied FSDP" not in output
    losses = mg.scalars(tmp_path / "tp2")
    assert len(losses) == STEPS and losses[-1] < losses[0] - 0.4  # it trains
    assert losses == pytest.approx(golden[:STEPS], rel=TP_REL)


def debug_toml(tmp_path, section: str, line: str, extra: str = "") -> Path:
    """grt_debug.toml with `line` first in its `[section]`, and `extra` tables after it."""
    text = (REPO / "train_configs" / "grt_debug.toml").read_text()
    path = tmp_path / "grt_debug_variant.toml"
    path.write_text(text.replace(f"[{section}]\n", f"[{section}]\n{line}\n", 1) + f"\n{extra}")
    return path


def float8_toml(tmp_path, keys: str, extra: str = "") -> Path:
    converters = 'converters = ["quantize.linear.float8"]'
    return debug_toml(tmp_path, "model", converters, f"[quantize.linear.float8]\n{keys}\n{extra}")


def test_the_float8_keys_map_onto_the_converter_config(tmp_path):
    config = trainer_config(float8_toml(tmp_path, 'emulate = true\nfilter_fqns = ["gate"]'))
    assert config.model_spec.model.float8 == Float8Converter.Config(emulate=True, filter_fqns=["gate"])
    assert config.model_spec.model.loss_parallel and config_registry.grt_debug().model_spec.model.float8 is None
    with pytest.raises(HostRefusal, match=r"\[quantize.linear.float8\] emulat = True is not supported"):
        trainer_config(float8_toml(tmp_path, "emulat = true"))
    with pytest.raises(ValueError, match="needs an SM89\\+ GPU; .* emulate = true, without \\[compile\\]"):
        trainer_config(float8_toml(tmp_path, "emulate = true", extra="[compile]\nenable = true\n"))


def parallelized(config, world_size: int = 1):
    """0.3's parallelize_fn on the config's meta model (as test_recipe.py builds it)."""
    from torchtitan.distributed import ParallelDims

    wire_sections(config)
    model_config = config.model_spec.model
    model_config.update_from_config(config=config)
    with torch.device("meta"):
        model = model_config.build()
    parallel_dims = ParallelDims.from_config(config.parallelism, world_size=world_size)
    return config.model_spec.parallelize_fn(
        model,
        parallel_dims=parallel_dims,
        training=config.training,
        parallelism=config.parallelism,
        compile_config=config.compile,
        ac_config=None,
        dump_folder="",
    )


def float8_linears(model: nn.Module) -> tuple[set[str], set[str]]:
    from torchao.float8.float8_linear import Float8Linear

    linears = {n for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    return linears, {n for n, m in model.named_modules() if isinstance(m, Float8Linear)}


def test_float8_converts_every_linear_but_the_head_and_the_filtered(tmp_path):
    """As 0.2.2's converter (tests/infra/test_float8.py): the LM head's 4097 rows are not a
    multiple of 16; `filter_fqns = ["gate"]` keeps the gate's linears high precision."""
    model = parallelized(trainer_config(float8_toml(tmp_path, 'emulate = true\nfilter_fqns = ["gate"]')))
    linears, converted = float8_linears(model)
    assert "recurrence.step.proj" in converted and "recurrence.step.core.layers.0.attention.wq" in converted
    assert converted == {n for n in linears if "gate" not in n and n != "output"}


@pytest.fixture
def fake_tp_world():
    """A 2-rank world of torch's fake process group in this process (collectives return at once)."""
    import torch.distributed as dist
    from torchtitan.distributed.utils import init_fake_mode

    init_fake_mode(2)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("recipe, styles", [("", "Float8 tensorwise "), ('recipe_name = "rowwise_with_gw_hp"', "")])
def test_tp_takes_torchao_float8_styles_with_the_tensorwise_recipe(tmp_path, fake_tp_world, caplog, recipe, styles):
    """0.2.2's rule (`float8_tensorwise_tp`): tensorwise float8 linears take torchao's float8 TP
    styles; rowwise ones torch's (rowwise_with_gw_hp here: "rowwise" sets an inductor flag for the
    process, as torchtitan does). Either way the linears are Float8Linear with TP-sharded weights."""
    config = trainer_config(float8_toml(tmp_path, f"emulate = true\n{recipe}"))
    config.parallelism.tensor_parallel_degree, config.parallelism.data_parallel_shard_degree = 2, 1
    with caplog.at_level(logging.INFO):
        model = parallelized(config, world_size=2)
    assert f"Applied {styles}Tensor Parallelism to the GRT" in caplog.text
    assert "recurrence.step.core.layers.0.attention.wq" in float8_linears(model)[1]
    wq = model.recurrence.step.core.layers["0"].attention.wq.weight
    assert isinstance(wq, DTensor) and wq.placements[0].is_shard(0)  # colwise: output features
    assert model.output.weight is model.tok_embeddings.weight  # re-tied after TP


@pytest.mark.parametrize("disable", [False, True])
def test_the_logits_stay_vocabulary_sharded_unless_loss_parallel_is_disabled(tmp_path, fake_tp_world, disable):
    """Loss parallel (0.3's way for its own models, 0.2.2's default): the LM head hands the loss
    its vocabulary shard as a DTensor (GRTLoss scores it in place); `[parallelism]
    disable_loss_parallel = true`, as on 0.2.2, hands it the gathered logits as a plain tensor."""
    config = trainer_config(debug_toml(tmp_path, "parallelism", f"disable_loss_parallel = {str(disable).lower()}"))
    config.parallelism.tensor_parallel_degree, config.parallelism.data_parallel_shard_degree = 2, 1
    model = parallelized(config, world_size=2).to_empty(device="cpu")
    logits = model.output(torch.zeros(2, 4, model.model_args.dim))  # this rank's 4 of 8 positions
    assert isinstance(logits, DTensor) is not disable
    if not disable:
        assert logits.placements[0].is_shard(2) and logits.to_local().shape[-1] == (logits.shape[-1] + 1) // 2


def test_what_tensor_parallelism_cannot_run_is_refused_in_one_line():
    """The methods' own TP rules (grt_titan/model/, as 0.2.2's start-up checks run them) and
    0.3's switch that the GRT's sequence-parallel plan has no use for."""
    config = config_registry.preset("paper_small_rrt")
    config.parallelism.tensor_parallel_degree = 2
    assert refusals(config) == []
    wire_sections(config)
    with pytest.raises(ValueError, match=r"^\[grt\] step_adapter = 'lora' \(RRT\) does not support .* = 2: "):
        config.model_spec.model.update_from_config(config=config)
    config.parallelism.enable_sequence_parallel = False
    assert refusals(config) == [
        "--parallelism.no-enable_sequence_parallel with tensor parallelism is not supported by grt_titan: the "
        "GRT's TP plan shards the sequence between blocks on both hosts (docs/parallelism.md)"
    ]


def test_replicas_alone_are_sharded_over_their_mesh(tmp_path, fake_tp_world, caplog):
    """Data-parallel replicas without dp_shard: HSDP over a shard dimension of one, as 0.3 shards
    its own models, so the replicas' gradients are reduced (nothing applied would train each
    replica on its own batch alone)."""
    config = trainer_config(REPO / "train_configs" / "grt_debug.toml")
    config.parallelism.data_parallel_replicate_degree, config.parallelism.data_parallel_shard_degree = 2, 1
    with caplog.at_level(logging.INFO):
        model = parallelized(config, world_size=2)
    assert "Applied HSDP to the GRT" in caplog.text
    weight = model.recurrence.step.core.layers["0"].attention.wq.weight
    assert isinstance(weight, DTensor) and weight.device_mesh.mesh_dim_names == ("dp_replicate", "fsdp")


@pytest.mark.parametrize("tp, forwards", [(1, 2), (2, 4)])
def test_gradient_accumulation_counts_data_parallel_ranks_only(monkeypatch, tp, forwards):
    """Forwards per optimizer step (the depth curriculum's step count): global batch 16 of 2 per
    forward over the data-parallel ranks, 4 of 4 ranks under FSDP, 2 of them under TP 2."""
    monkeypatch.setenv("WORLD_SIZE", "4")
    config = config_registry.grt_debug()
    config.training.local_batch_size, config.training.global_batch_size = 2, 16
    config.parallelism.tensor_parallel_degree = tp
    wire_sections(config)
    assert config.forwards_per_step == forwards
