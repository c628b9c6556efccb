"""The depth laws, `[grt] depth_sampling` (docs/architecture.md, "Depth sampling"): the
training depth r of every forward, its mean E[r] and the expectation of a count over r (the
start-up FLOPs, grt_titan/model/flops.py). The recurrence's DepthSampler draws from the law
of its args (grt_titan/model/recurrence.py).

    uniform             r ~ Uniform{r_min..R}                   (GRT)
    fixed               r = R                                   (ablations, RRT, Ouro, MoR)
    poisson_lognormal   r = Poisson(tau) + 1, tau log-normal    (heavy-tail Poisson: methods/poisson.py)

The depth curriculum (`[grt] depth_curriculum_steps`, McLeish et al. 2025) ramps each law over
the first N optimizer steps: uniform's maximum, fixed's depth and Poisson's mean rise from
r_min to their configured value (`DepthLaw.scheduled`, `curriculum_fraction`); a forward's
law is a function of its index, so the depth stays a pure function of (seed, index).

A leaf: the args and the recurrence both read it.
"""

from __future__ import annotations

import math
import random
from typing import Callable

from .part import Bad, Part

# The ramp's shapes: the share of the ramp done at progress p = step / N (McLeish et al. 2025's
# code offers these two warm-ups of its mean recurrence: transformers' warmup_stable_decay).
CURRICULUM_SHAPES: dict[str, Callable[[float], float]] = {
    "linear": lambda p: p,
    "1-sqrt": lambda p: 1.0 - math.sqrt(1.0 - p),
}


def curriculum_fraction(shape: str, step: int, steps: int) -> float:
    """Share of the depth ramp done at optimizer step `step` (0-based) of a `steps`-step ramp:
    shape(step / steps), 1 from step `steps` on and without a ramp (`steps` = 0)."""
    if steps <= 0 or step >= steps:
        return 1.0
    return CURRICULUM_SHAPES[shape](step / steps)


def ramp_bound(start: int, end: int, fraction: float) -> int:
    """An integer depth bound `fraction` of the way from `start` to `end`, rounded up as
    McLeish et al. round their mean recurrence (1e-9: the float error of an exact integer)."""
    return min(end, max(start, math.ceil(start + (end - start) * fraction - 1e-9)))


class DepthLaw(Part):
    """One choice of `depth_sampling`: how r is drawn, its mean and expectations over it."""

    key = "depth_sampling"
    # What the depth curriculum ramps (`scheduled`), for the start-up line: uniform's maximum
    # and fixed's depth (both `high`, from r_min up to R); HeavyTailPoisson ramps its mean.
    ramps = "the largest depth"

    def mean_depth(self, args) -> float:
        """E[r] of the law on the recurrent `args`."""
        return (args.min_recurrences + args.num_recurrences) / 2

    def draw(self, seed: int, low: int, high: int, mean: float) -> int:
        """The depth a forward draws from the generator seeded by `seed` (r_min, R, E[r])."""
        raise NotImplementedError

    def describe(self, args) -> str:
        curriculum = (
            f", {self.ramps} ramped from r_min over the first {args.depth_curriculum_steps} steps"
            if args.depth_curriculum_steps
            else ""
        )
        return f"{self.law(args)}, sampling `{self.choice}`{curriculum}"

    def law(self, args) -> str:
        """The training depth distribution, in words."""
        return f"training depths r ~ Uniform{{{args.min_recurrences}..{args.num_recurrences}}}"

    def expected(self, args, count: Callable[[float], float], affine_from: int) -> float:
        """E_r[count(r)]; `count` is affine in r from r = `affine_from` on."""
        return count(self.mean_depth(args))

    def scheduled(self, low: int, high: int, mean: float, fraction: float) -> tuple[int, int, float]:
        """The law's (r_min, R, E[r]) `fraction` of the way through the depth curriculum:
        here the largest depth rises from r_min to R (uniform: Uniform{r_min..high}; fixed:
        r = high)."""
        if fraction >= 1.0:
            return low, high, mean
        return low, ramp_bound(low, high, fraction), mean

    def validate(self, args, bad: Bad) -> None:
        """The curriculum's fields too, on a dense model (which has no depth to ramp)."""
        if not args.is_recurrent and args.depth_curriculum_steps != 0:
            raise bad(
                "depth_curriculum_steps",
                args.depth_curriculum_steps,
                "a dense model (n_core_layers = 0) has no depth to ramp; allowed: 0",
            )
        super().validate(args, bad)

    def check(self, args, bad: Bad) -> None:
        if args.depth_curriculum_steps < 0:
            raise bad("depth_curriculum_steps", args.depth_curriculum_steps, "must be >= 0 (0: no depth curriculum)")
        if args.forwards_per_step < 1:
            raise bad(
                "forwards_per_step", args.forwards_per_step, "must be >= 1 (training forwards per optimizer step)"
            )
        if args.depth_curriculum_steps and args.router != "none":
            raise bad(
                "depth_curriculum_steps",
                args.depth_curriculum_steps,
                f"router = {args.router!r} routes per step of the fixed depth R (its capacities and "
                "balancing assume every step runs); allowed: 0",
            )


class UniformDepth(DepthLaw):
    choice = "uniform"

    def draw(self, seed: int, low: int, high: int, mean: float) -> int:
        return random.Random(seed).randint(low, high)

    def expected(self, args, count: Callable[[float], float], affine_from: int) -> float:
        depths = range(args.min_recurrences, args.num_recurrences + 1)
        return sum(count(r) for r in depths) / len(depths)


class FixedDepth(DepthLaw):
    choice = "fixed"
    ramps = "the depth"

    def law(self, args) -> str:
        return f"training depth r = R = {args.num_recurrences}"

    def mean_depth(self, args) -> float:
        return float(args.num_recurrences)

    def draw(self, seed: int, low: int, high: int, mean: float) -> int:
        return high


# The depth laws of the GRT and the fixed-depth baselines; heavy-tail Poisson's law is its
# method's (grt_titan/model/methods/poisson.py). The table of parts lists all three.
LAWS: tuple[DepthLaw, ...] = (UniformDepth(), FixedDepth())
