"""Start-up errors a user can make, each stopped with one line naming the key and what is
allowed (docs/reliability.md, "Config validation"):

- an unknown `[model] converters` name (torchtitan would end in a bare `KeyError` after
  building the model);
- resuming from a checkpoint torchtitan saved model-only at the last step
  (`[checkpoint] last_save_model_only`, default true): extending a finished run would end
  in DCP's `Missing key in checkpoint state_dict: dataloader.dp_rank_0`.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.distributed.checkpoint as dcp

from test_config_checks import assert_clear_failure, launch, parse, start_up

# dcp.save in one process, no process group (the fabricated checkpoints below)
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

REGISTERED = "quantize.grouped_mm.float8, quantize.grouped_mm.mx, quantize.linear.float8, quantize.linear.mx"


# ---- [model] converters -----------------------------------------------------------------


@pytest.mark.parametrize("name,hint", [
    ("float8", " (did you mean 'quantize.linear.float8'?)"),
    ("quantize.linear.fp8", " (did you mean 'quantize.linear.float8'?)"),
    ("fused_rmsnorm", ""),
])
def test_unknown_converter_is_named_with_the_registered_ones(name, hint):
    with pytest.raises(ValueError) as info:
        start_up(parse("--model.converters", name))
    assert str(info.value) == (
        f"invalid job config: [model] converters: unknown converter {name!r}{hint}; allowed: {REGISTERED}"
    )


@pytest.mark.slow
def test_unknown_converter_through_the_entry_point(tmp_path):
    proc = launch(tmp_path, "--model.converters", "float8", "--training.steps", "1")
    assert_clear_failure(proc, r"ValueError: invalid job config: \[model\] converters: unknown converter "
                               r"'float8' \(did you mean 'quantize\.linear\.float8'\?\); allowed: "
                               + re.escape(REGISTERED))
    assert "KeyError" not in proc.stdout + proc.stderr


# ---- resuming from a model-only last checkpoint -----------------------------------------

def save_step(folder, step: int, full: bool) -> None:
    """A DCP `step-N` folder as torchtitan writes it: model entries by FQN, plus (full) the
    flattened train_state / optimizer / lr_scheduler / dataloader entries."""
    state = {"tok_embeddings.weight": torch.zeros(4, 2)}
    if full:
        state |= {"train_state": {"step": step}, "optimizer": {"state": {"w": torch.zeros(2)}},
                  "lr_scheduler": {"last_epoch": step}, "dataloader": {"dp_rank_0": b"pos"}}
    dcp.save(state, checkpoint_id=str(folder / "checkpoint" / f"step-{step}"))


def resume_config(dump, *overrides):
    return parse("--checkpoint.enable", "--job.dump_folder", str(dump), *overrides)


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


def test_model_only_message_names_an_earlier_full_checkpoint(tmp_path):
    save_step(tmp_path, 2, full=True)
    save_step(tmp_path, 4, full=True)
    save_step(tmp_path, 6, full=False)
    with pytest.raises(ValueError, match=r"step-6 holds only the model weights .* allowed: resume from the "
                                         r"newest full checkpoint with --checkpoint\.load_step 4, or start"):
        start_up(resume_config(tmp_path))


def test_hf_last_save_is_model_only_too(tmp_path):
    save_step(tmp_path, 2, full=True)
    hf = tmp_path / "checkpoint" / "step-4"
    hf.mkdir()
    (hf / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(ValueError, match=r"step-4 holds only the model weights.*--checkpoint\.load_step 2"):
        start_up(resume_config(tmp_path))


@pytest.mark.parametrize("overrides", [
    [],                                                      # the newest is full
    ["--checkpoint.no-enable"],                              # not resuming
    ["--checkpoint.load_step", "2"],                         # an earlier full one, chosen
    ["--checkpoint.exclude_from_loading", "train_state,optimizer,lr_scheduler,dataloader"],
], ids=["full", "disabled", "load_step", "exclude_all"])
def test_resumable_checkpoints_pass(tmp_path, overrides):
    save_step(tmp_path, 2, full=True)
    save_step(tmp_path, 4, full=not overrides)
    start_up(resume_config(tmp_path, *overrides))


def test_half_written_newest_is_left_to_torchtitan(tmp_path):
    """A `step-N` without `.metadata` is never loaded (docs: Rank failure); the check skips it too."""
    save_step(tmp_path, 2, full=True)
    (tmp_path / "checkpoint" / "step-4").mkdir()
    start_up(resume_config(tmp_path))


# ---- the real entry point: extend a finished run ----------------------------------------

RUN = ["--checkpoint.enable", "--checkpoint.interval", "4", "--metrics.log_freq", "1"]


@pytest.mark.slow
def test_extending_a_finished_run(tmp_path):
    """4 steps saved in full (last_save_model_only = false) -> extended to 8 (default: the last
    save is model-only) resumes at step 5 -> extended to 10 stops at start-up, naming the key
    and the full step-4 checkpoint, with no DCP traceback."""
    first = launch(tmp_path, *RUN, "--training.steps", "4", "--checkpoint.no-last_save_model_only")
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]

    second = launch(tmp_path, *RUN, "--training.steps", "8")
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-3000:]
    assert "Training starts at step 5" in out and re.search(r"step:\s+8\s", out), out[-3000:]

    third = launch(tmp_path, *RUN, "--training.steps", "10")
    path = re.escape(str(tmp_path / "run" / "checkpoint" / "step-8"))
    assert_clear_failure(third, rf"ValueError: invalid job config: \[checkpoint\] last_save_model_only: {path} "
                                r"holds only the model weights",
                         r"--checkpoint\.load_step 4, or start from these weights")
    assert "Missing key" not in third.stdout + third.stderr
