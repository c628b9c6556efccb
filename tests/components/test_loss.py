"""The training loss against a hand computation for each output type."""

import math

import torch

from grt_titan.components.loss import grt_loss
from grt_titan.model.part import TrainingOutput


def _ce_by_hand(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """-log softmax(logits)[label] per token, written out."""
    log_z = torch.log(torch.exp(logits).sum(-1))
    return log_z - logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def test_plain_logits_are_summed_cross_entropy():
    torch.manual_seed(0)
    logits, labels = torch.randn(2, 5, 7), torch.randint(0, 7, (2, 5))
    assert torch.allclose(grt_loss(logits, labels), _ce_by_hand(logits, labels).sum(), atol=1e-5)


def test_step_weighted_loss_and_aux_term():
    torch.manual_seed(1)
    steps, logits = 3, torch.randn(3, 2, 4, 6)
    labels = torch.randint(0, 6, (2, 4))
    weights = torch.softmax(torch.randn(3, 2, 4), dim=0)
    aux = torch.tensor(0.75)
    expected = sum((weights[t] * _ce_by_hand(logits[t], labels)).sum() for t in range(steps)) + 0.75
    got = grt_loss(TrainingOutput(logits[-1], logits, weights, aux), labels)
    assert math.isclose(got.item(), expected.item(), rel_tol=1e-5)
    # Without per-step readouts: CE on the final logits plus the auxiliary term.
    got = grt_loss(TrainingOutput(logits[-1], aux_loss_sum=aux), labels)
    assert math.isclose(got.item(), (_ce_by_hand(logits[-1], labels).sum() + 0.75).item(), rel_tol=1e-5)
