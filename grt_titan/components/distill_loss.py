"""Knowledge distillation's loss: plain torch, on full or vocabulary-sharded logits.

The student's loss per token is

    (1 - alpha) CE + alpha T^2 KL(softmax(teacher / T) || softmax(student / T))

(Hinton et al. 2015: T^2 keeps the KD gradient's magnitude independent of T). Every term is
a SUM over the tokens whose label is not ignored, as torchtitan's cross-entropy is, so the
trainer's division by the global token count averages the KD term exactly like the CE.

Under tensor parallel with loss parallel the logits are split over the vocabulary (each
rank holds a column block). The KL is then computed without gathering a row: with a =
teacher / T, b = student / T, p = softmax(a), q = softmax(b),

    KL = sum_v p_v (log p_v - log q_v),   log p_v = a_v - logsumexp(a),   log q_v = b_v - logsumexp(b)

Each log-sum-exp is the sharded one (the local max all-reduced with MAX, the local sums of
exp all-reduced with SUM) and the KL is the all-reduced sum of each rank's columns' share:
only per-token scalars cross ranks, as in torch's sharded cross-entropy. Gradients: the loss
downstream is replicated on every rank of the group, so each rank differentiates its own
columns. logsumexp(b) enters the KL with coefficient sum_v p_v = 1, once, which gives each
column its exact gradient (q_v - p_v) / T.

Nothing here knows torchtitan; `group` is any process group over which the last dimension
of the logits is sharded (None: the full vocabulary is here).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

IGNORE_INDEX = -100  # torchtitan's (components/loss.py): labels never scored


class _SumOverShards(torch.autograd.Function):
    """all_reduce(SUM) whose gradient is the identity: every rank differentiates the same
    replicated result, and its share's gradient is that result's."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        out = x.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def _sum_shards(x: torch.Tensor, group) -> torch.Tensor:
    return x if group is None else _SumOverShards.apply(x, group)


def sharded_logsumexp(x: torch.Tensor, group=None) -> torch.Tensor:
    """logsumexp over the last dimension when it is split over `group`: [..., V_local] -> [...].

    The max is a constant shift (no gradient flows through it, as in torch.logsumexp)."""
    m = x.detach().amax(dim=-1)
    if group is not None:
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    return m + _sum_shards(torch.exp(x - m.unsqueeze(-1)).sum(dim=-1), group).log()


def kl_per_token(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0, group=None
) -> torch.Tensor:
    """KL(softmax(teacher / T) || softmax(student / T)) per token, in float32 (or the logits'
    wider dtype): [..., V] -> [...].

    `group`: the process group the vocabulary (last dimension) is split over, each rank
    passing its own columns of both logits; None for full rows. Gradients flow to the
    student only."""
    dtype = torch.promote_types(student_logits.dtype, torch.float32)
    b = student_logits.to(dtype) / temperature
    with torch.no_grad():
        a = teacher_logits.to(dtype) / temperature
        log_p = a - sharded_logsumexp(a, group).unsqueeze(-1)
        p = torch.exp(log_p)
    lse_b = sharded_logsumexp(b, group)
    log_q = b - lse_b.detach().unsqueeze(-1)
    # The share of this rank's columns, summed over the group; logsumexp(b)'s gradient is
    # added once (its coefficient sum_v p_v is 1), its value not at all (it is in log_q).
    return _sum_shards((p * (log_p - log_q)).sum(dim=-1), group) + (lse_b - lse_b.detach())


def kd_loss_sum(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    group=None,
) -> torch.Tensor:
    """The KD term, T^2 KL per token, SUMMED over the tokens whose label is scored (the CE's
    tokens): logits [B, S, V] (or this rank's vocabulary columns), labels [B, S]."""
    kl = kl_per_token(student_logits, teacher_logits, temperature, group)
    scored = (labels != IGNORE_INDEX).to(kl.dtype)
    return temperature**2 * (kl * scored).sum()


def distillation_loss(ce_sum: torch.Tensor, kd_sum: torch.Tensor, alpha: float) -> torch.Tensor:
    """(1 - alpha) CE + alpha KD, both sums over tokens (`kd_sum` has its T^2).

    alpha = 0 returns `ce_sum` itself, so the training is today's bit for bit (the KD term is
    then only logged); alpha = 1 returns `kd_sum` itself."""
    if alpha == 0:
        return ce_sum
    if alpha == 1:
        return kd_sum
    return (1 - alpha) * ce_sum + alpha * kd_sum
