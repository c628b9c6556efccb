"""Knowledge distillation's loss: plain torch, on full or vocabulary-sharded logits.

The student's loss per token is

    (1 - alpha) CE + alpha T^2 KL(softmax(teacher / T) || softmax(student / T))

(Hinton et al. 2015: T^2 keeps the KD gradient's magnitude independent of T). Every term is
a SUM over the tokens whose label is not ignored, as torchtitan's cross-entropy is, so the
trainer's division by the global token count averages the KD term exactly like the CE.

With a = teacher / T, b = student / T, p = softmax(a), q = softmax(b), per token,

    KL = sum_v p_v (log p_v - log q_v) = sum_v p_v (log p_v - b_v) + logsumexp(b)

(sum_v p_v = 1), and its gradient to the student's logits is (q - p) / T, none to the
teacher's. `kl_per_token` computes both in one pass over the rows, in float32 (or the logits'
wider dtype), through shifted exponentials: with m_a, m_b the rows' maxima, e_a = exp(a - m_a),
e_b = exp(b - m_b), S_a = sum_v e_a, S_b = sum_v e_b (so p = e_a / S_a, q = e_b / S_b and
logsumexp(a) = m_a + log S_a),

    KL = (1 / S_a) sum_v e_a,v ((a_v - m_a) - (b_v - m_b)) - log S_a + log S_b,

one exponential per logit and no logarithm but the per-token ones. Only the gradient (q - p) / T
is kept for the backward, which multiplies it by the incoming per-token gradient.

Under tensor parallel with loss parallel the logits are split over the vocabulary (each
rank holds a column block). The KL is then computed without gathering a row: the maxima are
all-reduced with MAX, the three per-token sums (S_a, S_b and the weighted sum over e_a) with SUM, so
only per-token scalars cross ranks, as in torch's sharded cross-entropy; each sum is then the
full row's and the formula above the full row's KL. Gradients: the loss downstream is
replicated on every rank of the group, so each rank differentiates its own columns, with the
full rows' p and q: (q_v - p_v) / T for its columns v.

Nothing here knows torchtitan; `group` is any process group over which the last dimension
of the logits is sharded (None: the full vocabulary is here).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

IGNORE_INDEX = -100  # torchtitan's (components/loss.py): labels never scored


# Rows are processed in blocks of about this many elements (of this rank's columns): the
# block's temporaries (two besides the saved gradient's rows, allocated once and reused by
# every block) then stay in the CPU's cache. One thread of an AMD EPYC, 8 x 64 x 50304: 2^16
# to 2^20 alike, 2^22 a third slower, all rows in one block 70% slower. On an accelerator the
# blocks only bound the temporaries' memory (2 x 4 bytes x 2^26 = 512 MiB), at about ten
# kernels and, under loss parallel, one all-reduce per block.
_CPU_BLOCK_ELEMENTS = 1 << 18
_DEVICE_BLOCK_ELEMENTS = 1 << 26


def _block_rows(n_rows: int, width: int, device: torch.device) -> int:
    elements = _CPU_BLOCK_ELEMENTS if device.type == "cpu" else _DEVICE_BLOCK_ELEMENTS
    return max(1, min(n_rows, elements // max(width, 1)))


def _scaled(x: torch.Tensor, temperature: float, out: torch.Tensor) -> torch.Tensor:
    """x / T in out's dtype, written into `out` (the logits converted first: a division in
    bfloat16 would round)."""
    if x.dtype == out.dtype:
        return torch.div(x, temperature, out=out)
    return out.copy_(x).div_(temperature)


class _KLPerToken(torch.autograd.Function):
    """KL(softmax(teacher / T) || softmax(student / T)) per token, [..., V] -> [...], on full
    rows (group None) or on this rank's vocabulary columns; the module docstring has the math.

    Saved for the backward: the gradient itself, (q - p) / T on this rank's columns, one
    tensor of the logits' size in the computation's dtype (float32: 4 bytes an element),
    written during the forward's pass over the rows from the exponentials the KL takes anyway.
    The backward is then one multiplication by the incoming per-token gradient, and neither
    logits tensor is kept (the trainer frees both before its backward). Saving the inputs
    instead (both logits and the two per-token log-sum-exps) would keep 2 + 2 bytes an element
    for bfloat16 logits, 4 + 4 for float32, and the backward would read both again and take
    both exponentials again (measured no faster on CPU: it only trades the time to allocate the
    saved gradient for the second exponentials); saving p would cost the gradient's memory and
    still leave q to recompute."""

    @staticmethod
    def forward(ctx, student: torch.Tensor, teacher: torch.Tensor, temperature: float, group) -> torch.Tensor:
        dtype = torch.promote_types(student.dtype, torch.float32)
        lead, width = student.shape[:-1], student.shape[-1]
        s, t = student.reshape(-1, width), teacher.reshape(-1, width)
        n = s.shape[0]
        # The rows' maxima from the logits as given: x -> float(x) / T is monotone, so this is
        # exactly the maximum of a (of b); the maxima only shift the exponentials.
        maxima = torch.stack([t.amax(dim=-1).to(dtype), s.amax(dim=-1).to(dtype)]).div_(temperature)
        widest = width
        if group is not None:
            # The widest rank's column count travels with the maxima: every rank then cuts the
            # rows into the same blocks, one all-reduce per block, even for uneven shards.
            flat = torch.cat([maxima.flatten(), maxima.new_tensor([width])])
            dist.all_reduce(flat, op=dist.ReduceOp.MAX, group=group)
            maxima, widest = flat[:-1].view(2, n), int(flat[-1].item())
        m_a, m_b = maxima.unsqueeze(-1)
        need_grad = ctx.needs_input_grad[0]
        grad = torch.empty((n, width), dtype=dtype, device=s.device) if need_grad else None
        # Per token: S_a, S_b and sum_v e_a,v ((a_v - m_a) - (b_v - m_b)), this rank's columns.
        sums = torch.empty((n, 3), dtype=dtype, device=s.device)
        step = _block_rows(n, widest, s.device)
        # The block's temporaries, reused by every block: e_a, the difference, and e_b where
        # there is no gradient to write it into.
        a_buf, d_buf = (torch.empty((step, width), dtype=dtype, device=s.device) for _ in range(2))
        b_buf = torch.empty_like(a_buf) if grad is None else None
        for i in range(0, n, step):
            rows = slice(i, min(n, i + step))
            k = rows.stop - i
            a = _scaled(t[rows], temperature, a_buf[:k]).sub_(m_a[rows])  # a - m_a
            b = _scaled(s[rows], temperature, b_buf[:k] if grad is None else grad[rows]).sub_(m_b[rows])
            diff = torch.sub(a, b, out=d_buf[:k])  # (a - m_a) - (b - m_b)
            e_a, e_b = a.exp_(), b.exp_()
            block = sums[rows]
            torch.sum(e_a, dim=-1, out=block[:, 0])
            torch.sum(e_b, dim=-1, out=block[:, 1])
            torch.sum(diff.mul_(e_a), dim=-1, out=block[:, 2])
            if group is not None:
                dist.all_reduce(block, op=dist.ReduceOp.SUM, group=group)
            if grad is not None:  # e_b / (T S_b) - e_a / (T S_a), in the gradient's rows
                coef = block[:, :2].mul(temperature).reciprocal_()
                e_b.mul_(coef[:, 1:]).addcmul_(e_a, coef[:, :1], value=-1)
        s_a, s_b, weighted = sums.unbind(-1)
        kl = weighted / s_a + (s_b.log() - s_a.log())
        kl = kl.view(lead)
        if grad is None:  # no gradient asked for the student, and the teacher never gets one
            ctx.mark_non_differentiable(kl)
        else:
            ctx.save_for_backward(grad)
            ctx.student_shape, ctx.student_dtype = student.shape, student.dtype
        return kl

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_kl: torch.Tensor):
        (grad,) = ctx.saved_tensors
        # Not in place: the saved gradient must survive a backward with retain_graph (and
        # gradcheck); the product is written straight in the student's dtype.
        out = torch.empty(ctx.student_shape, dtype=ctx.student_dtype, device=grad.device)
        torch.mul(grad, grad_kl.reshape(-1, 1), out=out.view(grad.shape))
        return out, None, None, None


def kl_per_token(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0, group=None
) -> torch.Tensor:
    """KL(softmax(teacher / T) || softmax(student / T)) per token, in float32 (or the logits'
    wider dtype): [..., V] -> [...].

    `group`: the process group the vocabulary (last dimension) is split over, each rank
    passing its own columns of both logits; None for full rows. Gradients flow to the
    student only."""
    return _KLPerToken.apply(student_logits, teacher_logits, temperature, group)


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
