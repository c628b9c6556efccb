"""The training loss: torchtitan's summed cross-entropy, extended to `TrainingOutput`.

Plain logits go to `cross_entropy_loss`, torchtitan 0.2.2's summed cross-entropy as written
there (0.3 rewrote its own for the SPMD backends we do not use), so GRT and dense runs compute
exactly torchtitan's loss on both hosts. Methods that supervise every step (Ouro, per-step targets)
or add an auxiliary loss (MoR's router) return a `TrainingOutput` (grt_titan/model/part.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torchtitan.tools.logging import logger

from grt_titan.model.part import IGNORE_INDEX, TrainingOutput


def cross_entropy_loss(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy summed over tokens (torchtitan 0.2.2's `cross_entropy_loss`)."""
    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1), reduction="sum", ignore_index=IGNORE_INDEX)


def grt_loss(pred: torch.Tensor | TrainingOutput, labels: torch.Tensor) -> torch.Tensor:
    """SUM over tokens (torchtitan divides by the global valid-token count)."""
    if not isinstance(pred, TrainingOutput):
        return cross_entropy_loss(pred, labels)
    if pred.step_logits is None:
        loss = cross_entropy_loss(pred.logits, labels)
    else:
        steps = pred.step_logits.shape[0]
        per_token = F.cross_entropy(
            pred.step_logits.flatten(0, 2).float(),
            step_targets(labels, pred.step_labels, steps).flatten(),
            reduction="none",
            ignore_index=IGNORE_INDEX,
        )
        weights = placed_like(pred.step_weights, per_token)
        loss = (per_token * weights.flatten().float()).sum()
    if pred.aux_loss_sum is not None:
        loss = loss + placed_like(pred.aux_loss_sum, loss).float()
    return loss


def step_targets(labels: torch.Tensor, step_labels: torch.Tensor | None, steps: int) -> torch.Tensor:
    """[steps, B, S]: step t's targets, column t - 1 of the per-step labels while there is one
    (per-step supervision), the labels after it and without them (Ouro)."""
    given = 0 if step_labels is None else step_labels.shape[-1]
    return torch.stack([step_labels[..., t] if t < given else labels for t in range(steps)])


def placed_like(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Tensor parallel with loss parallel: the CE terms are replicated DTensors, the model's
    weights and auxiliary sums plain tensors equal on every rank: make them DTensors alike."""
    if isinstance(like, DTensor) and not isinstance(x, DTensor):
        return DTensor.from_local(x, like.device_mesh, like.placements, run_check=False)
    return x


def build_grt_loss(job_config, **kwargs):
    """The spec's build_loss_fn, compiled like torchtitan's when `compile.components` has loss."""
    del kwargs
    loss_fn = grt_loss
    if job_config.compile.enable and "loss" in job_config.compile.components:
        logger.info("Compiling the loss function with torch.compile")
        loss_fn = torch.compile(loss_fn, backend=job_config.compile.backend)
    return loss_fn
