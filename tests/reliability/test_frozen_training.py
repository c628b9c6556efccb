"""Training a named subset of parameters (`[training] trainable`, docs/training.md) on the real
trainer: frozen weights stay bitwise the seed checkpoint's, the optimizer and its
checkpointed state hold the trained ones only, a resume repeats the steps bit for bit, the
export of a partly-frozen run holds every weight and gives the training model's logits, and
the same holds under TP + compile + per-step activation checkpointing."""

from __future__ import annotations

import shutil

import pytest
import torch

from grt_titan.infra.trainable import SHORTHANDS
from grt_titan.model.flavors import grt_flavors
from grt_titan.model.model import build_meta_model

from grt_test_helpers import recompiles_after_step_1
from reliability_helpers import NOISE_OFF, STEPS, checkpoint_state, model_tensors, output, scalars, train

STOP = 2
SEEDED = ["--checkpoint.initial_load_path", "{seed}", *NOISE_OFF]
EXACT_TAGS = ("loss_metrics/global_avg_loss", "grad_norm", "lr", "grt/r_last")


def args(seed, *extra: str) -> list[str]:
    return [a.replace("{seed}", str(seed)) for a in SEEDED] + list(extra)


def parameter_names() -> set[str]:
    """The debug model's parameters (its buffers, e.g. the depth sampler's count, are not)."""
    return {n for n, _ in build_meta_model(grt_flavors["debug"]).named_parameters(remove_duplicate=False)}


def trained_names(shorthand: str) -> set[str]:
    return {n for n in parameter_names() if SHORTHANDS[shorthand](n)}


def optimizer_params(state: dict) -> set[str]:
    """Parameter names in a checkpoint's optimizer state (torchtitan flattens it by FQN:
    `state.<fqn>.exp_avg`, ...; the last save holds the model alone)."""
    return {k.removeprefix("state.").rsplit(".", 1)[0] for k in state["optimizer"] if k.startswith("state.")}


def assert_frozen_and_trained(seed: dict, after: dict, trained: set[str]) -> None:
    assert after.keys() == seed.keys()  # the checkpoint still holds every weight
    for name in parameter_names() & seed.keys():
        if name in trained:
            assert not torch.equal(after[name], seed[name]), f"{name} did not train"
        else:
            assert torch.equal(after[name], seed[name]), f"frozen {name} changed"


@pytest.fixture(scope="module")
def seed(module_tmp):
    run = module_tmp("seed") / "seed"
    proc = train(
        1, run, "--checkpoint.create_seed_checkpoint", "--parallelism.data_parallel_shard_degree", "1", *NOISE_OFF
    )
    assert proc.returncode == 0, output(proc)[-3000:]
    return run / "checkpoint" / "step-0"


@pytest.fixture(scope="module")
def seed_tensors(seed, module_tmp):
    return model_tensors(checkpoint_state(seed, module_tmp("seed_state")))


@pytest.mark.slow
def test_frozen_weights_stay_the_seeds_a_resume_repeats_every_step_and_the_export_is_the_model(
    seed, seed_tensors, tmp_path
):
    """2 FSDP ranks, full activation checkpointing, `trainable = ["parts"]` (W_proj and the
    gate): 6 steps straight, and the same run stopped after step 2 and resumed."""
    from grt_titan.hf.export import export_checkpoint

    common = args(seed, "--training.trainable", "parts", "--activation_checkpoint.mode", "full")
    straight = tmp_path / "straight"
    proc = train(2, straight, *common)
    log = output(proc)
    assert proc.returncode == 0, log[-3000:]
    assert "[training] trainable = ['parts']:" in log and "the rest frozen" in log

    final = checkpoint_state(straight / "checkpoint" / f"step-{STEPS}", tmp_path)
    trained = trained_names("parts")
    assert trained and len(trained) < len(seed_tensors)
    assert_frozen_and_trained(seed_tensors, model_tensors(final), trained)
    # AdamW's moments for the trained parameters only (step 4: the last save is the model's).
    assert optimizer_params(checkpoint_state(straight / "checkpoint" / "step-4", tmp_path)) == trained

    resumed = tmp_path / "resumed"
    first = tmp_path / "first"
    proc = train(2, first, *common, env={"GRT_TEST_STOP_AFTER": str(STOP)})
    assert proc.returncode == 0, output(proc)[-3000:]
    shutil.copytree(first, resumed)
    proc = train(2, resumed, *common)
    assert proc.returncode == 0, output(proc)[-3000:]
    assert f"Training starts at step {STOP + 1}" in output(proc)
    expected, got = scalars(straight), scalars(resumed)
    for tag in EXACT_TAGS:
        assert got[tag] == expected[tag], tag  # bitwise, every step
    again = model_tensors(checkpoint_state(resumed / "checkpoint" / f"step-{STEPS}", tmp_path))
    assert all(torch.equal(again[k], v) for k, v in model_tensors(final).items())

    # The export (from the run's record) reads every weight, frozen or trained, and verifies
    # the HF forward's logits against the torchtitan model built from the same checkpoint.
    exported = export_checkpoint(straight / "checkpoint", straight / "grt_run.json", tmp_path / "export")
    assert (exported / "config.json").is_file()


@pytest.mark.slow
def test_frozen_weights_stay_under_tp_compile_and_per_step_checkpointing(seed, seed_tensors, tmp_path):
    """TP 2 (frozen and trained DTensor parameters in one plan) + compile + per-step AC,
    `trainable = ["recurrent"]`: the prelude, coda, embeddings and norm stay the seed's. The
    suite's one run of the GRT's per-step checkpoint under TP + compile: after step 1 (which
    compiles each module once) the steps' other depths compile nothing."""
    run = tmp_path / "tp"
    proc = train(
        2,
        run,
        *args(seed, "--training.trainable", "recurrent"),
        "--training.steps",
        str(STOP + 1),
        "--checkpoint.interval",
        "1",
        "--parallelism.tensor_parallel_degree",
        "2",
        "--parallelism.data_parallel_shard_degree",
        "1",
        "--compile.enable",
        "--compile.backend",
        "aot_eager_decomp_partition",
        "--activation_checkpoint.mode",
        "full",
        "--grt.recurrence_checkpoint",
        "step",
        env={"TORCH_LOGS": "recompiles"},
    )
    assert proc.returncode == 0, output(proc)[-3000:]
    assert not recompiles_after_step_1(output(proc))
    trained = trained_names("recurrent")
    assert_frozen_and_trained(
        seed_tensors, model_tensors(checkpoint_state(run / "checkpoint" / "step-2", tmp_path)), trained
    )
    assert optimizer_params(checkpoint_state(run / "checkpoint" / "step-1", tmp_path)) == trained
