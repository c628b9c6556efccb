"""The heavy-tail depth law of the Poisson baseline (Geiping et al. 2025): its sampler, which
the recurrence's DepthSampler draws from, and its probabilities, which the args' FLOP
expectation sums over. A leaf: both sides import it.
"""

from __future__ import annotations

import math

import numpy as np


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
    head of the distribution only: GRTModelArgs.expected_train_flops_per_token).

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
