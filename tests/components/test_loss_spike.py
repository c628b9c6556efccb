"""The loss-spike monitor in one process, on a stand-in trainer: what counts as a spike,
the rewind log, giving up (grt_titan/components/loss_spike.py). End to end under torchrun:
tests/reliability/test_spike_and_corruption.py."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from grt_titan.components.loss_spike import LOG_NAME, LossSpikeGaveUp, LossSpikeMonitor, LossSpikeRewind
from grt_titan.sections import LossSpikeConfig


class Loader:
    """The dataloader surface the monitor uses: 2 ranks x 2 samples per step, G = 4."""

    def __init__(self):
        self.delivered, self.global_batch, self.windows = 0, 4, []
        self.dataset = SimpleNamespace(sequence_number=lambda d: 1000 + d)

    def position(self, delivered=None):
        return 2 * (self.delivered if delivered is None else delivered)

    def set_skip_windows(self, windows):
        self.windows = windows


def trainer(tmp_path):
    """The trainer surface the monitor uses (either host's), and where its checkpoints go."""
    return SimpleNamespace(
        checkpoint_folder=str(tmp_path / "checkpoint"),
        dataloader=Loader(),
        step=0,
        gradient_accumulation_steps=1,
        parallel_dims=SimpleNamespace(dp_cp_enabled=False),
    )


def run(monitor, t, losses):
    for loss in losses:
        t.step += 1
        t.dataloader.delivered += 2
        monitor.check(loss)


CONFIG = LossSpikeConfig(enable=True, factor=2.0, window=3, skip_batches=2, max_rewinds=1)


def monitor(t, config: LossSpikeConfig = CONFIG) -> LossSpikeMonitor:
    return LossSpikeMonitor(t, config, t.checkpoint_folder, local_batch_size=2)


def test_relative_spike_after_the_window_fills_and_non_finite_at_once(tmp_path):
    t = trainer(tmp_path)
    m = monitor(t)
    run(m, t, [10.0, 30.0, 9.0])  # 30 > 2 x 10, but the window is not full yet
    assert m.is_spike(20.1) == (True, 10.0) and m.is_spike(20.0) == (False, 10.0)  # median of 10, 30, 9
    assert m.is_spike(float("nan"))[0] and m.is_spike(math.inf)[0]
    assert monitor(trainer(tmp_path)).is_spike(float("nan"))[0]  # even with no history
    assert not monitor(trainer(tmp_path)).is_spike(1e9)[0]


def test_a_spike_is_logged_with_its_window_then_the_next_gives_up(tmp_path):
    t = trainer(tmp_path)
    m = monitor(t)
    run(m, t, [10.0, 9.0, 8.0])
    with pytest.raises(
        LossSpikeRewind,
        match=r"step 4: training loss 50 is a spike \(> 2.0 x median 9 of the "
        r"last 3 steps\).*skips 2 global batch\(es\), data positions \[12, 20\)",
    ):
        run(m, t, [50.0])
    log = json.loads((tmp_path / "checkpoint" / LOG_NAME).read_text())
    assert log["rewinds"] == [
        {
            "step": 4,
            "loss": 50.0,
            "median": 9.0,
            "skip_batches": 2,
            "skip_positions": [12, 20],
            "skip_sequences": list(range(1012, 1020)),
        }
    ]
    # the restart: the window goes to the dataloader; the checkpoint's history comes back
    t2 = trainer(tmp_path)
    t2.step = 3  # resumed from the checkpoint of step 3
    m2 = monitor(t2)
    assert t2.dataloader.windows == [(12, 20)]
    m2.load_history_json(m.history_json())
    run(m2, t2, [7.0, 8.0, 9.0])  # steps 4..6, the window skipped
    with pytest.raises(LossSpikeGaveUp, match=r"step 7: training loss nan is not finite; giving up after 1 rewind"):
        run(m2, t2, [float("nan")])
    assert json.loads((tmp_path / "checkpoint" / LOG_NAME).read_text())["gave_up"]["step"] == 7
    with pytest.raises(LossSpikeGaveUp, match=r"gave up at a loss spike at step 7 after 1 rewind.*max_rewinds"):
        monitor(trainer(tmp_path))  # later restarts stop at start-up
    monitor(trainer(tmp_path), LossSpikeConfig(enable=True, max_rewinds=2))  # unless allowed more


@pytest.mark.parametrize(
    "mode, enable, built",
    [
        ("default", True, True),
        ("default", False, False),
        ("fake_backend", True, False),  # a dry run's losses are not real: never rewind
    ],
)
def test_monitor_only_when_enabled_and_not_on_the_fake_backend(tmp_path, mode, enable, built):
    from grt_titan.components.loss_spike import build_loss_spike_monitor

    t = trainer(tmp_path)
    job_config = SimpleNamespace(
        comm=SimpleNamespace(mode=mode),
        loss_spike=LossSpikeConfig(enable=enable),
        training=SimpleNamespace(local_batch_size=2),
    )
    m = build_loss_spike_monitor(t, job_config, t.checkpoint_folder)
    assert isinstance(m, LossSpikeMonitor) if built else m is None
    if built:
        assert m.log_path == str(tmp_path / "checkpoint" / LOG_NAME) and m.local_batch_size == 2
