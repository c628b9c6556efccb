"""What a training forward returns when the method's loss is more than CE on the final logits.

GRT, dense and most baselines return plain logits. A method with per-step supervision
(Ouro's exit distribution, per-step targets) or an auxiliary loss (MoR's router) returns a `TrainingOutput`
in training mode; `grt_titan.components.loss` turns it into the training loss. Eval-mode
forwards always return plain logits, so torchtitan's validator, generation and the HF
export see one type.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class TrainingOutput(NamedTuple):
    """A NamedTuple, so FSDP and torch.compile see its tensors (pytree-flattened).

    Loss = sum_t sum_tokens step_weights[t] * CE(step_logits[t], target_t) + aux_loss_sum, or,
    without step_logits, sum_tokens CE(logits) + aux_loss_sum. target_t is the batch's labels,
    or with step_labels (per-step supervision) their column t - 1 while there is one. Every term is a SUM over tokens, as
    torchtitan's cross-entropy is: the trainer divides by the global token count.
    """

    logits: torch.Tensor  # [B, S, V] the readout an eval forward would return
    step_logits: torch.Tensor | None = None  # [T, B, S, V] one readout per recurrence step
    step_weights: torch.Tensor | None = None  # [T, B, S] weight of each step's loss per token
    aux_loss_sum: torch.Tensor | None = None  # scalar, already summed over tokens
    step_labels: torch.Tensor | None = None  # [B, S, K] step t's target in column t - 1 (the batch's)
