"""Ouro's exit (`objective = "exit_distribution"`) in the GRT's transformers model: the exit
gate, the Q-exit rule and the per-token readout of every step.

    hidden_t = norm(coda(h_t))                    every step read out (exit_threshold q < 1)
    lambda_t = sigmoid(exit_gate(hidden_t))
    exit step of a token = the first t with 1 - prod_{j<=t} (1 - lambda_j) >= q, else r

Remote code: imports torch and transformers only, exported next to modeling_grt.py. The
functions marked `# Copied from grt_titan.model.<module>.<name>` are the training model's,
character for character (tests/hf/test_hf_copies.py compares the sources).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# The annotations name transformers' base class, not GRTConfig: configuration_grt.py imports
# the parts, which import this file (an import circle).
from transformers import PretrainedConfig

# The KV-cache strategies the per-token exit (exit_threshold < 1) runs exactly: every step's
# coda needs that step's K/V of the earlier tokens (`GRTCache`).
EXIT_KV_CACHE_STRATEGIES = ("per_step",)


class ExitGate(nn.Linear):
    """Ouro's `early_exit_gate`: Linear(d, 1) with bias on a step's normed final hidden state
    (`model.exit_gate.{weight,bias}`)."""

    def __init__(self, config: PretrainedConfig):
        super().__init__(config.hidden_size, 1)

    # Copied from grt_titan.model.methods.ouro.ExitGate.forward
    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Gate logits z [..., S] (float32) of hidden [..., S, d]; lambda = sigmoid(z)."""
        return super().forward(hidden).squeeze(-1).float()


# Copied from grt_titan.model.methods.ouro.q_exit_steps
def q_exit_steps(gate_logits: torch.Tensor, threshold: float) -> torch.Tensor:
    """0-based exit step per token: the first t with CDF(t) = 1 - prod_{j<=t}(1 - lambda_j)
    >= threshold, else the last step (always the last for threshold 1)."""
    survive = torch.cumsum(F.logsigmoid(-gate_logits), dim=0).exp()  # 1 - CDF(t)
    # threshold 1: never early, even where a saturated gate makes CDF(t < T) = 1 in floats.
    stop = survive <= 1.0 - threshold if threshold < 1 else torch.zeros_like(survive, dtype=torch.bool)
    stop[-1] = True  # the last step takes the remaining mass: CDF(T) = 1
    # argmax returns the first maximal index: the first step that stops.
    return stop.to(torch.int8).argmax(dim=0)


def exit_readout(coda, norm, exit_gate, threshold, states, rope, mask, kv, keep_coda=False):
    """Ouro's Q-exit over the states h_1..h_r: every step's coda (with its own step's cache
    slots, `kv(kind, index, step)`) and final norm, the exit gate, and each token's exit
    step gathered.

    Returns the gathered hidden `[B, T, d]`, the exit step per token `[B, T]` (1-based),
    the r normed readouts, and (`keep_coda`) each coda block's output at the exit steps.
    All r steps run (as in Ouro's released code): no compute is saved, only the choice
    is per token.
    """
    readouts, coda_outputs = [], []
    for step, h in enumerate(states):
        per_block = []
        for i, block in enumerate(coda):
            h = block(h, rope, mask, kv("coda", i, step))
            if keep_coda:
                per_block.append(h)
        readouts.append(norm(h))
        coda_outputs.append(per_block)
    hidden = torch.stack(readouts)  # [r, B, T, d]
    exit_index = q_exit_steps(exit_gate(hidden), threshold)

    def gather(per_step: torch.Tensor) -> torch.Tensor:
        index = exit_index[None, :, :, None].expand(1, *per_step.shape[1:])
        return per_step.gather(0, index).squeeze(0)

    gathered_coda = [gather(torch.stack(blocks)) for blocks in zip(*coda_outputs)]  # [] unless keep_coda
    return gather(hidden), exit_index + 1, readouts, gathered_coda
