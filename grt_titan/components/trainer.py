"""torchtitan's Trainer with grt_titan's reliability pieces (docs/reliability.md).

`python -m grt_titan.train` runs torchtitan's own `main` with this subclass. It changes no
step of torchtitan's loop; it only
- builds the checkpointer as `GRTCheckpointManager` (checksummed saves, verified loads with
  fallback, the dataloader's state format chosen by the checkpoint, `[checkpoint]
  initial_load_path` loaded with checkpointing off too), and
- with `[loss_spike] enable`, checks each step's loss before clipping and the optimizer
  step (`LossSpikeMonitor`), exits for a rewind at a spike, and gives the dataloader the
  windows of batches skipped at earlier spikes. On torchtitan's fake backend (a dry run,
  grt_titan/runtime/fake_backend.py) the losses are not real and the rewind is off.
- with `[distill] teacher`, runs the frozen teacher on each microbatch before the student
  and trains on the KD-weighted loss (`Distiller`, docs/distillation.md); the teacher is not
  a model part, so it is never checkpointed and every start reads it from its source. Its
  builder is the spec's `build_teacher_fn` (grt_titan/spec.py).

torchtitan's own trainer runs none of these: the start-up checks, which run inside torchtitan's
Trainer.__init__, ask `grt_trainer_is_starting` whether it is this one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextvars import ContextVar

import torch
from torchtitan.train import Trainer

from grt_titan.components.checkpoint import GRTCheckpointManager, checkpoint_subfolder
from grt_titan.components.distill import Distiller, log_start
from grt_titan.components.loss_spike import LossHistoryState, build_loss_spike_monitor
from grt_titan.components.metrics import rewriting_log

CHECKPOINTING_LINE = "Checkpointing active."  # how torchtitan's CheckpointManager starts its start-up line


def _not_the_checkpointing_line(record) -> bool:
    return not (isinstance(record.msg, str) and record.msg.startswith(CHECKPOINTING_LINE))


_starting = ContextVar("grt_trainer_starting", default=False)


@contextlib.contextmanager
def starting_grt_trainer() -> Iterator[None]:
    """Marks torchtitan's Trainer.__init__ as a GRTTrainer's while it runs."""
    token = _starting.set(True)
    try:
        yield
    finally:
        _starting.reset(token)


def grt_trainer_is_starting() -> bool:
    """Whether the Trainer.__init__ running is a GRTTrainer's: the start-up checks refuse,
    under torchtitan's own trainer, what only this one runs (a teacher, fault tolerance, an
    initial load with checkpointing off)."""
    return _starting.get()


class GRTTrainer(LossHistoryState, Trainer):
    def __init__(self, job_config):
        # torchtitan builds its CheckpointManager inline; it is rebuilt as ours below with the
        # same arguments (the first one only started its purge thread, closed here). Its
        # "Checkpointing active" line is dropped: ours says it once, with our folder (a
        # fault-tolerant group's own replica_<id>), and two read as two checkpointers.
        with rewriting_log(_not_the_checkpointing_line), starting_grt_trainer():
            super().__init__(job_config)
        plain = self.checkpointer
        plain.close()
        sd_adapter = getattr(plain, "sd_adapter", None)
        c = job_config.checkpoint
        if sd_adapter is None and c.initial_load_in_hf and self.train_spec.state_dict_adapter is not None:
            # torchtitan keeps its adapter only with checkpointing on; ours loads an HF
            # initial_load_path with it off too. Built as torchtitan builds it.
            sd_adapter = self.train_spec.state_dict_adapter(self.model_args, job_config.model.hf_assets_path)
        self.checkpointer = self.build_checkpointer(c, sd_adapter)
        spike_folder = os.path.join(job_config.job.dump_folder, checkpoint_subfolder(job_config))
        self.loss_spike = build_loss_spike_monitor(self, job_config, spike_folder)
        self.distiller = self._build_distiller(job_config)

    def build_checkpointer(self, checkpoint_config, sd_adapter, ft_manager=None) -> GRTCheckpointManager:
        return GRTCheckpointManager(
            dataloader=self.dataloader,
            model_parts=self.model_parts,
            optimizers=self.optimizers,
            lr_schedulers=self.lr_schedulers,
            states={"train_state": self},
            checkpoint_config=checkpoint_config,
            sd_adapter=sd_adapter,
            base_folder=self.job_config.job.dump_folder,
            ft_manager=ft_manager,
            checksums=getattr(checkpoint_config, "checksums", True),
        )

    def _build_distiller(self, job_config) -> Distiller | None:
        config = getattr(job_config, "distill", None)
        if config is None or not config.teacher:
            return None
        build_teacher = getattr(self.train_spec, "build_teacher_fn", None)
        if build_teacher is None:
            raise RuntimeError(f"[distill] teacher: the train spec {job_config.model.name!r} has no teacher builder")
        teacher = build_teacher(job_config, self.parallel_dims)
        distiller = Distiller(teacher, config, self.parallel_dims, self.device.type)
        self.metrics_processor.metric_sources.append(distiller)
        if job_config.validation.enable:
            self.validator.distiller = distiller
        log_start(distiller)
        return distiller

    def train_step(self, data_iterator):
        if self.distiller is not None:
            self.distiller.begin_step()
        return super().train_step(data_iterator)

    def forward_backward_step(self, *args, **kwargs):
        step = super().forward_backward_step if self.distiller is None else self.distill_forward_backward_step
        loss = step(*args, **kwargs)
        if self.loss_spike is not None:
            self.loss_spike.after_microbatch(loss)
        return loss

    def distill_forward_backward_step(
        self, *, input_dict: dict[str, torch.Tensor], labels: torch.Tensor, global_valid_tokens: torch.Tensor
    ) -> torch.Tensor:
        """torchtitan 0.2.2's `forward_backward_step` (its branch without pipeline stages, which
        the GRT never has) with the teacher's forward first, on the same microbatch, and the
        KD term in the loss. Returns, as torchtitan's, the local loss sum / global tokens."""
        inputs, labels, extra_inputs, extra_kwargs = self.post_dataloading_process(input_dict, labels)
        assert len(self.model_parts) == 1, "the GRT has no pipeline stages"
        with self.train_context():
            with self.maybe_enable_amp:
                teacher_logits = self.distiller.teacher_logits(inputs)
                pred = self.model_parts[0](inputs, **extra_inputs, **extra_kwargs)
                student_loss = self.loss_fn(pred, labels)
                loss_sum = self.distiller.loss(pred, teacher_logits, labels, student_loss, global_valid_tokens)
                loss = loss_sum / global_valid_tokens
            del pred, teacher_logits  # free the logits before the backward, as torchtitan does
            loss.backward()
        return loss
