"""Checksummed checkpoints and the loss-spike rewind on torchtitan 0.3 (grt_titan/torchtitan_0_3/
checkpoint.py and trainer.py over the host-neutral grt_titan/components/checksums.py and
loss_spike.py), as tests/reliability/test_spike_and_corruption.py holds them on 0.2.2: in process,
0.3's CheckpointManager built from grt_titan's Config on a tiny model; end to end, one 2-rank
grt_debug run that meets a planted spike and rewinds by itself. Checksummed checkpoints across
hosts: tests/torchtitan_0_3/test_train.py."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("torchtitan.trainer", reason="torchtitan 0.3's Trainer (the 0.3 lane)")

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

from grt_titan import config_registry  # noqa: E402
from grt_titan.components.checksums import CHECKSUM_FILE, CorruptCheckpointError  # noqa: E402
from grt_titan.components.loss_spike import LOG_NAME, LossHistoryState  # noqa: E402
from grt_titan.torchtitan_0_3.checkpoint import GRTCheckpointManager  # noqa: E402
from grt_titan.torchtitan_0_3.recipe import trainer_config  # noqa: E402
from grt_titan.torchtitan_0_3.trainer import GRTTrainer  # noqa: E402

from grt_test_helpers import flip_byte, torchrun  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class TrainState:
    """The trainer's own checkpointed state (`train_state`), as 0.3's Trainer saves it."""

    def __init__(self):
        self.step = 0

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state_dict: dict) -> None:
        self.step = state_dict["step"]


def manager(tmp_path, train_state, **config) -> GRTCheckpointManager:
    """grt_titan's 0.3 manager as 0.3's Trainer builds it (`config.checkpoint.build`), one
    process: a checkpoint every step, none purged (purging asks for a process group)."""
    config = GRTCheckpointManager.Config(enable=True, interval=1, keep_latest_k=0, **config)
    return config.build(
        dataloader=None,
        model_parts=[torch.nn.Linear(4, 3)],
        optimizers={},
        lr_schedulers={},
        states={"train_state": train_state},
        sd_adapter=None,
        base_folder=str(tmp_path),
    )


def save_steps(m: GRTCheckpointManager, state: TrainState, steps) -> None:
    for step in steps:
        state.step = step
        m.save(step)


def shard(tmp_path, step: int) -> str:
    return str(tmp_path / "checkpoint" / f"step-{step}" / "__0_0.distcp")


def test_a_corrupted_checkpoint_is_named_and_passed_over_then_refused(tmp_path, caplog):
    state = TrainState()
    m = manager(tmp_path, state)
    save_steps(m, state, (1, 2, 3))
    assert all((tmp_path / "checkpoint" / f"step-{s}" / CHECKSUM_FILE).is_file() for s in (1, 2, 3))
    flip_byte(shard(tmp_path, 3))
    with caplog.at_level("INFO"):
        assert m.load() and state.step == 2
    assert "step-3 (step 3) is corrupted: __0_0.distcp: crc32" in caplog.text
    assert f"Resuming from checkpoint {tmp_path / 'checkpoint' / 'step-2'} (step 2)" in caplog.text
    assert "the newest that passes its checksums, instead of step 3." in caplog.text
    with pytest.raises(CorruptCheckpointError, match=r"step-3 \(step 3, \[checkpoint\] load_step\) failed") as e:
        m.load(3)
    assert "\n" not in str(e.value)
    flip_byte(shard(tmp_path, 2))
    flip_byte(shard(tmp_path, 1))
    with pytest.raises(CorruptCheckpointError, match=r"no checkpoint in .* passes its checksums \(steps 3, 2, 1 "):
        m.load()


def test_without_checksums_none_are_written_and_the_checkpoint_loads_unverified(tmp_path, caplog):
    state = TrainState()
    save_steps(manager(tmp_path, state, checksums=False), state, (1,))
    assert not (tmp_path / "checkpoint" / "step-1" / CHECKSUM_FILE).exists()
    with caplog.at_level("INFO"):
        assert manager(tmp_path, state).load() and state.step == 1
    assert f"has no {CHECKSUM_FILE} (saved without checksums); loading it unverified" in caplog.text


class Monitor:
    """The loss-spike monitor's history side (grt_titan/components/loss_spike.py)."""

    def __init__(self, history: list[float]):
        self.history, self.saved_history = history, True

    def history_json(self) -> str:
        return json.dumps(self.history)

    def load_history_json(self, text: str) -> None:
        self.history = json.loads(text)


class SpikeWatchedState(LossHistoryState, TrainState):
    def __init__(self, history: list[float]):
        super().__init__()
        self.loss_spike = Monitor(history)


def test_the_loss_history_is_saved_and_loaded_only_from_checkpoints_that_hold_it(tmp_path):
    """The spike's median history in `train_state`; a checkpoint without it (saved with the
    rewind off, on either host) loads into a run with it on, which then saves it."""
    watched = SpikeWatchedState([10.0, 9.0])
    save_steps(manager(tmp_path, watched), watched, (1,))
    resumed = SpikeWatchedState([])
    assert manager(tmp_path, resumed).load() and resumed.loss_spike.history == [10.0, 9.0]
    plain = TrainState()
    save_steps(manager(tmp_path / "plain", plain), plain, (1,))
    resumed = SpikeWatchedState([])
    assert manager(tmp_path / "plain", resumed).load() and resumed.step == 1
    assert resumed.loss_spike.saved_history and "loss_history" in resumed.state_dict()


def test_the_recipe_sets_checksums_and_the_loss_spike_section(tmp_path):
    assert config_registry.grt_debug().checkpoint.checksums  # on by default, as on 0.2.2
    path = tmp_path / "spike.toml"
    path.write_text(
        '[model]\nname = "grt"\nflavor = "debug"\n[checkpoint]\nchecksums = false\n'
        "[loss_spike]\nenable = true\nwindow = 2\nskip_batches = 3\n"
    )
    config = trainer_config(path)
    assert type(config.checkpoint) is GRTCheckpointManager.Config and not config.checkpoint.checksums
    assert (config.loss_spike.enable, config.loss_spike.window, config.loss_spike.skip_batches) == (True, 2, 3)
    with pytest.raises(ValueError, match=r"^\[loss_spike\] enable = True is invalid; allowed: false unless"):
        GRTTrainer(config)  # checked before anything is built: a rewind needs a checkpoint


SPIKE_STEP, GLOBAL_BATCH = 2, 4  # 2 ranks x local_batch_size 2


def saved_position(step_folder) -> int:
    state = {"dataloader": {"global_position": ""}}
    dcp.load(state, checkpoint_id=str(step_folder))
    return json.loads(state["dataloader"]["global_position"])["position"]


@pytest.mark.slow
def test_a_spike_is_rewound_and_its_batch_skipped(tmp_path):
    """A planted spike (x 50) at step 2 of 2: the step stops before the optimizer, the log
    records its window, the restart (`--max-restarts=1`) loads step 1 (verified) and reads the
    positions after the window: its last checkpoint's data position is one batch further than
    a run without a spike."""
    run = tmp_path / "spike"
    args = [
        *("--module", "tests.torchtitan_0_3.spike_registry", "--config", "grt_debug"),
        *("--training.seq_len", "64", "--training.local_batch_size", "2", "--training.steps", "2"),
        *("--validator.no-enable", "--debug.seed", "0", "--dump_folder", str(run)),
        *("--checkpoint.enable", "--checkpoint.interval", "1", "--checkpoint.no-last_save_model_only"),
        *("--loss_spike.enable", "--loss_spike.window", "1", "--loss_spike.skip_batches", "1"),
    ]
    env = {"OMP_NUM_THREADS": "1", "GRT_TEST_SPIKE_STEP": str(SPIKE_STEP)}
    proc = torchrun(2, args, tmp_path, module="torchtitan.train", env=env, max_restarts=1)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert f"LossSpikeRewind: step {SPIKE_STEP}: training loss" in out and "is a spike" in out
    assert "Training starts at step 2" in out and "unverified" not in out  # step-1, checksummed
    (entry,) = json.loads((run / "checkpoint" / LOG_NAME).read_text())["rewinds"]
    window = [(SPIKE_STEP - 1) * GLOBAL_BATCH, SPIKE_STEP * GLOBAL_BATCH]
    assert entry["step"] == SPIKE_STEP and entry["skip_positions"] == window
    assert os.path.isfile(run / "checkpoint" / "step-2" / CHECKSUM_FILE)
    assert saved_position(run / "checkpoint" / "step-2") == window[1] + GLOBAL_BATCH
