"""Distillation in the training step (`[distill]`, docs/distillation.md): the frozen teacher's
logits on the student's microbatch, the KD term added to the student's loss, its metrics.

`GRTTrainer` runs, per microbatch, `teacher_logits(inputs)` (no_grad, eval mode) and then
the student's forward, and trains on `loss(...)`: (1 - alpha) x the student's own loss +
alpha x T^2 KL(teacher_T || student_T), every term a sum over the scored tokens
(grt_titan/components/distill_loss.py holds the math). A method's auxiliary loss (MoR's
router terms) keeps its full weight: the KD term replaces part of the CE, not the method's
regularisers. Under tensor parallel with loss parallel both models' logits are
vocabulary-sharded DTensors (the teacher has the student's TP plan) and the KL is computed
shard by shard over the TP group, never gathering a row.

Metrics (the log steps; nothing is synchronised on the others):

| tag                        | value                                                          |
|----------------------------|----------------------------------------------------------------|
| `distill/kd_loss`          | T^2 KL per scored token, the logged step                       |
| `distill/ce_loss`          | the student's own loss per token (CE; + its auxiliary terms)   |
| `distill/teacher_time(%)`  | the teacher's forwards' share of the training time since the last log |

Validation adds `validation_metrics/distill_kd_loss` next to the student's unchanged
`validation_metrics/loss` (grt_titan/components/validate.py).
"""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, Shard
from torchtitan.components.loss import IGNORE_INDEX
from torchtitan.tools.logging import logger

from grt_titan.components import distill_loss
from grt_titan.components.distill_loss import distillation_loss, kd_loss_sum
from grt_titan.components.loss import placed_like
from grt_titan.model.part import TrainingOutput
from grt_titan.sections import DistillConfig

assert distill_loss.IGNORE_INDEX == IGNORE_INDEX, "the KD term scores the CE's tokens"


def _local_value(x: torch.Tensor) -> torch.Tensor:
    """A loss as a plain tensor (loss parallel makes it a replicated DTensor)."""
    return (x.to_local() if isinstance(x, DTensor) else x).detach().float()


def _vocab_sharded(x: torch.Tensor) -> bool:
    """A DTensor split over its last (vocabulary) dimension on a 1-D mesh: loss parallel's logits."""
    if not isinstance(x, DTensor) or len(x.placements) != 1 or not isinstance(x.placements[0], Shard):
        return False
    return x.placements[0].dim % x.ndim == x.ndim - 1


class TeacherTimer:
    """Seconds the teacher's forwards took: device events on CUDA (read at the log, when
    they have long finished), the wall clock on CPU."""

    def __init__(self, device_type: str) -> None:
        self.cuda = device_type == "cuda"
        self.seconds = 0.0
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._start: float | torch.cuda.Event | None = None

    def start(self) -> None:
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._start = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.events.append((self._start, end))
        else:
            self.seconds += time.perf_counter() - self._start

    def take(self) -> float:
        """Seconds since the last take."""
        for start, end in self.events:
            end.synchronize()
            self.seconds += start.elapsed_time(end) / 1000
        seconds, self.seconds, self.events = self.seconds, 0.0, []
        return seconds


class Distiller:
    """The teacher and the KD term of one training run (built by GRTTrainer)."""

    def __init__(self, teacher: nn.Module, config: DistillConfig, parallel_dims, device_type: str) -> None:
        self.teacher = teacher
        self.alpha = config.alpha
        self.temperature = config.temperature
        self.parallel_dims = parallel_dims
        self.timer = TeacherTimer(device_type)
        self._window_start: float | None = None  # the first training step since the last log
        self._sums: torch.Tensor | None = None  # [student loss, KD term] / global tokens, this step

    # ---- the step ------------------------------------------------------------------------

    @torch.no_grad()
    def teacher_logits(self, inputs: torch.Tensor, timed: bool = True) -> torch.Tensor:
        """The teacher's logits for the microbatch: eval mode, no autograd graph."""
        if timed:
            self.timer.start()
        logits = self.teacher(inputs)
        if isinstance(self.teacher, FSDPModule):
            self.teacher.reshard()  # FSDP keeps the root's weights gathered for a backward that never comes
        if timed:
            self.timer.stop()
        return logits

    def kd_sum(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """T^2 KL summed over the scored tokens, a plain tensor; over the TP group's vocabulary
        shards when loss parallel splits the logits."""
        group = None
        if isinstance(student_logits, DTensor):
            if not (_vocab_sharded(student_logits) and _vocab_sharded(teacher_logits)):
                raise RuntimeError(
                    "distillation expects both logits vocabulary-sharded (Shard(-1)), got "
                    f"{student_logits.placements} and {getattr(teacher_logits, 'placements', 'a plain tensor')}"
                )
            group = student_logits.device_mesh.get_group()
            student_logits, teacher_logits = student_logits.to_local(), teacher_logits.to_local()
        return kd_loss_sum(student_logits, teacher_logits, labels, self.temperature, group)

    def begin_step(self) -> None:
        self._sums = None
        if self._window_start is None:
            self._window_start = time.perf_counter()

    def loss(
        self,
        pred: torch.Tensor | TrainingOutput,
        teacher_logits: torch.Tensor,
        labels: torch.Tensor,
        student_loss: torch.Tensor,
        global_valid_tokens: torch.Tensor,
    ) -> torch.Tensor:
        """The training loss SUM of a microbatch from the student's own loss sum
        (`student_loss`, the spec's loss function on `pred`)."""
        logits = pred.logits if isinstance(pred, TrainingOutput) else pred
        aux = pred.aux_loss_sum if isinstance(pred, TrainingOutput) else None
        if self.alpha == 0:  # today's loss itself; the KD term is only logged
            with torch.no_grad():
                kd = self.kd_sum(logits.detach(), teacher_logits, labels)
            total = student_loss
        else:
            kd = self.kd_sum(logits, teacher_logits, labels)
            # (1 - alpha)(CE + aux) + alpha (KD + aux) = (1 - alpha) CE + alpha KD + aux
            kd_and_aux = kd if aux is None else kd + (aux.to_local() if isinstance(aux, DTensor) else aux).float()
            total = distillation_loss(student_loss, placed_like(kd_and_aux, student_loss), self.alpha)
        row = torch.stack([_local_value(student_loss), kd.detach().float()]) / global_valid_tokens
        self._sums = row if self._sums is None else self._sums + row
        return total

    # ---- metrics (called by the metrics processor on log steps, on every rank) -------------

    def metrics(self) -> dict[str, float]:
        if self._sums is None:
            return {}
        sums = self._sums
        pd = self.parallel_dims
        if pd.dp_cp_enabled:
            import torch.distributed._functional_collectives as funcol

            sums = funcol.all_reduce(sums, reduceOp="sum", group=pd.get_optional_mesh("loss"))
        ce, kd = sums.tolist()
        now = time.perf_counter()
        wall = now - (self._window_start or now)
        teacher = self.timer.take()
        self._window_start = None
        out = {"distill/ce_loss": ce, "distill/kd_loss": kd}
        if wall > 0:
            out["distill/teacher_time(%)"] = 100 * teacher / wall
        return out

    @staticmethod
    def console_line(metrics: dict[str, float]) -> str:
        """`distill  kd: 1.2345  ce: 5.4321  teacher: 31% of step time`."""
        share = metrics.get("distill/teacher_time(%)")
        tail = f"  teacher: {share:.0f}% of step time" if share is not None else ""
        return f"distill  kd: {metrics['distill/kd_loss']:.4f}  ce: {metrics['distill/ce_loss']:.4f}{tail}"


def log_start(distiller: Distiller) -> None:
    logger.info(
        f"Distillation: loss = (1 - {distiller.alpha:g}) CE + {distiller.alpha:g} x {distiller.temperature:g}^2 "
        "KL(teacher || student) per token; metrics distill/kd_loss, distill/ce_loss, distill/teacher_time(%)"
    )
