"""The recurrence of the GRT (paper section 3, listing A), in one place.

    for step in 1..r:
        h_tilde = W_proj [h + eps_x ; h_pre]                          (eq. 2)
        o       = core(h_tilde)                                        (eq. 3)
        g       = sigmoid(f_g([LN(h) ; LN(h_pre)]) / tau + eps_g)      (eq. 5)
        h       = g * h + (1 - g) * o                                  (eq. 4)

Each line is a slot that a part fills (grt_titan/model/part.py, `SLOTS`): the injection (eq. 2),
the update (eqs. 4-5), the core's per-step adapters, the start (h_0 and the source the steps
read where the equations say h_pre) and the order of the steps (every token through each step,
or a part that picks the tokens). The GRT's own parts, W_proj and the gate, are here beside their
math; the parts of the methods it is compared with are in grt_titan/model/methods/, and the table
of parts (grt_titan/model/part_table.py) says which part fills which slot (docs/methods.md). With no
part active a slot is the plain loop's: h_tilde = h + eps_x, h = o, h_0 = h_pre.

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
from .part import Bad, Part, slot


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

    key, choice, module_name = "injection", "proj", "proj"

    def build(self, args: GRTModelArgs) -> nn.Linear:
        return nn.Linear(2 * args.dim, args.dim, bias=False)

    def init_weights(self, owner: nn.Module) -> None:
        trunc_normal_(owner.proj.weight, std=0.02)

    def core_input(self, step: nn.Module, state: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        return step.proj(torch.cat([state, source], dim=-1))

    def describe(self, args: GRTModelArgs) -> str:
        return "each step's input is W_proj [h + noise ; h_pre] (eq. 2)"

    def step_params(self, args: GRTModelArgs) -> int:
        return 2 * args.dim * args.dim


class GateUpdate(Part):
    """update = "gate": h <- g h + (1 - g) o (eq. 4) with the `Gate` above."""

    key, choice, module_name = "update", "gate", "gate"

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

    def update(self, step, state, source, core_input, proposal, gate_noise):
        g = step.gate(state, source, gate_noise)
        return g * state + (1 - g) * proposal, g

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
    """What `Recurrence.forward` returns, on every path (plain loop, steps run by a part, per-step readout),
    so that the model reads fields instead of testing types. A dataclass: FSDP2 finds the
    tensors of its fields for its pre-backward hooks (the recurrence is one FSDP unit)."""

    state: torch.Tensor  # h_r, the state after the last step (h_0 for r = 0)
    # h_1..h_r, only when asked (per-step readouts); None otherwise.
    step_states: list[torch.Tensor] | None = None
    # The auxiliary loss of a part that runs the steps, a sum over tokens; None without one, in
    # eval mode, or at weight 0.
    aux_loss_sum: torch.Tensor | None = None


class RecurrenceStep(nn.Module):
    """One recurrence step: injection, shared core, update. No RNG inside.

    Each slot is its part's hooks (`Part.core_input`, `Part.step_adapters`, `Part.update`) and
    the part's module, held under the part's name (`recurrence.step.proj`, `.gate`, ...): a slot
    that no method fills holds nothing, so its parameters are neither stored nor counted.
    """

    def __init__(self, args: GRTModelArgs):
        super().__init__()
        self.injection, self.update, self.step_adapter = (
            slot(args, name) for name in ("injection", "update", "adapters")
        )
        # In the step's order: its modules' keys and their initialisation's draws follow it.
        self.injection.attach(self, args)
        self.core = BlockStack(args, args.n_core_layers, first_layer_id=args.n_prelude_layers)
        self.update.attach(self, args)
        self.step_adapter.attach(self, args)

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
        """`h_pre`: the source the steps read. `step_index` (0-dim int64 tensor, 0-based):
        selects the step's adapters."""
        noisy = h if state_noise is None else h + state_noise
        core_input = self.injection.core_input(self, noisy, h_pre)
        proposal = self.core(core_input, freqs_cis, self.step_adapter.step_adapters(self, step_index))
        new_h, g = self.update.update(self, h, h_pre, core_input, proposal, gate_noise)
        # g and the proposal are kept for backward anyway; returning them costs nothing.
        return (new_h, g, proposal) if return_parts else new_h

    def init_weights(self) -> None:
        self.injection.init_weights(self)
        self.core.init_weights()
        self.update.init_weights(self)
        self.step_adapter.init_weights(self)


class Recurrence(nn.Module):
    """The shared core iterated r times from the prelude output h_pre.

    One module owns the whole loop so that FSDP can gather the core once per
    forward-backward whatever r is (see grt_titan/infra/parallelize.py).
    """

    def __init__(self, args: GRTModelArgs):
        super().__init__()
        # The order of the steps: every token through each step, or a part that picks the
        # tokens each step updates and runs the steps itself, with a step of its own.
        self.order = slot(args, "order")
        self.step = self.order.build_step(args) or RecurrenceStep(args)
        self.order.attach(self, args)
        self.depth_sampler = DepthSampler(args)
        # h_0 and the source the steps read: the prelude output, or a part's.
        self.start_part = slot(args, "start")
        self.start_part.attach(self, args)
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
        # One adapter set per step up to R: the step's index is an input, and no depth above R.
        self.step_adapter = slot(args, "adapters")
        self.step_indexed = self.step_adapter.per_step
        self.max_recurrences = args.num_recurrences

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
        if self.step_indexed and num_recurrences > self.max_recurrences:
            part = self.step_adapter
            raise ValueError(
                f"num_recurrences = {num_recurrences} is invalid with {part.key} = {part.choice!r}: "
                f"there is one {part.per_step_what} per step up to R = {self.max_recurrences}"
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

    def start(self, h_pre: torch.Tensor, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(h_0, the source the steps read), from the start slot's part: the prelude output
        (h_0 a copy of it) unless a method starts elsewhere."""
        return self.start_part.initial_state(self, h_pre, generator), self.start_part.source(self, h_pre)

    def forward(
        self,
        h_pre: torch.Tensor,
        freqs_cis: torch.Tensor | None,
        num_recurrences: int | None = None,
        all_states: bool = False,
    ) -> RecurrenceOutput:
        """The state after r steps; with `all_states`, also the states after steps 1..r
        (per-step readouts; returned, not an argument to fill: FSDP's hooks copy the
        containers a module is called with). With a part that runs the steps, its auxiliary loss."""
        depth = self.resolve_depth(num_recurrences)
        if self.order.runs_steps:
            # A distinct tensor, not h_pre itself: a compiled step guards on input aliasing.
            return self._forward_by_order(h_pre.clone(), freqs_cis, depth)
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
            # Per-step adapters are chosen by a tensor index: one compiled graph for every step.
            step_index = torch.tensor(index, dtype=torch.int64, device=h.device) if self.step_indexed else None
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

    def _forward_by_order(self, h: torch.Tensor, freqs_cis: torch.Tensor | None, depth: int) -> RecurrenceOutput:
        """`depth` steps run by the order slot's part, which picks the tokens each step updates
        (no noise; its objective is the final state's CE, validated, so no per-step states)."""
        observer = self.observer
        first_tracked = 0 if self.backprop_recurrences is None else depth - self.backprop_recurrences
        h, aux_loss_sum = self.order.run_steps(
            self,
            h,
            freqs_cis,
            depth,
            grad_from=first_tracked,
            observer=None if observer is None else (lambda *parts: observer(StepRecord(*parts))),
        )
        return RecurrenceOutput(h, aux_loss_sum=aux_loss_sum)

    def init_weights(self) -> None:
        self.step.init_weights()
        for part in (self.start_part, self.order):
            part.init_weights(self)
        self.depth_sampler.reset()


def find_recurrence(model_parts: Iterable[nn.Module] | None) -> Recurrence | None:
    """The Recurrence module of a (possibly FSDP/TP-wrapped) GRT, None for dense flavors."""
    for part in model_parts or ():
        for module in part.modules():
            if isinstance(module, Recurrence):
                return module
    return None
