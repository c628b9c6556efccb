"""FLOPs per token: paper eq. 1 plus each active part's term (docs/architecture.md, "FLOPs").

    F(r) = (p + n r + c)(2W + 4 S d) + r 2 P + sum of the parts' extras + 2 d V

W is a block's matmul weights (12 d^2 for GPT-2), P the weights a step applies besides the
core (`Part.step_params`: W_proj 2 d^2 and the gate 3 d^2 for GRT, eq. 1's 10 d^2 FLOPs;
RRT's adapters), the extras what a part adds once per forward (`Part.extra_flops`: Ouro's
readouts, token choice's router), V the padded vocabulary. A part that routes the steps
(MoR, `Part.routed_step_flops`) replaces the n r blocks by its per-step counts. The training
count is torchtitan's convention, 3 F(r) (forward and backward), less the backward of the
steps that truncated backprop leaves out; the start-up value is its expectation over the
depth law (`DepthLaw.expected`, grt_titan/model/depth_law.py).

A leaf (no grt_titan import): `GRTModelArgs` delegates its FLOP methods here, as torchtitan's
llama3 args do to `get_dense_model_nparams_and_flops`; the parts come from `args.parts`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any


def block_matmul_params(args) -> int:
    """Weights of one block that take part in a matmul (eq. 1 counts 12 d^2 for GPT-2)."""
    d = args.dim
    if args.block_style == "gpt2":
        return 4 * d * d + 2 * d * args.ffn_hidden_dim  # 12 d^2 with the 4d MLP
    q_dim, kv_dim = args.n_heads * args.head_dim, (args.n_kv_heads or args.n_heads) * args.head_dim
    return 2 * d * q_dim + 2 * d * kv_dim + 3 * d * args.ffn_hidden_dim


def block_flops(args, seq_len: int) -> int:
    """Forward FLOPs per token of one block: its matmuls and the two attention matmuls 4 S d."""
    return 2 * block_matmul_params(args) + 4 * seq_len * args.n_heads * args.head_dim


def step_params(args) -> int:
    """Matmul weights one step applies besides the core, summed over the active parts."""
    return sum(part.step_params(args) for part in args.active_parts)


def routed_core_flops(args, seq_len: int, kept: list[float], routers: list[float]) -> list[float]:
    """The FLOPs per token of the sequence of routed steps: the core on the k_i tokens of step
    i, n [(k_i / S) 2W + 4 (k_i^2 / S) d], plus the step's router FLOPs (MoR's two routers)."""
    S, d, weights = seq_len, args.dim, block_matmul_params(args)
    return [
        args.n_core_layers * ((k / S) * 2 * weights + 4 * (k * k / S) * d) + router for k, router in zip(kept, routers)
    ]


def _routed_steps(args, seq_len: int, depth: int) -> list[float] | None:
    for part in args.active_parts:
        steps = part.routed_step_flops(args, seq_len, depth)
        if steps is not None:
            return steps
    return None


def forward_flops_per_token(args, seq_len: int, recurrences: float | None = None, training: bool = False) -> float:
    """F(r) at depth r (default E[r]; 0 for a dense model). `training`: the training forward,
    which differs for per-step readouts (Ouro)."""
    r = args.expected_recurrences if recurrences is None else recurrences
    if not args.is_recurrent:
        r = 0.0
    block = block_flops(args, seq_len)
    routed = _routed_steps(args, seq_len, round(r))
    if routed is None:
        blocks = args.n_prelude_layers + args.n_core_layers * r + args.n_coda_layers
        body = blocks * block + r * 2 * step_params(args)
    else:
        body = (args.n_prelude_layers + args.n_coda_layers) * block + sum(routed)
    extras = sum(part.extra_flops(args, seq_len, r, training) for part in args.active_parts)
    return body + extras + 2 * args.dim * args.padded_vocab_size


def readout_flops_per_token(args, seq_len: int) -> int:
    """One readout of a state: the coda blocks and the LM head, c block + 2 d V."""
    return args.n_coda_layers * block_flops(args, seq_len) + 2 * args.dim * args.padded_vocab_size


def realised_flops_per_token(args, seq_len: int, depths, readout_every_step: bool = False) -> float:
    """Mean forward FLOPs per token of tokens that ran the given depths (per-token halting:
    the model's `recurrence_depths`, padding's 0 left out by the caller): F at each depth,
    averaged over the tokens. `readout_every_step` (the halting rules that read each step's
    distribution: kl, entropy, argmax): a token of depth d also read out its d - 1 earlier
    steps, `readout_flops_per_token` each."""
    counts = Counter(int(depth) for depth in depths)
    if not counts:
        raise ValueError("realised_flops_per_token needs at least one token's depth")
    total = sum(counts.values())
    readout = readout_flops_per_token(args, seq_len) if readout_every_step else 0
    return (
        sum(
            n * (forward_flops_per_token(args, seq_len, depth) + max(depth - 1, 0) * readout)
            for depth, n in counts.items()
        )
        / total
    )


def train_flops_per_token(args, seq_len: int, recurrences: float | None = None) -> float:
    """Forward + backward = 3x the training forward (torchtitan's 6N per token); with
    `backprop_recurrences` = k, the r - k steps before the last k run forward only (2x their
    forward less): whole steps, or the first r - k routed steps on their tokens (a router that
    runs before the steps keeps its gradient and stays in)."""
    r = args.expected_recurrences if recurrences is None else recurrences
    flops = 3 * forward_flops_per_token(args, seq_len, r, training=True)
    k = args.backprop_recurrences
    if not args.is_recurrent or k is None or r <= k:
        return flops
    routed = _routed_steps(args, seq_len, round(r))
    if routed is not None:
        return flops - 2 * sum(routed[: round(r) - k])
    step = args.n_core_layers * block_flops(args, seq_len) + 2 * step_params(args)
    return flops - 2 * (r - k) * step  # no backward for untracked steps


def expected_train_flops_per_token(args, seq_len: int) -> float:
    """E_r[train_flops_per_token(S, r)] over the training depth law: what the logged MFU
    averages over the sampled depths (grt_titan/components/metrics.py). Not the count at
    E[r]: with truncated backprop it bends at r = k (at E[r] it overstates Poisson's, k = 8,
    by 3.0% at small scale, 0.8% at large)."""
    if not args.is_recurrent:
        return train_flops_per_token(args, seq_len)
    law = args.part("depth_sampling")
    k = args.backprop_recurrences or 1  # the count is affine in r from r = k on (from 1 without truncation)
    return law.expected(args, lambda r: train_flops_per_token(args, seq_len, r), affine_from=k)


def nparams_and_flops(args, model: Any, seq_len: int) -> tuple[int, int]:
    """Stored parameters (a tied weight once) and training FLOPs per token, the expectation
    over the depth law: torchtitan fixes this at start-up, and it is the long-run value of
    the logged per-interval mean."""
    nparams = sum(p.numel() for p in model.parameters())
    return nparams, int(expected_train_flops_per_token(args, seq_len))
