"""The recurrence of the GRT (paper section 3, listing A), in one place.

    for step in 1..r:
        h_tilde = W_proj [h + eps_x ; h_pre]                          (eq. 2)
        o       = core(h_tilde)                                        (eq. 3)
        g       = sigmoid(f_g([LN(h) ; LN(h_pre)]) / tau + eps_g)      (eq. 5)
        h       = g * h + (1 - g) * o                                  (eq. 4)

Each line is a named part (`GRTModelArgs`: injection, update, initial_state, depth_sampling,
step_adapter), so the paper's baselines and its figure-5 ablation rungs are choices of parts
of this one loop (docs/architecture.md, "Methods as parts"):

    injection = none       h_tilde = h + eps_x                  (no W_proj)
    update = overwrite     h       = o                          (no gate)
    initial_state = random h_0     = TruncNormal(0, s^2)        (heavy-tail Poisson)
    step_adapter = lora    core_t  = core + the step's LoRA     (RRT)
    SCSE (scse.py)         h_tilde = h - h*,  h = h + m s (o - h_tilde)  (injection, update =
                           deviation; initial_state = anchor: h*, h_0 from h_pre)

The steps read a source where the equations say h_pre: h_pre itself, or SCSE's anchor h*
(`Recurrence.start`), computed once per forward outside the step.

The parts of GRT itself (W_proj, the gate, the random initial state) are `Part`s here, beside
their math, with their rules and FLOPs terms; the step and the loop hold each slot's module as
the table of parts builds it (grt_titan/model/parts.py, docs/methods.md).

`RecurrenceStep` is one iteration with no randomness inside: the noise is drawn by the
eager loop in `Recurrence` and passed in, so a step is a pure function of its inputs.
That is what lets activation checkpointing recompute it exactly and lets torch.compile
build one graph that every step and every sampled depth reuses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from .args import GRTModelArgs
from .blocks import BlockStack
from .blocks.init import trunc_normal_
from .depth_law import curriculum_fraction
from .methods.mor import RoutedStep
from .part import Bad, JobSettings, Part, build_module, tensor_parallel_problems


class DepthSampler(nn.Module):
    """Training depth r for each forward, a pure function of (seed, forward index).

    The index lives in a persistent buffer, so it is saved in checkpoints and a resumed
    run continues the same sequence; every rank computes the same r with no
    communication and no rank-local RNG state. The depth curriculum keeps it so: the law's
    bounds at forward t are a function of t too (its step t // forwards_per_step).
    """

    def __init__(self, args: GRTModelArgs):
        super().__init__()
        self.min_recurrences = args.min_recurrences
        self.max_recurrences = args.num_recurrences
        self.law = args.part("depth_sampling")  # grt_titan/model/depth_law.py
        self.seed = args.depth_seed
        self.mean = args.expected_recurrences  # poisson_lognormal: E[r]
        self.curriculum_steps = args.depth_curriculum_steps  # 0: no curriculum
        self.curriculum_shape = args.depth_curriculum_shape
        self.forwards_per_step = args.forwards_per_step
        self.register_buffer("draws", torch.zeros((), dtype=torch.int64), persistent=True)
        self._draws: int | None = None  # host mirror of `draws`: no device sync per step
        self.history: list[int] = []  # depths sampled since the metrics last read them

    def law_at(self, index: int) -> tuple[int, int, float]:
        """(r_min, R, E[r]) of the law forward `index` draws from: the configured ones, or
        where the depth curriculum has ramped them by its optimizer step."""
        fraction = curriculum_fraction(self.curriculum_shape, self.step_of(index), self.curriculum_steps)
        return self.law.scheduled(self.min_recurrences, self.max_recurrences, self.mean, fraction)

    def step_of(self, index: int) -> int:
        """The optimizer step that training forward `index` belongs to (gradient accumulation
        runs `forwards_per_step` forwards per step)."""
        return index // self.forwards_per_step

    def depth_at(self, index: int) -> int:
        return self.law.draw(self.seed * 1_000_003 + index, *self.law_at(index))

    @property
    def forwards(self) -> int:
        """Training forwards sampled so far (the persistent `draws` counter)."""
        if self._draws is None:
            self._draws = int(self.draws.item())
        return self._draws

    def sample(self) -> int:
        depth = self.depth_at(self.forwards)
        self._draws += 1
        self.draws.fill_(self._draws)
        self.history.append(depth)
        return depth

    def reset(self) -> None:
        self.draws.zero_()
        self._draws = 0
        self.history.clear()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._draws = None  # re-read the restored counter on the next sample


class Gate(nn.Module):
    """g = sigmoid(f_g([LN(h); LN(h_pre)]) / tau + eps_g), f_g = Linear-SiLU-Linear."""

    def __init__(self, args: GRTModelArgs):
        super().__init__()
        hidden = args.gate_hidden_dim or args.dim
        self.state_norm = nn.LayerNorm(args.dim, eps=args.norm_eps)
        self.anchor_norm = nn.LayerNorm(args.dim, eps=args.norm_eps)
        self.w_in = nn.Linear(2 * args.dim, hidden)
        self.w_out = nn.Linear(hidden, args.dim)
        self.temperature = args.gate_temperature
        self.bias_init = args.gate_bias_init
        self.override = args.gate_override  # ablation: a constant gate, f_g unused

    def forward(self, h: torch.Tensor, h_pre: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        if self.override is not None:
            return torch.full_like(h, self.override)
        features = torch.cat([self.state_norm(h), self.anchor_norm(h_pre)], dim=-1)
        logits = self.w_out(F.silu(self.w_in(features))) / self.temperature
        if noise is not None:
            logits = logits + noise
        return torch.sigmoid(logits)

    def init_weights(self) -> None:
        self.state_norm.reset_parameters()
        self.anchor_norm.reset_parameters()
        trunc_normal_(self.w_in.weight, std=0.02)
        nn.init.zeros_(self.w_in.bias)
        trunc_normal_(self.w_out.weight, std=0.02)
        # +4: g ~ 0.98 at init, the recurrence starts as a near-identity (paper sec. 3).
        nn.init.constant_(self.w_out.bias, self.bias_init)


class ProjInjection(Part):
    """injection = "proj": the step's input is W_proj [h + eps_x ; h_pre] (eq. 2), a bias-free
    Linear(2d -> d); Huginn's adapter Linear(2d -> d) on [state ; prelude output] is the same map."""

    key, choice = "injection", "proj"

    def build(self, args: GRTModelArgs) -> nn.Linear:
        return nn.Linear(2 * args.dim, args.dim, bias=False)

    def describe(self, args: GRTModelArgs) -> str:
        return "each step's input is W_proj [h + noise ; h_pre] (eq. 2)"

    def step_params(self, args: GRTModelArgs) -> int:
        return 2 * args.dim * args.dim


class GateUpdate(Part):
    """update = "gate": h <- g h + (1 - g) o (eq. 4) with the `Gate` above."""

    key, choice = "update", "gate"

    def describe(self, args: GRTModelArgs) -> str:
        return "each step writes h <- g h + (1 - g) o through the learned elementwise gate (eq. 4)"

    def check(self, args: GRTModelArgs, bad: Bad) -> None:
        if args.gate_temperature <= 0:
            raise bad("gate_temperature", args.gate_temperature, "must be > 0")
        if args.gate_override is not None and not 0.0 <= args.gate_override <= 1.0:
            raise bad("gate_override", args.gate_override, "must be in [0, 1] or unset")
        if args.gate_override is not None and args.update != self.choice:
            raise bad(
                "gate_override", args.gate_override, f"needs update = 'gate' (update = {args.update!r} has no gate)"
            )

    def build(self, args: GRTModelArgs) -> Gate:
        return Gate(args)

    def step_params(self, args: GRTModelArgs) -> int:
        hidden = args.gate_hidden_dim or args.dim  # f_g: 2d x d_gate, d_gate x d
        return 2 * args.dim * hidden + hidden * args.dim


@dataclass
class StepRecord:
    """What one recurrence step did, handed to `Recurrence.observer` (metrics, analysis)."""

    index: int  # 1-based step number
    depth: int  # r of this forward
    state: torch.Tensor  # h before the step
    new_state: torch.Tensor  # h after the step
    gate: torch.Tensor | None  # g; None for update = overwrite (g = 0 everywhere)
    proposal: torch.Tensor  # o = core(h_tilde)


@dataclass
class RecurrenceOutput:
    """What `Recurrence.forward` returns, on every path (plain loop, routed, per-step readout),
    so that the model reads fields instead of testing types. A dataclass: FSDP2 finds the
    tensors of its fields for its pre-backward hooks (the recurrence is one FSDP unit)."""

    state: torch.Tensor  # h_r, the state after the last step (h_0 for r = 0)
    # h_1..h_r, only when asked (Ouro's per-step readouts); None otherwise.
    step_states: list[torch.Tensor] | None = None
    # MoR's router auxiliary loss, a sum over tokens; None without a router, in eval mode, or at weight 0.
    aux_loss_sum: torch.Tensor | None = None


class RecurrenceStep(nn.Module):
    """One recurrence step: injection, shared core, update. No RNG inside.

    Parts that a method does not use are absent (None), not zeroed: their parameters are
    neither stored nor counted.
    """

    def __init__(self, args: GRTModelArgs):
        super().__init__()
        # The slots of the step, each the module of its key's part (grt_titan/model/parts.py):
        # W_proj (injection = "proj"), the gate (update = "gate"), RRT's adapters (step_adapter = "lora").
        self.proj = build_module(args, "injection")
        self.core = BlockStack(args, args.n_core_layers, first_layer_id=args.n_prelude_layers)
        # The update slot: the gate (a module g(h, h_pre, noise)), or SCSE's deviation step.
        update = build_module(args, "update")
        self.deviation = update if args.update == "deviation" else None
        self.gate = None if self.deviation is not None else update
        self.adapters = build_module(args, "step_adapter")

    def forward(
        self,
        h: torch.Tensor,
        h_pre: torch.Tensor,
        freqs_cis: torch.Tensor | None,
        state_noise: torch.Tensor | None = None,
        gate_noise: torch.Tensor | None = None,
        return_parts: bool = False,
        step_index: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """`h_pre`: the source (the prelude output, or SCSE's anchor h*). `step_index` (0-dim
        int64 tensor, 0-based): selects the step's adapters (RRT)."""
        noisy = h if state_noise is None else h + state_noise
        if self.deviation is not None:
            core_input = noisy - h_pre  # SCSE: the deviation from the anchor
        elif self.proj is None:
            core_input = noisy
        else:
            core_input = self.proj(torch.cat([noisy, h_pre], dim=-1))
        adapters = None if self.adapters is None else self.adapters.at_step(step_index)
        proposal = self.core(core_input, freqs_cis, adapters)
        if self.deviation is not None:
            g, new_h = None, self.deviation(h, core_input, proposal)
        elif self.gate is None:
            g, new_h = None, proposal
        else:
            g = self.gate(h, h_pre, gate_noise)
            new_h = g * h + (1 - g) * proposal
        # g and the proposal are kept for backward anyway; returning them costs nothing.
        return (new_h, g, proposal) if return_parts else new_h

    def init_weights(self) -> None:
        if self.proj is not None:
            trunc_normal_(self.proj.weight, std=0.02)
        self.core.init_weights()
        if self.gate is not None:
            self.gate.init_weights()
        if self.adapters is not None:
            self.adapters.init_weights()


def eval_initial_state(seed: int, max_seq_len: int, dim: int, std: float) -> torch.Tensor:
    """The eval-mode random initial state [max_seq_len, dim]: row s is position s's, the same
    for every sequence and every call (one CPU draw seeded by `seed`, always of the full
    length: a draw's prefix depends on its length)."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    state = torch.empty(max_seq_len, dim)
    return nn.init.trunc_normal_(state, std=std, a=-3 * std, b=3 * std, generator=generator)


class RandomInitialState(Part):
    """initial_state = "random": h_0 ~ TruncNormal(0, initial_state_std^2) (`Recurrence.initial_state`)."""

    key, choice = "initial_state", "random"

    def describe(self, args: GRTModelArgs) -> str:
        return f"initial state h_0 ~ TruncNormal(0, {args.initial_state_std:g}^2), not the prelude's output"

    def check(self, args: GRTModelArgs, bad: Bad) -> None:
        if args.initial_state_std <= 0:
            raise bad("initial_state_std", args.initial_state_std, "must be > 0")

    def job_problems(self, job: JobSettings, args: GRTModelArgs) -> list[str]:
        return tensor_parallel_problems(
            job,
            "[grt] initial_state = 'random' does not support [parallelism] tensor_parallel_degree = {tp}: "
            "the eval-mode state is drawn per position of the whole sequence, which tensor parallelism "
            "shards; allowed: tensor_parallel_degree = 1 (FSDP/HSDP)",
        )


class Recurrence(nn.Module):
    """The shared core iterated r times from the prelude output h_pre.

    One module owns the whole loop so that FSDP can gather the core once per
    forward-backward whatever r is (see grt_titan/infra/parallelize.py).
    """

    def __init__(self, args: GRTModelArgs):
        super().__init__()
        # MoR (router = expert_choice, grt_titan/model/methods/mor.py): a router per step picks
        # the tokens that step updates; token_choice (token_choice.py): each token its depth.
        self.step = RecurrenceStep(args) if args.part("router") is None else RoutedStep(args)
        self.router = build_module(args, "router")
        self.depth_sampler = DepthSampler(args)
        self.state_noise_std = args.state_noise_std
        self.gate_noise_std = args.gate_noise_std
        self.eval_recurrences = args.eval_depth
        # Truncated backprop through depth: gradients flow through the last k steps only.
        self.backprop_recurrences = args.backprop_recurrences
        # Called eagerly with a StepRecord after every step when set (metrics, analysis).
        self.observer: Callable[[StepRecord], None] | None = None
        # None: training noise from the global torch RNG (eager use, tests). An int, set by
        # parallelize_grt to the global rank: the noise of training forward t comes from a
        # generator seeded by (depth_seed, t, rank), so a resumed run draws exactly the noise
        # an uninterrupted one would, and every rank (DP or TP shard) draws its own noise.
        self.noise_seed = args.depth_seed
        self.noise_rank: int | None = None
        self.random_initial_state = isinstance(args.part("initial_state"), RandomInitialState)
        # The initial state's module, SCSE's anchor (recurrence.anchor.*: h_0 and the steps'
        # source); None for every other row (the random state has no module).
        self.anchor = build_module(args, "initial_state")
        self.initial_state_std = args.initial_state_std
        self.has_step_adapters = args.part("step_adapter") is not None  # RRT: one adapter set per step
        self.max_recurrences = args.num_recurrences
        self.max_seq_len = args.max_seq_len
        self._eval_state_table: torch.Tensor | None = None  # cache of eval_initial_state

    def resolve_depth(self, num_recurrences: int | None) -> int:
        if num_recurrences is None:
            return self.depth_sampler.sample() if self.training else self.eval_recurrences
        if isinstance(num_recurrences, bool) or not isinstance(num_recurrences, int):
            raise TypeError(f"num_recurrences must be an int, got {num_recurrences!r}")
        if num_recurrences < 0:
            raise ValueError(
                f"num_recurrences = {num_recurrences} is invalid; use r >= 0 "
                "(0 = prelude only, r < R early exit, r > R extrapolation)"
            )
        if self.has_step_adapters and num_recurrences > self.max_recurrences:
            raise ValueError(
                f"num_recurrences = {num_recurrences} is invalid with step_adapter = 'lora': "
                f"there is one adapter per step up to R = {self.max_recurrences}"
            )
        return num_recurrences

    def _noise_generator(self, like: torch.Tensor) -> torch.Generator | None:
        if self.noise_rank is None or not self.training:
            return None
        index = self.depth_sampler.forwards  # counts this forward: sample() has just run
        seed = ((self.noise_seed * 1_000_003 + index) * 65_537 + self.noise_rank) % 2**63
        return torch.Generator(device=like.device).manual_seed(seed)

    def _noise(self, like: torch.Tensor, std: float, generator: torch.Generator | None) -> torch.Tensor | None:
        if not self.training or std == 0:
            return None
        if generator is None:
            return torch.randn_like(like) * std
        return torch.randn(like.shape, generator=generator, device=like.device, dtype=like.dtype) * std

    def initial_state(self, h_pre: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """h_0: the prelude output, or a fresh TruncNormal(0, s^2) cut at 3 s per training
        forward (Huginn's "like-init"). In eval mode the random state is one fixed draw per
        position (`eval_initial_state`), so eval forwards are deterministic and a cached
        decode step sees the state a full forward gives its position."""
        if self.anchor is not None:
            return self.anchor.initial_state(h_pre)
        if not self.random_initial_state:
            # A distinct tensor, not h_pre itself: a compiled step guards on its inputs
            # aliasing, and step 1 would otherwise compile a second graph.
            return h_pre.clone()
        if not self.training:
            table = self._eval_state_table
            if table is None or table.device != h_pre.device or table.dtype != h_pre.dtype:
                table = eval_initial_state(self.noise_seed, self.max_seq_len, h_pre.shape[-1], self.initial_state_std)
                self._eval_state_table = table = table.to(device=h_pre.device, dtype=h_pre.dtype)
            return table[: h_pre.shape[-2]].expand_as(h_pre).clone()
        std = self.initial_state_std
        return nn.init.trunc_normal_(torch.empty_like(h_pre), std=std, a=-3 * std, b=3 * std, generator=generator)

    def start(self, h_pre: torch.Tensor, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(h_0, the source the steps read): the source is h_pre, or SCSE's anchor h*."""
        return self.initial_state(h_pre, generator), h_pre if self.anchor is None else self.anchor(h_pre)

    def forward(
        self,
        h_pre: torch.Tensor,
        freqs_cis: torch.Tensor | None,
        num_recurrences: int | None = None,
        all_states: bool = False,
    ) -> RecurrenceOutput:
        """The state after r steps; with `all_states`, also the states after steps 1..r
        (Ouro's per-step readouts; returned, not an argument to fill: FSDP's hooks copy the
        containers a module is called with). With a router (MoR), its auxiliary loss."""
        depth = self.resolve_depth(num_recurrences)
        if self.router is not None:
            # A distinct tensor, not h_pre itself: a compiled step guards on input aliasing.
            return self._routed_forward(h_pre.clone(), freqs_cis, depth)
        generator = self._noise_generator(h_pre)
        h, source = self.start(h_pre, generator)
        first_tracked = 0 if self.backprop_recurrences is None else depth - self.backprop_recurrences
        grad_enabled = torch.is_grad_enabled()
        states: list[torch.Tensor] | None = [] if all_states else None
        for index in range(depth):
            noise = (
                self._noise(h, self.state_noise_std, generator),
                self._noise(h, self.gate_noise_std, generator),
            )
            # RRT's adapters are chosen by a tensor index: one compiled graph for every step.
            step_index = torch.tensor(index, dtype=torch.int64, device=h.device) if self.has_step_adapters else None
            tracked = grad_enabled and index >= first_tracked
            if h.requires_grad != tracked:
                # A random h_0, a state from untracked steps, or h_pre entering an untracked step:
                # the step sees requires_grad == grad mode, so a compiled step keeps one graph
                # per grad mode (two with truncated backprop, one otherwise).
                h = h.detach().requires_grad_(tracked)
            with torch.set_grad_enabled(tracked):
                # Always with its parts: one compiled graph whether an observer looks or not.
                new_h, gate, proposal = self.step(
                    h, source, freqs_cis, *noise, return_parts=True, step_index=step_index
                )
            if self.observer is not None:
                self.observer(StepRecord(index + 1, depth, h, new_h, gate, proposal))
            if states is not None:
                states.append(new_h)
            h = new_h
        return RecurrenceOutput(h, step_states=states)

    def _routed_forward(self, h: torch.Tensor, freqs_cis: torch.Tensor | None, depth: int) -> RecurrenceOutput:
        """MoR: `depth` routed steps (no noise, no W_proj, no gate); see routing.py. MoR's
        objective is the final state's CE (validated), so no per-step states."""
        observer = self.observer
        first_tracked = 0 if self.backprop_recurrences is None else depth - self.backprop_recurrences
        h, aux_loss_sum = self.router(
            self.step,
            h,
            freqs_cis,
            depth,
            grad_from=first_tracked,
            observer=None if observer is None else (lambda *parts: observer(StepRecord(*parts))),
        )
        return RecurrenceOutput(h, aux_loss_sum=aux_loss_sum)

    def init_weights(self) -> None:
        self.step.init_weights()
        if self.anchor is not None:
            self.anchor.init_weights()
        if self.router is not None:
            self.router.init_weights()
        self.depth_sampler.reset()


def find_recurrence(model_parts: Iterable[nn.Module] | None) -> Recurrence | None:
    """The Recurrence module of a (possibly FSDP/TP-wrapped) GRT, None for dense flavors."""
    for part in model_parts or ():
        for module in part.modules():
            if isinstance(module, Recurrence):
                return module
    return None
