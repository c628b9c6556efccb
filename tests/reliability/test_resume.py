"""Exact resume: a run stopped at step 3 of 6 and resumed from its checkpoint reproduces the
uninterrupted run bit for bit (2 CPU ranks, FSDP, fp32, deterministic mode): model,
optimizer, LR schedule, data position and the depth sequence are all restored. Across a change
of layout (2 ranks -> 1 -> HSDP -> FSDP x TP): tests/reliability/test_layouts.py."""

from __future__ import annotations

import shutil

import pytest

from reliability_helpers import (
    NOISE_OFF,
    STEPS,
    assert_same_tensors,
    checkpoint_state,
    model_tensors,
    output,
    scalars,
    train,
)

STOP = 3
# Scalars that are a pure function of the training state (not timings or memory).
EXACT_TAGS = (
    "loss_metrics/global_avg_loss",
    "loss_metrics/global_max_loss",
    "grad_norm",
    "lr",
    "n_tokens_seen",
    "grt/r_last",
    "grt/r_mean",
)


def noise_args(noise: bool) -> list[str]:
    return [] if noise else NOISE_OFF


@pytest.fixture(scope="module")
def stopped(module_tmp):
    """`stopped(noise)`: a run preempted right after the checkpoint of step 3."""
    runs = {}

    def get(noise: bool):
        if noise not in runs:
            run = module_tmp("stopped") / ("noise" if noise else "no_noise")
            proc = train(
                2, run, *noise_args(noise), "--checkpoint.interval", str(STOP), env={"GRT_TEST_STOP_AFTER": str(STOP)}
            )
            assert proc.returncode == 0, output(proc)[-3000:]
            assert (run / "checkpoint" / f"step-{STOP}" / ".metadata").is_file()
            assert sorted(scalars(run)["loss_metrics/global_avg_loss"]) == [1, 2, 3]
            runs[noise] = run
        return runs[noise]

    return get


@pytest.mark.slow
def test_resume_reproduces_every_step(uninterrupted, stopped, tmp_path):
    """With the training noise on: the noise generators' state is restored too. (The same run
    with noise off ran here until the suite's time was cut, tests/README.md: every state it
    restores, this run restores and compares bit for bit as well.)"""
    reference, first_half = uninterrupted(True), stopped(True)
    run = tmp_path / "resumed"
    shutil.copytree(first_half, run)  # the stopped run's checkpoint and its event file
    proc = train(2, run, "--checkpoint.interval", str(STOP))
    out = output(proc)
    assert proc.returncode == 0, out[-3000:]
    assert f"Training starts at step {STOP + 1}" in out
    assert out.count("Checkpointing active") == 1  # one checkpointer said so (torchtitan's first is replaced)

    expected, got = scalars(reference), scalars(run)
    tags = [t for t in EXACT_TAGS if t in expected]
    assert "loss_metrics/global_avg_loss" in tags and "grt/r_last" in tags
    for tag in tags:
        assert sorted(got[tag]) == list(range(1, STEPS + 1)), tag
        assert got[tag] == expected[tag], tag  # bitwise: every step's value, float32
    assert len(set(expected["grt/r_last"].values())) > 1  # the depth really varies

    final = f"step-{STEPS}"
    assert_same_tensors(
        model_tensors(checkpoint_state(reference / "checkpoint" / final, tmp_path)),
        model_tensors(checkpoint_state(run / "checkpoint" / final, tmp_path)),
    )
