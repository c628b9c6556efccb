"""The heavy-tail Poisson row (Geiping et al. 2025, "Huginn"; docs/methods.md): W_proj without
the gate, a random initial state and depths r = Poisson(tau) + 1 with tau log-normal.

Its two parts: the random initial state (`RandomInitialState`, initial_state = "random") and
the depth law (`HeavyTailPoisson`, depth_sampling = "poisson_lognormal"); W_proj is the GRT's
own (grt_titan/model/recurrence.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import nn

from ..depth_law import DepthLaw
from ..part import Bad, JobSettings, Part, tensor_parallel_problems
from ..settings import setting


@dataclass
class PoissonSettings:
    """The heavy-tail Poisson row's `[grt]` settings: a base class of `GRTModelArgs`
    (grt_titan/model/args.py)."""

    initial_state_std: float = setting(0.02, "Std of the random initial state (default 0.02, cut at 3 std).", hf=True)
    depth_mean: float | None = setting(
        None,
        """poisson_lognormal depth sampling: the mean training depth E[r]; default the uniform
        sampler's (r_min + R) / 2, so both spend the same expected compute.""",
    )


def eval_initial_state(seed: int, max_seq_len: int, dim: int, std: float) -> torch.Tensor:
    """The eval-mode random initial state [max_seq_len, dim]: row s is position s's, the same
    for every sequence and every call (one CPU draw seeded by `seed`, always of the full
    length: a draw's prefix depends on its length)."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    state = torch.empty(max_seq_len, dim)
    return nn.init.trunc_normal_(state, std=std, a=-3 * std, b=3 * std, generator=generator)


class RandomState(nn.Module):
    """h_0 ~ TruncNormal(0, s^2) cut at 3 s, fresh per training forward (Huginn's "like-init").
    In eval mode one fixed draw per position (`eval_initial_state`), so eval forwards are
    deterministic and a cached decode step sees the state a full forward gives its position.
    No parameters, so no checkpoint keys."""

    def __init__(self, args):
        super().__init__()
        self.std = args.initial_state_std
        self.seed = args.depth_seed
        self.max_seq_len = args.max_seq_len
        self._eval_table: torch.Tensor | None = None  # cache of eval_initial_state

    def forward(self, h_pre: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        if not self.training:
            table = self._eval_table
            if table is None or table.device != h_pre.device or table.dtype != h_pre.dtype:
                table = eval_initial_state(self.seed, self.max_seq_len, h_pre.shape[-1], self.std)
                self._eval_table = table = table.to(device=h_pre.device, dtype=h_pre.dtype)
            return table[: h_pre.shape[-2]].expand_as(h_pre).clone()
        std = self.std
        return nn.init.trunc_normal_(torch.empty_like(h_pre), std=std, a=-3 * std, b=3 * std, generator=generator)

    def init_weights(self) -> None:
        """Nothing to initialise (no parameters)."""


class RandomInitialState(Part):
    """initial_state = "random": h_0 from `RandomState`, not the prelude's output."""

    key, choice, module_name = "initial_state", "random", "random_state"

    def describe(self, args) -> str:
        return f"initial state h_0 ~ TruncNormal(0, {args.initial_state_std:g}^2), not the prelude's output"

    def check(self, args, bad: Bad) -> None:
        if args.initial_state_std <= 0:
            raise bad("initial_state_std", args.initial_state_std, "must be > 0")

    def job_problems(self, job: JobSettings, args) -> list[str]:
        return tensor_parallel_problems(
            job,
            "[grt] initial_state = 'random' does not support [parallelism] tensor_parallel_degree = {tp}: "
            "the eval-mode state is drawn per position of the whole sequence, which tensor parallelism "
            "shards; allowed: tensor_parallel_degree = 1 (FSDP/HSDP)",
        )

    def build(self, args) -> RandomState:
        return RandomState(args)

    def initial_state(self, loop: nn.Module, h_pre: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        return loop.random_state(h_pre, generator)


class HeavyTailPoisson(DepthLaw):
    """Huginn's law (Geiping et al. 2025); `depth_mean` sets E[r], default the uniform
    sampler's (r_min + R) / 2, so both spend the same expected compute."""

    choice = "poisson_lognormal"

    def mean_depth(self, args) -> float:
        return super().mean_depth(args) if args.depth_mean is None else args.depth_mean

    def law(self, args) -> str:
        return f"training depths r ~ Poisson(tau) + 1, tau log-normal, E[r] = {self.mean_depth(args):g}"

    def draw(self, seed: int, low: int, high: int, mean: float) -> int:
        return heavy_tail_depth(np.random.default_rng(seed), mean)

    def expected(self, args, count: Callable[[float], float], affine_from: int) -> float:
        """The law is unbounded; the count is affine from r = k on, so the exact sum over
        P(r = j), j < k, plus that line at the mean of the rest (E[r] known)."""
        k, mean = affine_from, self.mean_depth(args)
        head = heavy_tail_depth_probabilities(mean, k)  # P(r = j), j = 1..k-1
        counts = [count(j) for j in range(1, k + 2)]  # r = 1..k+1
        slope = counts[k] - counts[k - 1]  # per step from r = k on
        tail_mass = 1.0 - sum(head)
        tail_mean_minus_k = mean - sum(j * p for j, p in enumerate(head, 1)) - k * tail_mass
        return sum(f * p for f, p in zip(counts, head)) + tail_mass * counts[k - 1] + slope * tail_mean_minus_k

    ramps = "the mean depth"

    def scheduled(self, low: int, high: int, mean: float, fraction: float) -> tuple[int, int, float]:
        """The mean rises from r_min to E[r] (`depth_mean`); the law stays unbounded."""
        if fraction >= 1.0:
            return low, high, mean
        return low, high, low + (mean - low) * fraction

    def check(self, args, bad: Bad) -> None:
        super().check(args, bad)
        if args.depth_mean is not None and args.depth_mean < 1:
            raise bad("depth_mean", args.depth_mean, "must be >= 1 (the Poisson depth is at least 1)")
        if args.depth_mean is not None and args.depth_sampling != self.choice:
            raise bad("depth_mean", args.depth_mean, "is used by depth_sampling = 'poisson_lognormal' only")
        if (
            args.depth_curriculum_steps
            and args.depth_sampling == self.choice
            and self.mean_depth(args) < args.min_recurrences
        ):
            raise bad(
                "depth_mean",
                args.depth_mean,
                f"the depth curriculum ramps the mean up from min_recurrences = {args.min_recurrences}; "
                "allowed: >= min_recurrences",
            )


def heavy_tail_depth(rng: np.random.Generator, mean: float, sigma: float = 0.5) -> int:
    """Geiping et al. 2025 (arXiv 2502.05171, sec. 3.3): r = Poisson(tau) + 1 with
    tau ~ LogNormal(log(mean - 1) - sigma^2 / 2, sigma), so E[r] = mean, r >= 1, and the
    tail is heavy (mean 5.5: P(r > 2 mean) ~ 7%)."""
    rate_mean = mean - 1.0
    if rate_mean <= 0:
        return 1
    rate = rng.lognormal(math.log(rate_mean) - sigma * sigma / 2, sigma)
    return int(rng.poisson(rate)) + 1


def heavy_tail_depth_probabilities(mean: float, below: int, sigma: float = 0.5) -> list[float]:
    """P(r = j) for j = 1..below-1 of `heavy_tail_depth`'s r (the FLOP expectation needs the
    head of the distribution only: `HeavyTailPoisson.expected`).

    P(r = j) = E_tau[Poisson(j - 1; tau)], the mean over the log-normal tau by 80-point
    Gauss-Hermite quadrature in log tau (the integrand is smooth: exact to ~1e-12).
    """
    rate_mean = mean - 1.0
    if rate_mean <= 0:  # r = 1 always
        return [1.0 if j == 1 else 0.0 for j in range(1, below)]
    nodes, weights = np.polynomial.hermite.hermgauss(80)
    log_rate = math.log(rate_mean) - sigma * sigma / 2 + sigma * math.sqrt(2.0) * nodes
    rate = np.exp(log_rate)
    weights = weights / math.sqrt(math.pi)
    return [float(np.sum(weights * np.exp(-rate + (j - 1) * log_rate - math.lgamma(j)))) for j in range(1, below)]


# What the package reads of this method (grt_titan/model/methods/__init__.py, `MODULES`): its
# parts, in the order their rules are checked, and its settings, a base class of the args.
PARTS = (
    RandomInitialState(),  # initial_state = "random"
    HeavyTailPoisson(),  # depth_sampling = "poisson_lognormal"
)
SETTINGS = PoissonSettings
