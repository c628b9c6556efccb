"""Loss-spike rewind (`[loss_spike]`, docs/reliability.md).

A step whose training loss is non-finite, or above `factor` x the median of the last
`window` steps' losses, is stopped before gradient clipping and the optimizer step (the
check runs after the step's last microbatch backward, on the loss all-reduced over the
data-parallel ranks, so every rank decides the same). The run then
1. appends the spike to `<checkpoint folder>/loss_spikes.json` (rank 0, atomically): the
   step, loss, median, and the window of global data positions to skip, i.e. the spike's
   global batch and the next `skip_batches - 1` ones, with their sequence numbers;
2. raises `LossSpikeRewind` on every rank, so the job exits before this step's
   checkpoint. Its restart (`torchrun --max-restarts`, or the same command again) loads the
   newest complete checkpoint, reads the log and gives the dataloader every recorded window:
   the steps up to the spike are replayed on the same data, then the window is skipped.
After `max_rewinds` recorded rewinds the next spike stops the run with `LossSpikeGaveUp`,
which is recorded too, so restarts stop at start-up instead of replaying it again.

The median's history is saved in the checkpoint (`train_state.loss_history`,
`LossHistoryState`), so a resumed run checks from its first step.

Host-neutral: torchtitan 0.2.2's GRTTrainer (grt_titan/components/trainer.py) and 0.3's
(grt_titan/torchtitan_0_3/trainer.py) both build the monitor with `build_loss_spike_monitor`
from their own config, hand it each microbatch's loss from `forward_backward_step`, and
save its history through `LossHistoryState`; the log and the history are one format, so a
run rewinds the same on either host.

On torchtitan's fake backend (a dry run: no collective moves data, so the loss is not real)
there is no monitor: a dry run never rewinds (grt_titan/runtime/fake_backend.py).
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections import deque
from typing import Any

import torch
import torch.distributed as dist
from torchtitan.distributed import utils as dist_utils
from torchtitan.tools.logging import logger

from grt_titan.runtime.fake_backend import is_fake_backend

LOG_NAME = "loss_spikes.json"


class LossSpikeRewind(RuntimeError):
    """A loss spike: the job stops to be restarted from the last checkpoint."""


class LossSpikeGaveUp(RuntimeError):
    """A loss spike after `[loss_spike] max_rewinds` rewinds."""


def read_log(path: str) -> dict:
    if not os.path.isfile(path):
        return {"rewinds": [], "gave_up": None}
    with open(path) as f:
        return json.load(f)


def _write_log(path: str, log: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(log, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def config_problems(config, checkpointing: bool) -> list[str]:
    """What `[loss_spike]` (a LossSpikeConfig) cannot run with, one line each naming the key
    and the allowed values; none while it is off. Both hosts check it at start-up."""
    if not config.enable:
        return []
    checks = [
        ("[loss_spike] factor", config.factor, config.factor > 1, "> 1"),
        ("[loss_spike] window", config.window, config.window >= 1, ">= 1"),
        ("[loss_spike] skip_batches", config.skip_batches, config.skip_batches >= 1, ">= 1"),
        ("[loss_spike] max_rewinds", config.max_rewinds, config.max_rewinds >= 0, ">= 0"),
        (
            "[loss_spike] enable",
            config.enable,
            checkpointing,
            "false unless [checkpoint] enable = true (a rewind resumes from the last checkpoint)",
        ),
    ]
    return [f"{key} = {value!r} is invalid; allowed: {allowed}" for key, value, ok, allowed in checks if not ok]


def build_loss_spike_monitor(trainer, job_config, checkpoint_folder: str) -> LossSpikeMonitor | None:
    """The trainer's monitor: None unless `[loss_spike] enable`, and on the fake backend.
    `job_config` is either host's (its `loss_spike`, `comm` and `training` sections);
    `checkpoint_folder` the run's checkpoints, which the log goes beside."""
    config = getattr(job_config, "loss_spike", None)
    if config is None or not config.enable or is_fake_backend(job_config):
        return None
    return LossSpikeMonitor(trainer, config, checkpoint_folder, job_config.training.local_batch_size)


class LossSpikeMonitor:
    """Watches a GRTTrainer's loss (either host's: its `dataloader`, `step`,
    `gradient_accumulation_steps` and `parallel_dims`); see the module docstring."""

    def __init__(self, trainer, config, checkpoint_folder: str, local_batch_size: int):
        self.trainer, self.config = trainer, config
        self.local_batch_size = local_batch_size
        # Beside the checkpoints (a replica group's own under fault tolerance): the restart
        # that resumes from them reads it.
        self.log_path = os.path.join(checkpoint_folder, LOG_NAME)
        self.history: deque[float] = deque(maxlen=config.window)
        self.saved_history = True  # False while loading a checkpoint that has none
        self._losses: list[torch.Tensor] = []
        log = read_log(self.log_path)
        if log.get("gave_up"):
            g = log["gave_up"]
            if len(log["rewinds"]) >= config.max_rewinds:
                raise LossSpikeGaveUp(
                    f"{self.log_path}: the run gave up at a loss spike at step {g['step']} after "
                    f"{len(log['rewinds'])} rewind(s); allowed: raise [loss_spike] max_rewinds, "
                    f"or resume from an earlier checkpoint with other settings"
                )
        windows = [tuple(r["skip_positions"]) for r in log["rewinds"]]
        if windows:
            trainer.dataloader.set_skip_windows(windows)
            logger.info(
                f"Loss-spike rewinds recorded in {self.log_path}: skipping data positions "
                + ", ".join(f"[{a}, {b})" for a, b in windows)
            )

    def history_json(self) -> str:
        return json.dumps(list(self.history))

    def load_history_json(self, text: str) -> None:
        self.history.clear()
        self.history.extend(json.loads(text))

    def after_microbatch(self, loss: torch.Tensor) -> None:
        # A copy: under 0.3's CUDA graphs the next microbatch's replay overwrites `loss`.
        self._losses.append(loss.detach().clone())
        if len(self._losses) == self.trainer.gradient_accumulation_steps:
            total, self._losses = torch.stack(self._losses).sum(), []
            self.check(self._global_loss(total))

    def _global_loss(self, total: torch.Tensor) -> float:
        dims = self.trainer.parallel_dims
        if dims.dp_cp_enabled:  # as torchtitan's logged global_avg_loss
            return dist_utils.dist_sum(total, dims.get_optional_mesh("loss"))
        return total.item()

    def is_spike(self, loss: float) -> tuple[bool, float | None]:
        """(spike?, the median it was compared with)."""
        if not math.isfinite(loss):
            return True, statistics.median(self.history) if self.history else None
        if len(self.history) < self.config.window:
            return False, None
        median = statistics.median(self.history)
        return loss > self.config.factor * median, median

    def check(self, loss: float) -> None:
        spike, median = self.is_spike(loss)
        if not spike:
            self.history.append(loss)
            return
        step, cfg = self.trainer.step, self.config
        log = read_log(self.log_path)
        what = (
            f"step {step}: training loss {loss:.4g} is a spike (> {cfg.factor} x median "
            f"{median:.4g} of the last {len(self.history)} steps)"
            if math.isfinite(loss)
            else f"step {step}: training loss {loss} is not finite"
        )
        if len(log["rewinds"]) >= cfg.max_rewinds:
            log["gave_up"] = {"step": step, "loss": loss if math.isfinite(loss) else str(loss)}
            self._commit(log)
            raise LossSpikeGaveUp(
                f"{what}; giving up after {len(log['rewinds'])} rewind(s) "
                f"([loss_spike] max_rewinds = {cfg.max_rewinds}); see {self.log_path}"
            )
        loader = self.trainer.dataloader
        per_step = self.local_batch_size * self.trainer.gradient_accumulation_steps
        start = loader.position(loader.delivered - per_step)  # the spike step's first position
        end = start + cfg.skip_batches * loader.global_batch
        entry = {
            "step": step,
            "loss": loss if math.isfinite(loss) else str(loss),
            "median": median,
            "skip_batches": cfg.skip_batches,
            "skip_positions": [start, end],
            "skip_sequences": [loader.dataset.sequence_number(d) for d in range(start, end)],
        }
        log["rewinds"].append(entry)
        self._commit(log)
        raise LossSpikeRewind(
            f"{what}; stopped before the optimizer step. Rewind {len(log['rewinds'])} of at most "
            f"{cfg.max_rewinds}: the restart (torchrun --max-restarts, or the same command again) "
            f"resumes from the newest complete checkpoint and skips {cfg.skip_batches} global "
            f"batch(es), data positions [{start}, {end}); recorded in {self.log_path}"
        )

    def _commit(self, log: dict) -> None:
        """Rank 0 writes the log; every rank waits for it before raising."""
        if not dist.is_initialized() or dist.get_rank() == 0:
            _write_log(self.log_path, log)
        if dist.is_initialized():
            dist.barrier()


class LossHistoryState:
    """Mixed into a GRTTrainer (before torchtitan's Trainer): the monitor's history in the
    trainer's checkpointed state (`train_state.loss_history`), loaded only from checkpoints
    that hold it (`select_saved_state`, called by grt_titan's checkpoint managers)."""

    loss_spike: LossSpikeMonitor | None = None

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.loss_spike is not None and self.loss_spike.saved_history:
            state["loss_history"] = self.loss_spike.history_json()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        if self.loss_spike is not None:
            if "loss_history" in state_dict:
                self.loss_spike.load_history_json(state_dict["loss_history"])
            self.loss_spike.saved_history = True  # every later save holds it

    def select_saved_state(self, keys: set[str]) -> None:
        if self.loss_spike is not None:
            self.loss_spike.saved_history = "loss_history" in keys
