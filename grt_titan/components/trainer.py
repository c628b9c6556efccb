"""torchtitan's Trainer with grt_titan's reliability pieces (docs/reliability.md).

`python -m grt_titan.train` runs torchtitan's own `main` with this subclass. It changes no
step of torchtitan's loop; it only
- builds the checkpointer as `GRTCheckpointManager` (checksummed saves, verified loads with
  fallback, the dataloader's state format chosen by the checkpoint), and
- with `[loss_spike] enable`, checks each step's loss before clipping and the optimizer
  step (`LossSpikeMonitor`), exits for a rewind at a spike, and gives the dataloader the
  windows of batches skipped at earlier spikes. On torchtitan's fake backend (a dry run,
  grt_titan/fake_backend.py) the losses are not real and the rewind is off.
"""

from __future__ import annotations

from typing import Any

from torchtitan.train import Trainer

from grt_titan.components.checkpoint import GRTCheckpointManager
from grt_titan.components.loss_spike import build_loss_spike_monitor


class GRTTrainer(Trainer):
    def __init__(self, job_config):
        super().__init__(job_config)
        # torchtitan builds its CheckpointManager inline; rebuild it as ours with the same
        # arguments (the first one only started its purge thread, closed here).
        plain = self.checkpointer
        plain.close()
        self.checkpointer = GRTCheckpointManager(
            dataloader=self.dataloader,
            model_parts=self.model_parts,
            optimizers=self.optimizers,
            lr_schedulers=self.lr_schedulers,
            states={"train_state": self},
            checkpoint_config=job_config.checkpoint,
            sd_adapter=getattr(plain, "sd_adapter", None),
            base_folder=job_config.job.dump_folder,
            checksums=getattr(job_config.checkpoint, "checksums", True),
        )
        self.loss_spike = build_loss_spike_monitor(self, job_config)

    def forward_backward_step(self, *args, **kwargs):
        loss = super().forward_backward_step(*args, **kwargs)
        if self.loss_spike is not None:
            self.loss_spike.after_microbatch(loss)
        return loss

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
        """Load `loss_history` only from checkpoints that hold it (GRTCheckpointManager)."""
        if self.loss_spike is not None:
            self.loss_spike.saved_history = "loss_history" in keys
