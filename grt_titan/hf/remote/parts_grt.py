"""The recurrence's parts in the GRT's transformers model, one class per part: the remote twins
of grt_titan's `Part`s (grt_titan/model/part_table.py; tests/hf/test_hf_parts.py checks that every
row of the table of methods has the same parts here as in training).

A part is one choice of one config field (`key` = `choice`): W_proj (injection = "proj"), the
gate (update = "gate"), the random initial state, RRT's step adapters, Ouro's exit, MoR's
expert-choice router. Everything the model does for it lives in its class:

| member | what | read by |
|---|---|---|
| `key`, `choice`, `settings` | the field and value that select it; its settings, written to config.json only when it is selected | `active_parts`, `slots`, `GRTConfig.to_dict` |
| `check(config)` | its rules on its fields, selected or not (a setting of an unselected part that is set is one) | `GRTConfig.check_settings` |
| `check_at_call(config)` | the rules on settings a call may see changed after loading | `GRTConfig.check_call_settings` (every forward) |
| `module_name`, `build(config)` | the module it adds, `GRTModel.<module_name>` (weights `model.<module_name>.*`) | `GRTModel.__init__` |
| `per_step` | one module per step up to R: the default depth and a call's depth <= R (`check_depth`) | its `check`, `GRTModel.resolve_depth` |
| hooks of its key's slot | `initial_state`, `source` (what the steps read for h_pre: SCSE's anchor), `core_input`, `core_lora`, `update` (`gated`: it returns a gate), `run_steps`, `reads_every_step`, `readout` | `GRTModel.forward` |
| cache hooks | `cache_class`, `keeps_cache`, `check_cache`, `check_cache_strategy` | `GRTModel`, `GRTCache` |

The base `RemotePart` is the plain loop's choice of every key (injection "none", update
"overwrite", initial_state "prelude", step_adapter "none", objective "final", router "none"):
no module, no rule, the plain hooks. The model asks each key's slot (`slots`: the active part
of the key, else `PLAIN`) for its hook, so the forward never tests a field.

Remote code: imports torch and transformers only, exported next to modeling_grt.py. It
imports the parts' modules (layers_grt.py, routing_grt.py, exit_grt.py, cache_grt.py) and
configuration_grt.py imports it, so those files import configuration_grt.py for their
annotations only.
"""

from __future__ import annotations

import torch
from torch import nn

# The annotations name transformers' base class, not GRTConfig: configuration_grt.py imports
# the parts, which import this file (an import circle).
from transformers import PretrainedConfig

from .cache_grt import GRTCache, MoRCache
from .exit_grt import EXIT_KV_CACHE_STRATEGIES, ExitGate, exit_readout
from .layers_grt import GRTGate, GRTSourceAnchor, GRTStepAdapters, InitialStateTable, deviation_step
from .routing_grt import ROUTER_INFERENCE, ROUTER_UPDATES, MoRRouter

# SCSE's three parts, which go together (grt_titan/model/methods/scse.py).
SCSE_CHOICES = {"injection": "deviation", "update": "deviation", "initial_state": "anchor"}


class RemotePart:
    """One choice of one config field; the base is the plain loop's choice of every key."""

    key: str = ""  # the GRTConfig field that selects the part
    choice: str | None = None  # the value of that field that does
    settings: tuple[str, ...] = ()  # its config.json fields, written only when it is selected
    module_name: str | None = None  # GRTModel.<module_name> holds its module
    per_step: bool = False  # one module per step up to R
    gated: bool = False  # its update returns a gate (the output's `gate_values`)
    what: str = ""  # what it holds per step ("router"), for the messages
    what_set: str = ""  # the same in the config's messages where it differs ("adapter set")

    @property
    def label(self) -> str:
        return f"{self.key} = {self.choice!r}"

    def selected(self, config: PretrainedConfig) -> bool:
        """The config's field chooses this part (on a dense model too: its rules apply)."""
        return getattr(config, self.key) == self.choice

    def active(self, config: PretrainedConfig) -> bool:
        """The model has this part: a recurrent config that selects it."""
        return config.num_core_layers > 0 and self.selected(config)

    # ---- rules ------------------------------------------------------------------------

    def check(self, config: PretrainedConfig) -> None:
        """ValueError naming the field for the first problem of the part's fields."""

    def check_at_call(self, config: PretrainedConfig) -> None:
        """The rules on settings that may be set after loading (`from_pretrained(..., x=v)`)."""

    def _check_per_step(self, config: PretrainedConfig) -> None:
        """A module per step up to R: R >= 1, the default depth <= R."""
        R, what = config.num_recurrences, self.what_set or self.what
        if R < 1:
            raise ValueError(f"{self.label} needs num_recurrences >= 1 (R, one {what} per step)")
        if config.eval_depth > R:
            raise ValueError(
                f"eval_recurrences = {config.eval_recurrences} is invalid with {self.label}: there is one "
                f"{what} per step up to R = num_recurrences = {R}"
            )

    def check_depth(self, depth: int, R: int) -> None:
        """ValueError for a call's depth r the part cannot run (per-step modules: r > R)."""
        if self.per_step and depth > R:
            raise ValueError(
                f"num_recurrences = {depth} is invalid with {self.label}: there is one {self.what} "
                f"per step up to R = {R}"
            )

    # ---- the model --------------------------------------------------------------------

    def build(self, config: PretrainedConfig) -> nn.Module | None:
        """The module of the active part (`GRTModel.<module_name>`), None for none."""
        return None

    def initial_state(self, model, h_pre: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """h_0 (initial_state slot): the prelude output."""
        return h_pre

    def source(self, model, h_pre: torch.Tensor) -> torch.Tensor:
        """What the steps read where the equations say h_pre (initial_state slot): h_pre."""
        return h_pre

    def core_input(self, model, h: torch.Tensor, h_pre: torch.Tensor) -> torch.Tensor:
        """The core's input at a step (injection slot): the state."""
        return h

    def core_lora(self, model, step: int, block: int):
        """The `lora(name, x)` of core block `block` at step `step` (step_adapter slot): none."""
        return None

    def update(self, model, h: torch.Tensor, h_pre: torch.Tensor, o: torch.Tensor):
        """(the new state, the gate or None) from the core's output o (update slot): h = o."""
        return o, None

    def run_steps(self, model, h, h_pre, call, record, router_inference, keep) -> torch.Tensor:
        """h_r after `call.depth` steps, each recorded (router slot): the plain loop."""
        return model.plain_steps(h, h_pre, call, record)

    def reads_every_step(self, config: PretrainedConfig) -> bool:
        """Every step is read out, each token at its own exit step (objective slot): no."""
        return False

    def readout(self, model, h, call, record, exits):
        """(the LM head's input, the step exits, the exit steps or None) (objective slot):
        coda and final norm on h_r."""
        return model.coda_readout(h, call, record, exits)

    # ---- the cache --------------------------------------------------------------------

    cache_class: type[GRTCache] | None = None  # the cache the part needs (None: any GRTCache)

    def keeps_cache(self, config: PretrainedConfig, router_inference: str | None) -> bool:
        """A call may keep a cache by default (use_cache None)."""
        return True

    def check_cache(self, cache: GRTCache) -> None:
        """TypeError for a cache given to the model that the part cannot use."""

    def check_cache_strategy(self, config: PretrainedConfig, strategy: str) -> None:
        """ValueError for a cache strategy the part cannot run exactly (`GRTCache.__init__`)."""


PLAIN = RemotePart()


class ProjInjection(RemotePart):
    """injection = "proj": the core's input W_proj [h ; h_pre], a bias-free Linear(2d, d) (GRT)."""

    key, choice, module_name = "injection", "proj", "proj"

    def build(self, config: PretrainedConfig) -> nn.Linear:
        return nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)

    def core_input(self, model, h, h_pre):
        return model.proj(torch.cat([h, h_pre], dim=-1))


class GateUpdate(RemotePart):
    """update = "gate": h = g h + (1 - g) o with the learned gate `GRTGate` (GRT)."""

    key, choice, module_name = "update", "gate", "gate"
    gated = True

    def build(self, config: PretrainedConfig) -> GRTGate:
        return GRTGate(config)

    def update(self, model, h, h_pre, o):
        g = model.gate(h, h_pre, None)  # no noise at inference
        return g * h + (1 - g) * o, g


class RandomInitialState(RemotePart):
    """initial_state = "random": h_0 of position t is row t of one fixed TruncNormal table
    (`InitialStateTable`, heavy-tail Poisson's state at inference)."""

    key, choice, module_name = "initial_state", "random", "initial_state_table"
    settings = ("initial_state_std", "initial_state_seed")

    def check(self, config: PretrainedConfig) -> None:
        if config.initial_state_std <= 0:
            raise ValueError(f"initial_state_std = {config.initial_state_std!r} is invalid; must be > 0")

    def build(self, config: PretrainedConfig) -> InitialStateTable:
        return InitialStateTable(config)

    def initial_state(self, model, h_pre, position_ids):
        return model.initial_state_table(h_pre, position_ids)


class DeviationInjection(RemotePart):
    """injection = "deviation": the core's input Delta = h - h* (SCSE; the steps' source is h*)."""

    key, choice = "injection", "deviation"

    def check(self, config: PretrainedConfig) -> None:
        chosen = {key: getattr(config, key) == choice for key, choice in SCSE_CHOICES.items()}
        if any(chosen.values()) and not all(chosen.values()):
            key = next(key for key, on in chosen.items() if not on)
            together = ", ".join(f"{k} = {v!r}" for k, v in SCSE_CHOICES.items())
            raise ValueError(f"{key} = {getattr(config, key)!r} is invalid; SCSE's parts go together: {together}")

    def core_input(self, model, h, h_pre):
        return h - h_pre


class DeviationUpdate(RemotePart):
    """update = "deviation": h = h + m s (o - (h - h*)), m per sequence (SCSE)."""

    key, choice = "update", "deviation"
    settings = ("deviation_step_size", "deviation_mask_eps")

    def check(self, config: PretrainedConfig) -> None:
        if config.deviation_step_size <= 0:
            raise ValueError(f"deviation_step_size = {config.deviation_step_size!r} is invalid; must be > 0")
        if config.deviation_mask_eps < 0:
            raise ValueError(f"deviation_mask_eps = {config.deviation_mask_eps!r} is invalid; must be >= 0")

    def update(self, model, h, h_pre, o):
        config = model.config
        return deviation_step(h, h - h_pre, o, config.deviation_step_size, config.deviation_mask_eps), None


class AnchorInitialState(RemotePart):
    """initial_state = "anchor": SCSE's anchor h* and h_0 from the prelude output (`GRTSourceAnchor`)."""

    key, choice, module_name = "initial_state", "anchor", "anchor"
    settings = ("anchor_scale", "initial_deviation_scale")

    def check(self, config: PretrainedConfig) -> None:
        for name in ("anchor_scale", "initial_deviation_scale"):
            if getattr(config, name) < 0:
                raise ValueError(f"{name} = {getattr(config, name)!r} is invalid; must be >= 0")

    def build(self, config: PretrainedConfig) -> GRTSourceAnchor:
        return GRTSourceAnchor(config)

    def initial_state(self, model, h_pre, position_ids):
        return model.anchor.initial_state(h_pre)

    def source(self, model, h_pre):
        return model.anchor(h_pre)


class LoraAdapters(RemotePart):
    """step_adapter = "lora": RRT's per-step LoRA `GRTStepAdapters` on the gpt2 core blocks."""

    key, choice, module_name = "step_adapter", "lora", "adapters"
    settings = ("lora_rank", "lora_scale")
    per_step, what, what_set = True, "adapter", "adapter set"

    def check(self, config: PretrainedConfig) -> None:
        if not self.selected(config):
            return
        if config.block_style != "gpt2":
            raise ValueError("step_adapter = 'lora' is implemented for block_style = 'gpt2' only")
        if config.lora_rank < 1:
            raise ValueError(f"lora_rank = {config.lora_rank!r} is invalid; must be >= 1")
        self._check_per_step(config)

    def build(self, config: PretrainedConfig) -> GRTStepAdapters:
        return GRTStepAdapters(config)

    def core_lora(self, model, step, block):
        return model.adapters.block_lora(step, block)


class ExitDistribution(RemotePart):
    """objective = "exit_distribution": Ouro's exit gate `ExitGate` and, with exit_threshold
    q < 1, the per-token exit over every step's readout (`exit_readout`), which replaces the
    readout of the last step."""

    key, choice, module_name = "objective", "exit_distribution", "exit_gate"
    settings = ("exit_threshold",)

    def check(self, config: PretrainedConfig) -> None:
        q = config.exit_threshold
        if isinstance(q, bool) or not isinstance(q, (int, float)):
            raise ValueError(f"exit_threshold = {q!r} is invalid; must be a number in (0, 1]")
        if not 0.0 < q <= 1.0:
            raise ValueError(
                f"exit_threshold = {q!r} is invalid; must be in (0, 1] (the cumulative exit "
                "probability at which a token exits; 1 = always the last step)"
            )
        if not self.selected(config):
            if q != 1.0:
                raise ValueError(
                    f"exit_threshold = {q!r} is used by objective = 'exit_distribution' only "
                    f"(objective = {config.objective!r} has no exit gate)"
                )
            return
        if not config.num_core_layers:
            raise ValueError("objective = 'exit_distribution' needs a recurrent model (num_core_layers >= 1)")
        self.check_cache_strategy(config, config.kv_cache_strategy)

    def check_at_call(self, config: PretrainedConfig) -> None:
        self.check(config)  # exit_threshold may be set after loading

    def build(self, config: PretrainedConfig) -> ExitGate:
        return ExitGate(config)

    def reads_every_step(self, config: PretrainedConfig) -> bool:
        return config.exit_threshold < 1.0

    def readout(self, model, h, call, record, exits):
        if not call.per_token_exit:  # q = 1 (or r = 0): the last step's plain readout
            return super().readout(model, h, call, record, exits)
        h, exit_steps, readouts, coda_outputs = exit_readout(
            model.coda,
            model.norm,
            model.exit_gate,
            model.config.exit_threshold,
            record.states[1:],
            call.rope,
            call.mask,
            call.kv,
            keep_coda=record.hidden_states is not None,
        )
        if record.hidden_states is not None:
            record.hidden_states.extend(coda_outputs)
        if exits is not None:
            exits.extend(readouts)
        return h, exits, exit_steps

    def check_cache_strategy(self, config: PretrainedConfig, strategy: str) -> None:
        if self.reads_every_step(config) and strategy not in EXIT_KV_CACHE_STRATEGIES:
            raise ValueError(
                f"kv_cache_strategy = {strategy!r} cannot be used with objective = 'exit_distribution' "
                f"and exit_threshold = {config.exit_threshold!r} < 1; allowed: {EXIT_KV_CACHE_STRATEGIES} "
                "(every step's coda reads its own step's K/V of earlier tokens, which a compressed core "
                "cache does not keep exactly)"
            )


class ExpertChoice(RemotePart):
    """router = "expert_choice": Mixture-of-Recursions' routers `MoRRouter`, whose routed steps
    replace the plain loop, and its recursion-wise cache `MoRCache`."""

    key, choice, module_name = "router", "expert_choice", "router"
    settings = ("router_capacity", "router_scale", "router_inference", "router_update")
    per_step, what = True, "router"
    cache_class = MoRCache
    # The parts MoR fixes (update: the router weight replaces the gate), in the order they are checked.
    required = dict(
        injection="none", update="overwrite", initial_state="prelude", step_adapter="none", block_style="gpt2"
    )

    def check(self, config: PretrainedConfig) -> None:
        if not self.selected(config):
            return
        for name, required in self.required.items():
            if getattr(config, name) != required:
                raise ValueError(
                    f"{name} = {getattr(config, name)!r} is invalid with router = 'expert_choice'; "
                    f"allowed: {required!r}"
                )
        if config.router_inference not in ROUTER_INFERENCE:
            raise ValueError(f"router_inference = {config.router_inference!r} is invalid; allowed: {ROUTER_INFERENCE}")
        if config.router_update not in ROUTER_UPDATES:
            raise ValueError(f"router_update = {config.router_update!r} is invalid; allowed: {ROUTER_UPDATES}")
        self._check_per_step(config)
        R = config.num_recurrences
        if config.router_capacity is not None and len(config.router_capacity) != R:
            raise ValueError(
                f"router_capacity = {config.router_capacity!r} is invalid; allowed: one share per step "
                f"(R = num_recurrences = {R}) or None for (R - i) / R"
            )
        if not config.router_scale > 0:
            raise ValueError(f"router_scale = {config.router_scale!r} is invalid; must be > 0")

    def build(self, config: PretrainedConfig) -> MoRRouter:
        return MoRRouter(config)

    def run_steps(self, model, h, h_pre, call, record, router_inference, keep):
        h, states, proposals = model.router(
            h, call.depth, model.core, router_inference, call.cache, call.cache_slots, keep
        )
        for state, proposal in zip(states, proposals):
            record.step(state, proposal, None)
        return h

    def keeps_cache(self, config: PretrainedConfig, router_inference: str | None) -> bool:
        # top_k ranks the whole sequence: nothing a later call could reuse.
        return (router_inference or config.router_inference) != "top_k"

    def check_cache(self, cache: GRTCache) -> None:
        if not isinstance(cache, MoRCache):
            raise TypeError("a Mixture-of-Recursions model (router = 'expert_choice') needs a MoRCache, got a GRTCache")


# Every part, in the order of grt_titan/model/part_table.py (their rules are checked in it).
PARTS: tuple[RemotePart, ...] = (
    ProjInjection(),  # injection = "proj" (GRT, Poisson)
    GateUpdate(),  # update = "gate" (GRT)
    RandomInitialState(),  # initial_state = "random" (heavy-tail Poisson)
    DeviationInjection(),  # injection = "deviation" (SCSE)
    DeviationUpdate(),  # update = "deviation" (SCSE)
    AnchorInitialState(),  # initial_state = "anchor" (SCSE)
    LoraAdapters(),  # step_adapter = "lora" (RRT)
    ExitDistribution(),  # objective = "exit_distribution" (Ouro)
    ExpertChoice(),  # router = "expert_choice" (MoR)
)
# The keys whose choices have parts: the model's slots.
KEYS: tuple[str, ...] = tuple(dict.fromkeys(part.key for part in PARTS))


def active_parts(config: PretrainedConfig) -> list[RemotePart]:
    """The parts the config's model has, in the table's order (none for a dense model)."""
    return [part for part in PARTS if part.active(config)]


def slots(parts: list[RemotePart]) -> dict[str, RemotePart]:
    """Each key's active part among `parts`, else `PLAIN` (the plain loop's choice)."""
    return {key: next((part for part in parts if part.key == key), PLAIN) for key in KEYS}


def cache_class(parts: list[RemotePart]) -> type[GRTCache]:
    """The cache a model of `parts` makes: the one a part needs, else `GRTCache`."""
    return next((part.cache_class for part in parts if part.cache_class is not None), GRTCache)
