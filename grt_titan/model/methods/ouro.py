"""Ouro's learned exit distribution over recurrence steps (Zhu et al. 2025, arXiv 2510.25741).

`objective = "exit_distribution"` reads every recurrence step out, as Ouro supervises every
loop iteration, and learns where each token should stop:

    hidden_t = norm(coda(h_t))                       the tensor the LM head reads at step t
    lambda_t = sigmoid(exit_gate(hidden_t))          one Linear(d, 1) with bias, shared by steps
    p(t | x) = lambda_t prod_{j<t} (1 - lambda_j)    t < T
    p(T | x) = prod_{j<T} (1 - lambda_j)             the last step takes the remaining mass
    loss     = sum_tokens [ sum_t p(t|x) CE_t  -  beta H(p(.|x)) ]

Inference (eval mode) exits each token at the first step whose cumulative exit probability
reaches `exit_threshold` q (Ouro's Q-exit), else at the last step; q = 1 is the last step.

Everything here is computed from the gate logits in log space: log p_t = logsigmoid(z_t) +
sum_{j<t} logsigmoid(-z_j), so a saturated gate gives p = 0 and an entropy term of exactly 0
instead of 0 * log 0. The loss itself is summed by grt_titan/components/loss.py from the
`TrainingOutput` built here. See docs/ouro.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from ..blocks.init import trunc_normal_
from ..flops import block_flops
from ..part import Bad, JobSettings, Part, TrainingOutput, tensor_parallel_problems
from ..settings import setting

if TYPE_CHECKING:  # the args have this module's settings among their bases
    from ..args import GRTModelArgs


@dataclass
class OuroSettings:
    """Ouro's `[grt]` settings: a base class of `GRTModelArgs` (grt_titan/model/args.py)."""

    exit_entropy_weight: float = setting(
        0.05,
        "Ouro: beta, the weight of the exit distribution's entropy (default 0.05).",
    )
    exit_threshold: float = setting(
        1.0,
        """Ouro inference: exit at the first step whose cumulative exit probability >= this
        (default 1.0: run every step).""",
        hf=True,
    )


class ExitGate(nn.Linear):
    """Ouro's `early_exit_gate`: Linear(d, 1) with bias on a step's normed final hidden state."""

    def __init__(self, args: GRTModelArgs):
        super().__init__(args.dim, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Gate logits z [..., S] (float32) of hidden [..., S, d]; lambda = sigmoid(z)."""
        return super().forward(hidden).squeeze(-1).float()

    def init_weights(self) -> None:
        # As the rest of the model (Ouro: normal(0, initializer_range), bias 0): lambda ~ 0.5.
        trunc_normal_(self.weight, std=0.02)
        nn.init.zeros_(self.bias)


def exit_log_probs(gate_logits: torch.Tensor) -> torch.Tensor:
    """log p(t | x) [T, ...] from gate logits z [T, ...]; the last step's lambda is unused."""
    log_exit = F.logsigmoid(gate_logits)  # log lambda_t
    log_stay = F.logsigmoid(-gate_logits)  # log (1 - lambda_t)
    # log prod_{j<t} (1 - lambda_j): 0 for t = 1.
    log_survive = torch.cumsum(log_stay, dim=0) - log_stay
    log_p = log_exit + log_survive
    return torch.cat([log_p[:-1], log_survive[-1:]], dim=0)


def exit_entropy(log_p: torch.Tensor) -> torch.Tensor:
    """H(p(.|x)) = -sum_t p log p per token [...]; 0 where p is one-hot."""
    return -(log_p.exp() * log_p).sum(dim=0)


def q_exit_steps(gate_logits: torch.Tensor, threshold: float) -> torch.Tensor:
    """0-based exit step per token: the first t with CDF(t) = 1 - prod_{j<=t}(1 - lambda_j)
    >= threshold, else the last step (always the last for threshold 1)."""
    survive = torch.cumsum(F.logsigmoid(-gate_logits), dim=0).exp()  # 1 - CDF(t)
    # threshold 1: never early, even where a saturated gate makes CDF(t < T) = 1 in floats.
    stop = survive <= 1.0 - threshold if threshold < 1 else torch.zeros_like(survive, dtype=torch.bool)
    stop[-1] = True  # the last step takes the remaining mass: CDF(T) = 1
    # argmax returns the first maximal index: the first step that stops.
    return stop.to(torch.int8).argmax(dim=0)


def exit_forward(model: nn.Module, states: list[torch.Tensor]) -> torch.Tensor | TrainingOutput:
    """Readout of the per-step states h_1..h_T [B, S, d] of one forward of `model` (a
    GRTModel: its final_hidden, exit_gate and output).

    Training: a `TrainingOutput` with every step's logits [T, B, S, V], the exit
    distribution [T, B, S] and -beta x the summed entropy. Eval: plain logits [B, S, V] of
    each token's Q-exit step (`q_exit`).
    """
    args = model.model_args
    if not model.training:
        return q_exit(model, states, args.exit_threshold)[0]
    hidden, gate_logits = step_readouts(model, states)
    log_p = exit_log_probs(gate_logits)
    step_logits = model.output(hidden).unflatten(0, (len(states), states[0].shape[0]))
    return TrainingOutput(
        logits=step_logits[-1],
        step_logits=step_logits,
        step_weights=log_p.exp(),
        aux_loss_sum=-args.exit_entropy_weight * exit_entropy(log_p).sum(),
    )


def q_exit(model: nn.Module, states: list[torch.Tensor], threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [B, S, V] of each token's Q-exit step at `threshold`, that step [B, S], 1-based):
    the LM head runs once, on the gathered hidden states. Its own function so that a benchmark
    can count the steps each token took (benchmarks/depth_pays_bench.py)."""
    hidden, gate_logits = step_readouts(model, states)
    exit_step = q_exit_steps(gate_logits, threshold)  # [B, S], 0-based
    per_step = hidden.unflatten(0, (len(states), states[0].shape[0]))
    index = exit_step[None, :, :, None].expand(1, *per_step.shape[1:])
    return model.output(per_step.gather(0, index).squeeze(0)), exit_step + 1


def step_readouts(model: nn.Module, states: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(every step's normed final hidden state [T * B, S, d], the exit gate's logits [T, B, S])."""
    # One [T * B, S, d] batch through the norm, gate and head: the sequence stays dim 1, as
    # every block and the head expect.
    hidden = torch.cat([model.final_hidden(h) for h in states], dim=0)
    gate_logits = model.exit_gate(hidden)
    # Tensor parallel: the gate's logits are a sequence-sharded DTensor. Gather these few
    # values; every rank then computes the whole exit distribution in plain tensors.
    full_tensor = getattr(gate_logits, "full_tensor", None)
    if full_tensor is not None:
        gate_logits = full_tensor()
    return hidden, gate_logits.unflatten(0, (len(states), states[0].shape[0]))  # [T, B, S]


class ExitDistribution(Part):
    """objective = "exit_distribution" (Ouro): the `ExitGate` on every step's readout, the
    expected loss over the exit distribution, Q-exit at inference."""

    key, choice = "objective", "exit_distribution"
    reads_every_step = True
    float8_skip = ("exit_gate",)  # Linear(d, 1): one output

    def validate(self, args: GRTModelArgs, bad: Bad) -> None:
        if args.objective == self.choice and not args.is_recurrent:
            raise bad(
                "objective", args.objective, "needs a recurrent flavor (n_core_layers >= 1); allowed for dense: 'final'"
            )
        super().validate(args, bad)

    def check(self, args: GRTModelArgs, bad: Bad) -> None:
        if args.exit_entropy_weight < 0:
            raise bad("exit_entropy_weight", args.exit_entropy_weight, "must be >= 0")
        if not 0.0 < args.exit_threshold <= 1.0:
            raise bad("exit_threshold", args.exit_threshold, "must be in (0, 1]")
        if args.exit_threshold != 1.0 and args.objective != self.choice:
            raise bad(
                "exit_threshold",
                args.exit_threshold,
                "is used by objective = 'exit_distribution' only (no exit gate otherwise)",
            )
        if args.objective == self.choice and args.router != "none":
            raise bad(
                "objective", args.objective, f"cannot be combined with router = {args.router!r} (one method per run)"
            )

    def describe(self, args: GRTModelArgs) -> str:
        return (
            "exit (Ouro): each token exits at the first step whose cumulative exit probability reaches "
            f"`exit_threshold` = {args.exit_threshold:g} (1 = the last step); below 1 all r steps run, "
            "each is read out through coda + norm, and the KV cache keeps the coda per step "
            "(`per_step` only)"
        )

    def job_problems(self, job: JobSettings, args: GRTModelArgs) -> list[str]:
        if args.exit_threshold >= 1:
            return []  # the last step: no per-token exit
        return tensor_parallel_problems(
            job,
            f"[grt] exit_threshold = {args.exit_threshold} is not supported with [parallelism] "
            "tensor_parallel_degree = {tp} (Ouro's per-token exit gathers over sequence shards); "
            "allowed: 1.0 (the last step) or tensor_parallel_degree = 1",
        )

    def build(self, args: GRTModelArgs) -> ExitGate:
        return ExitGate(args)

    def extra_flops(self, args: GRTModelArgs, seq_len: int, depth: float, training: bool) -> float:
        """The exit gate on every step (2 d each) and the readouts of steps 1..r-1 (coda:
        c (24 d^2 + 4 S d) each; training also the LM head, 2 d V each). Eval with
        exit_threshold = 1 is the plain forward (no extra)."""
        r = depth
        if r <= 0 or (not training and args.exit_threshold >= 1):
            return 0.0
        extra = (r - 1) * args.n_coda_layers * block_flops(args, seq_len) + r * 2 * args.dim
        if training:
            extra += (r - 1) * 2 * args.dim * args.padded_vocab_size
        return extra


# What the package reads of this method (grt_titan/model/methods/__init__.py, `MODULES`): its
# parts, in the order their rules are checked, and its settings, a base class of the args.
PARTS = (
    ExitDistribution(),  # objective = "exit_distribution"
)
SETTINGS = OuroSettings
