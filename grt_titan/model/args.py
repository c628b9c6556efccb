"""Configuration of the Gated Recurrent Transformer and its FLOP count (paper eq. 1)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Literal

from torch import nn
from torchtitan.protocols.model import BaseModelArgs

from grt_titan.field_checks import field_problems

from . import methods
from .depth_law import heavy_tail_depth_probabilities

BlockStyle = Literal["gpt2", "llama"]
DepthSampling = Literal["uniform", "fixed", "poisson_lognormal"]
# The named parts of one recurrence step (docs/architecture.md, "Methods as parts"): every
# method of the paper's table 1 and every rung of its figure 5 is one choice of each.
Injection = Literal["proj", "none"]  # proj: W_proj [h (+ eps_x); h_pre] (eq. 2); none: h (+ eps_x)
Update = Literal["gate", "overwrite"]  # gate: eq. 4; overwrite: h <- core output
InitialState = Literal["prelude", "random"]  # h_0 = h_pre, or TruncNormal(0, initial_state_std)
StepAdapter = Literal["none", "lora"]  # lora: one LoRA per (core block, step) on its linears (RRT)
Objective = Literal["final", "exit_distribution"]  # CE at the last step, or Ouro's expected loss
Router = Literal["none", "expert_choice", "token_choice"]  # MoR: which tokens each recursion step updates
# MoR in eval mode: top_k (as trained; not causal) or threshold (causal; what generation uses).
RouterInference = Literal["top_k", "threshold"]
# MoR expert choice, a routed token's update with router weight g: delta, h + g (core(h) - h)
# (the paper's H + g f(H)); block, h + g core(h) = (1 + g) h + g f(H) (the released code's
# `x + g * Block(x)`, its Block holding the residual). docs/architecture.md says which the
# paper's rows use and why.
RouterUpdate = Literal["delta", "block"]

# Fields of `GRTModelArgs` that the `[grt]` TOML section may override (same names there).
CONFIGURABLE_FIELDS = (
    "block_style",
    "num_recurrences",
    "min_recurrences",
    "eval_recurrences",
    "depth_sampling",
    "depth_seed",
    "state_noise_std",
    "gate_noise_std",
    "gate_temperature",
    "gate_bias_init",
    "gate_override",
    "backprop_recurrences",
    "vocab_multiple_of",
    "injection",
    "update",
    "initial_state",
    "initial_state_std",
    "depth_mean",
    "step_adapter",
    "lora_rank",
    "lora_scale",
    "objective",
    "exit_entropy_weight",
    "exit_threshold",
    "router",
    "router_capacity",
    "router_scale",
    "router_aux_weight",
    "router_balance_weight",
    "router_z_loss_weight",
    "router_inference",
    "router_update",
)


# The parts that make GRT itself (the other methods change some of them): its row's.
GRT_PARTS: dict[str, Any] = {
    name: methods.GRT.parts[name]
    for name in ("injection", "update", "initial_state", "step_adapter", "objective", "router")
}


@dataclass
class GRTModelArgs(BaseModelArgs):
    """Architecture of one GRT flavor: `n_prelude_layers + n_core_layers x R + n_coda_layers`.

    A dense model is the same args with `n_core_layers = 0` (no projection, no gate).
    Names follow the paper: prelude, core, coda, gate, recurrence.
    """

    block_style: BlockStyle = "gpt2"
    dim: int = 768
    n_heads: int = 12
    n_kv_heads: int | None = None  # llama style only (grouped-query attention)
    vocab_size: int = 50257  # the tokenizer's vocabulary (ids it can emit)
    # Embedding / LM head rows are padded up to a multiple of this (see padded_vocab_size).
    vocab_multiple_of: int = 1
    max_seq_len: int = 1024  # gpt2: learned positions; llama: RoPE table length
    norm_eps: float = 1e-5

    n_prelude_layers: int = 1
    n_core_layers: int = 1
    n_coda_layers: int = 1

    # Recurrence (paper section 3): r ~ Uniform{min..num_recurrences} per training forward.
    num_recurrences: int = 4  # R
    min_recurrences: int = 1  # r_min
    eval_recurrences: int | None = None  # depth in eval mode; None means R
    depth_sampling: DepthSampling = "uniform"
    depth_seed: int = 0

    state_noise_std: float = 0.1  # sigma_x
    gate_noise_std: float = 0.1  # sigma_g
    gate_temperature: float = 1.0  # tau
    gate_bias_init: float = 4.0
    gate_hidden_dim: int | None = None  # d_gate; None means dim
    gate_override: float | None = None  # ablation: g fixed to this value in [0, 1]
    backprop_recurrences: int | None = None  # truncated backprop: last k steps; None = all

    # Parts of the recurrence (GRT: proj, gate, prelude, uniform, none, final, none).
    injection: Injection = "proj"
    update: Update = "gate"
    initial_state: InitialState = "prelude"
    initial_state_std: float = 0.02  # std of the random h_0 (heavy-tail Poisson), cut at 3 std
    depth_mean: float | None = None  # poisson_lognormal: E[r]; None = (r_min + R) / 2
    step_adapter: StepAdapter = "none"
    lora_rank: int = 64  # RRT: rank of each per-step adapter
    lora_scale: float = 2.0  # RRT: alpha / rank, the adapter's output scale
    objective: Objective = "final"
    exit_entropy_weight: float = 0.05  # Ouro: beta of the exit-distribution entropy bonus
    exit_threshold: float = 1.0  # Ouro: inference exits at the first step with CDF >= q
    router: Router = "none"
    router_capacity: list[float] | None = None  # MoR: share of tokens kept per step; None = (R-i)/R
    router_scale: float = 0.1  # MoR: alpha, the router weight is sigmoid(logit) * alpha
    router_aux_weight: float = 0.001  # MoR: weight of the router's BCE auxiliary loss
    router_balance_weight: float = 0.1  # MoR token choice: weight of the balancing loss R sum P_j f_j
    router_z_loss_weight: float = 0.0  # MoR token choice: weight of the router z-loss (0: off)
    # MoR in eval mode: top_k over the sequence (training's rule), or threshold (a token goes
    # on while sigmoid(logit) > 0.5; causal). Training always uses top_k.
    router_inference: RouterInference = "top_k"
    # MoR expert choice: how a routed token's state takes the core output (RouterUpdate above).
    # The default is the update of every run made before the option existed, so their records,
    # checkpoints and exports load as trained; the MoR TOMLs of train_configs/paper/ set "block".
    router_update: RouterUpdate = "delta"

    # llama style (torchtitan's TransformerBlock)
    multiple_of: int = 256
    ffn_dim_multiplier: float | None = None
    rope_theta: float = 10000.0

    @property
    def is_recurrent(self) -> bool:
        return self.n_core_layers > 0

    @property
    def method_name(self) -> str:
        """The row of the paper's table 1 (or figure 5's ladder) that these parts make:
        a lookup in grt_titan/model/methods.py."""
        return methods.method_name(self)

    @property
    def non_grt_parts(self) -> dict[str, Any]:
        """The parts set to something other than GRT's (empty for GRT and dense models)."""
        if not self.is_recurrent:
            return {}
        return {name: getattr(self, name) for name, default in GRT_PARTS.items() if getattr(self, name) != default}

    @property
    def extrapolates(self) -> bool:
        """Depths above R are defined: no per-step module (MoR's routers, RRT's adapters)."""
        return self.router == "none" and self.step_adapter == "none"

    @property
    def per_step_readout(self) -> bool:
        """Every recurrence step is read out through coda, norm and head (Ouro)."""
        return self.is_recurrent and self.objective == "exit_distribution"

    @property
    def padded_vocab_size(self) -> int:
        """Rows of tok_embeddings and of the LM head: vocab_size rounded up to a multiple of
        vocab_multiple_of (GPT-2: 50257 -> 50304 for 128, as nanoGPT and Megatron's
        make-vocab-size-divisible-by do), so tensor-parallel vocabulary shards are equal.

        The extra rows are never a target and never an input (the tokenizer never emits
        those ids). Training leaves their logits in the softmax (as nanoGPT / Megatron do;
        the loss pushes them down); the Hugging Face export drops the rows, so an exported
        model cannot generate them.
        """
        m = self.vocab_multiple_of
        return -(-self.vocab_size // m) * m

    @property
    def ffn_hidden_dim(self) -> int:
        """MLP hidden size: 4d for gpt2; for llama exactly as torchtitan's FeedForward computes it."""
        if self.block_style == "gpt2":
            return 4 * self.dim
        hidden = int(2 * 4 * self.dim / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)

    @property
    def eval_depth(self) -> int:
        """Depth of an eval-mode forward with no explicit r: `eval_recurrences`, default R."""
        return self.num_recurrences if self.eval_recurrences is None else self.eval_recurrences

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def tie_embeddings(self) -> bool:
        # The paper's nanoGPT blocks tie the LM head to the embedding; llama does not.
        return self.block_style == "gpt2"

    @property
    def expected_recurrences(self) -> float:
        """Mean training depth E[r] of the configured sampler (0 for a dense model)."""
        if not self.is_recurrent:
            return 0.0
        if self.depth_sampling == "fixed":
            return float(self.num_recurrences)
        if self.depth_sampling == "poisson_lognormal" and self.depth_mean is not None:
            return self.depth_mean
        return (self.min_recurrences + self.num_recurrences) / 2

    @property
    def unrolled_layers(self) -> int:
        """Block executions of a forward at depth R: p + n*R + c."""
        return self.n_prelude_layers + self.n_core_layers * self.num_recurrences + self.n_coda_layers

    def validate(self, where: str = "model args") -> None:
        """Raise ValueError naming the offending field and what is allowed."""

        def bad(field: str, value, allowed: str) -> ValueError:
            return ValueError(f"{where}: {field} = {value!r} is invalid; {allowed}")

        # Types and Literal choices first (TOML values are not type-checked by torchtitan),
        # NaN/inf floats too.
        problems = field_problems(self, f"{where}:")
        if problems:
            raise ValueError(problems[0])
        for name in ("dim", "n_heads", "vocab_size", "vocab_multiple_of", "max_seq_len"):
            if getattr(self, name) < 1:
                raise bad(name, getattr(self, name), "must be >= 1")
        if self.dim % self.n_heads:
            raise bad("dim", self.dim, f"must be divisible by n_heads = {self.n_heads}")
        if self.n_kv_heads is not None and (self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads):
            raise bad("n_kv_heads", self.n_kv_heads, f"must divide n_heads = {self.n_heads}")
        for name in ("n_prelude_layers", "n_core_layers", "n_coda_layers"):
            if getattr(self, name) < 0:
                raise bad(name, getattr(self, name), "must be >= 0")
        if self.norm_eps <= 0:
            raise bad("norm_eps", self.norm_eps, "must be > 0")
        if self.gate_hidden_dim is not None and self.gate_hidden_dim < 1:
            raise bad("gate_hidden_dim", self.gate_hidden_dim, "must be >= 1 or unset")
        if self.unrolled_layers < 1 and self.n_core_layers == 0:
            raise bad("n_prelude_layers", self.n_prelude_layers, "the model needs a block")
        if self.objective != "final" and not self.is_recurrent:
            raise bad(
                "objective", self.objective, "needs a recurrent flavor (n_core_layers >= 1); allowed for dense: 'final'"
            )
        if not self.is_recurrent:
            return
        if self.num_recurrences < 1:
            raise bad("num_recurrences", self.num_recurrences, "must be >= 1")
        if not 1 <= self.min_recurrences <= self.num_recurrences:
            raise bad(
                "min_recurrences",
                self.min_recurrences,
                f"must be in [1, num_recurrences = {self.num_recurrences}]",
            )
        if self.eval_recurrences is not None and self.eval_recurrences < 0:
            raise bad("eval_recurrences", self.eval_recurrences, "must be >= 0")
        for name in ("state_noise_std", "gate_noise_std"):
            if getattr(self, name) < 0:
                raise bad(name, getattr(self, name), "must be >= 0")
        if self.gate_temperature <= 0:
            raise bad("gate_temperature", self.gate_temperature, "must be > 0")
        if self.backprop_recurrences is not None and self.backprop_recurrences < 1:
            raise bad("backprop_recurrences", self.backprop_recurrences, "must be >= 1 or unset")
        if self.gate_override is not None and not 0.0 <= self.gate_override <= 1.0:
            raise bad("gate_override", self.gate_override, "must be in [0, 1] or unset")
        if self.gate_override is not None and self.update != "gate":
            raise bad(
                "gate_override", self.gate_override, f"needs update = 'gate' (update = {self.update!r} has no gate)"
            )
        if self.initial_state_std <= 0:
            raise bad("initial_state_std", self.initial_state_std, "must be > 0")
        if self.depth_mean is not None and self.depth_mean < 1:
            raise bad("depth_mean", self.depth_mean, "must be >= 1 (the Poisson depth is at least 1)")
        if self.depth_mean is not None and self.depth_sampling != "poisson_lognormal":
            raise bad("depth_mean", self.depth_mean, "is used by depth_sampling = 'poisson_lognormal' only")
        if self.lora_rank < 1:
            raise bad("lora_rank", self.lora_rank, "must be >= 1")
        if self.step_adapter == "lora":
            if self.depth_sampling != "fixed":
                raise bad(
                    "step_adapter", "lora", "needs depth_sampling = 'fixed' (one adapter per step of a fixed depth R)"
                )
            if self.block_style != "gpt2":
                raise bad("step_adapter", "lora", "is implemented for block_style = 'gpt2' (the paper's blocks)")
        if self.exit_entropy_weight < 0:
            raise bad("exit_entropy_weight", self.exit_entropy_weight, "must be >= 0")
        if not 0.0 < self.exit_threshold <= 1.0:
            raise bad("exit_threshold", self.exit_threshold, "must be in (0, 1]")
        if self.exit_threshold != 1.0 and self.objective != "exit_distribution":
            raise bad(
                "exit_threshold",
                self.exit_threshold,
                "is used by objective = 'exit_distribution' only (no exit gate otherwise)",
            )
        if self.objective == "exit_distribution" and self.router != "none":
            raise bad(
                "objective", self.objective, f"cannot be combined with router = {self.router!r} (one method per run)"
            )
        if self.router_scale <= 0:
            raise bad("router_scale", self.router_scale, "must be > 0")
        if self.router_aux_weight < 0:
            raise bad("router_aux_weight", self.router_aux_weight, "must be >= 0")
        self._validate_token_choice(bad)
        if self.router_inference != "top_k" and self.router != "expert_choice":
            raise bad(
                "router_inference",
                self.router_inference,
                f"is used by router = 'expert_choice' only (router = {self.router!r}); allowed: 'top_k'",
            )
        if self.router_update != "delta" and self.router != "expert_choice":
            raise bad(
                "router_update",
                self.router_update,
                f"is used by router = 'expert_choice' only (router = {self.router!r}); allowed: 'delta'",
            )
        if self.router != "none":
            self._validate_router(bad)

    def _validate_router(self, bad: Callable[[str, Any, str], ValueError]) -> None:
        """MoR (router = expert_choice) is prelude + core x R + coda with routed steps only:
        no re-injection, no gate, no noise, a fixed depth R (one router per step)."""
        required = {
            "block_style": (
                "gpt2",
                "the routed core gathers tokens; llama blocks would need their RoPE positions gathered too",
            ),
            "depth_sampling": ("fixed", "one router and one capacity per step of a fixed depth R"),
            "injection": ("none", "MoR does not re-inject the prelude output"),
            "update": ("overwrite", "the router weight replaces the gate on routed tokens (router_update)"),
            "initial_state": ("prelude", "MoR starts from the prelude output"),
            "step_adapter": ("none", "MoR shares the core strictly"),
            "objective": ("final", "MoR's loss is CE at the last step plus the router's auxiliary loss"),
            "state_noise_std": (0.0, "MoR has no state noise"),
        }
        for name, (value, why) in required.items():
            if getattr(self, name) != value:
                raise bad(name, getattr(self, name), f"router = {self.router!r} needs {name} = {value!r} ({why})")
        if self.eval_recurrences is not None and self.eval_recurrences > self.num_recurrences:
            raise bad(
                "eval_recurrences",
                self.eval_recurrences,
                f"router = {self.router!r} has one router per step: at most num_recurrences = {self.num_recurrences}",
            )
        if self.router_capacity is None:
            return
        capacities = self.router_capacities
        if len(capacities) != self.num_recurrences:
            raise bad(
                "router_capacity",
                self.router_capacity,
                f"needs one capacity per step (num_recurrences = {self.num_recurrences}), got {len(capacities)}",
            )
        if not all(0.0 < c <= 1.0 for c in capacities):
            raise bad("router_capacity", self.router_capacity, "capacities must be in (0, 1]")
        if any(b > a for a, b in zip(capacities, capacities[1:])):
            raise bad(
                "router_capacity",
                self.router_capacity,
                "capacities must not increase (step i chooses among the tokens step i-1 kept)",
            )

    def _validate_token_choice(self, bad: Callable[[str, Any, str], ValueError]) -> None:
        """MoR token choice (docs/architecture.md): its own loss weights, none of expert
        choice's fields; its other parts are `_validate_router`'s."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        own = ("router_balance_weight", "router_z_loss_weight")
        for name in own:
            if getattr(self, name) < 0:
                raise bad(name, getattr(self, name), "must be >= 0")
        if self.router != "token_choice":
            for name in own:
                if getattr(self, name) != defaults[name]:
                    raise bad(
                        name, getattr(self, name), f"is used by router = 'token_choice' only (router = {self.router!r})"
                    )
            return
        for name, why in (
            ("router_capacity", "each token chooses its own depth"),
            ("router_scale", "the weight is the softmax probability itself (alpha = 1)"),
            ("router_aux_weight", "token choice's auxiliary loss is router_balance_weight"),
        ):
            if getattr(self, name) != defaults[name]:
                raise bad(
                    name,
                    getattr(self, name),
                    f"is used by router = 'expert_choice' only ({why}); leave it unset with router = 'token_choice'",
                )

    @property
    def token_choice_active_shares(self) -> tuple[float, ...]:
        """MoR token choice: share of the tokens step i updates under balanced routing (each
        depth 1..R chosen by S / R tokens), (R - i) / R: the FLOP convention."""
        R = self.num_recurrences
        return tuple((R - i) / R for i in range(R))

    @property
    def router_capacities(self) -> tuple[float, ...]:
        """MoR: share of the sequence step i keeps; `router_capacity`, else (R - i) / R."""
        R = self.num_recurrences
        if self.router_capacity is None:
            return tuple((R - i) / R for i in range(R))
        return tuple(float(c) for c in self.router_capacity)

    def router_tokens_kept(self, seq_len: int) -> list[int]:
        """MoR: k_i = max(1, int(capacity_i * S)) per step, as the released code computes it."""
        return [max(1, int(c * seq_len)) for c in self.router_capacities]

    # The whole-job start-up checks (grt_titan.config_checks.check_job_config), installed by
    # grt_titan.spec at registration: torchtitan's Trainer calls update_from_config after the
    # process group, tokenizer and dataloader exist and before the model is built, the one
    # moment to report every problem of a job at once. Injected, so args import no checks.
    job_config_check: ClassVar[Callable[[Any, "GRTModelArgs"], None] | None] = None

    def update_from_config(self, job_config, **kwargs) -> None:
        """Apply `[grt]` overrides and `training.seq_len`, validate, then run `job_config_check`."""
        grt = getattr(job_config, "grt", None)
        if grt is not None:
            for name in CONFIGURABLE_FIELDS:
                value = getattr(grt, name, None)
                if value is not None:
                    setattr(self, name, value)
        if self.block_style == "llama":  # RoPE table long enough (gpt2 positions are learned)
            self.max_seq_len = max(self.max_seq_len, job_config.training.seq_len)
        self.validate(where=f"flavor {job_config.model.flavor!r} with [grt] overrides")
        if GRTModelArgs.job_config_check is not None:
            GRTModelArgs.job_config_check(job_config, self)

    # ---- FLOPs -----------------------------------------------------------------------

    def block_matmul_params(self) -> int:
        """Weights of one block that take part in a matmul (eq. 1 counts 12 d^2 for GPT-2)."""
        d = self.dim
        if self.block_style == "gpt2":
            return 12 * d * d
        kv_dim = (self.n_kv_heads or self.n_heads) * self.head_dim
        return 2 * d * d + 2 * d * kv_dim + 3 * d * self.ffn_hidden_dim

    def recurrence_matmul_params(self) -> int:
        """Matmul weights one step applies besides the core's blocks, per the parts:
        W_proj (2d x d) and the gate MLP (2d x d_gate, d_gate x d), 10 d^2 FLOPs for GRT;
        RRT's LoRA factors, r (4d + 2d + 5d + 5d) = 16 d r per core block."""
        d = self.dim
        gate_hidden = self.gate_hidden_dim or d
        params = 0
        if self.injection == "proj":
            params += 2 * d * d
        if self.update == "gate":
            params += 2 * d * gate_hidden + gate_hidden * d
        if self.step_adapter == "lora":
            params += self.n_core_layers * 16 * d * self.lora_rank
        return params

    def forward_flops_per_token(self, seq_len: int, recurrences: float | None = None, training: bool = False) -> float:
        """Eq. 1 at depth r, plus the LM head: (p + n r + c)(24 d^2 + 4 S d) + r 10 d^2 + 2 d V.

        10 d^2 is GRT's W_proj and gate; other parts change it (`recurrence_matmul_params`).

        For llama blocks 24 d^2 becomes 2x the block's matmul weights (SwiGLU, GQA).
        V is `padded_vocab_size` (what the head matmul computes), not the tokenizer's
        vocab_size; the two differ only with `vocab_multiple_of` > 1.
        `training`: the training forward, which differs for per-step readouts (Ouro).
        """
        r = self.expected_recurrences if recurrences is None else recurrences
        if not self.is_recurrent:
            r = 0.0
        elif self.router == "token_choice":
            return self._token_choice_forward_flops_per_token(seq_len, round(r))
        elif self.router != "none":
            return self._routed_forward_flops_per_token(seq_len, round(r))
        blocks = self.n_prelude_layers + self.n_core_layers * r + self.n_coda_layers
        per_block = 2 * self.block_matmul_params() + 4 * seq_len * self.dim
        return (
            blocks * per_block
            + r * 2 * self.recurrence_matmul_params()
            + 2 * self.dim * self.padded_vocab_size
            + self.exit_readout_flops_per_token(seq_len, r, training)
        )

    def exit_readout_flops_per_token(self, seq_len: int, recurrences: float, training: bool) -> float:
        """Ouro's extra forward FLOPs at depth r: the exit gate on every step (2 d each) and
        the readouts of steps 1..r-1 (coda: c (24 d^2 + 4 S d) each; training also the LM
        head, 2 d V each). Eval with exit_threshold = 1 is the plain forward (no extra)."""
        r = recurrences
        if not self.per_step_readout or r <= 0 or (not training and self.exit_threshold >= 1):
            return 0.0
        per_block = 2 * self.block_matmul_params() + 4 * seq_len * self.dim
        extra = (r - 1) * self.n_coda_layers * per_block + r * 2 * self.dim
        if training:
            extra += (r - 1) * 2 * self.dim * self.padded_vocab_size
        return extra

    def routed_step_flops_per_token(self, seq_len: int, r: int) -> list[float]:
        """MoR: the forward FLOPs of each step i < r, per token of the sequence: the core on the
        step's k_i tokens, n [(k_i / S) 2W + 4 (k_i^2 / S) d], and for expert choice also the
        step's router on its m_i candidates (m_0 = S, m_i = k_{i-1}), (m_i / S) 2 d.
        Expert choice: k_i = max(1, int(capacity_i S)); token choice: k_i = S (R - i) / R, balanced
        routing, pads not counted (its router runs once, before the steps, not in any step)."""
        S, d, weights = seq_len, self.dim, self.block_matmul_params()
        if self.router == "token_choice":
            kept = [share * S for share in self.token_choice_active_shares[:r]]
            routers = [0.0] * len(kept)
        else:
            kept = self.router_tokens_kept(S)[:r]
            routers = [(m / S) * 2 * d for m in [S] + kept[:-1]]
        return [
            self.n_core_layers * ((k / S) * 2 * weights + 4 * (k * k / S) * d) + router
            for k, router in zip(kept, routers)
        ]

    def _routed_forward_flops_per_token(self, seq_len: int, r: int) -> float:
        """MoR (docs/architecture.md): step i runs the core on its k_i routed tokens and its
        router on its m_i candidates (m_0 = S, m_i = k_{i-1}), per token of the sequence:
        (p + c)(2W + 4 S d) + n sum_{i<r} [(k_i / S) 2W + 4 (k_i^2 / S) d]
        + sum_{i<r} (m_i / S) 2 d + 2 d V, with W = block_matmul_params (12 d^2 for GPT-2)."""
        S, d, weights = seq_len, self.dim, self.block_matmul_params()
        return (
            (self.n_prelude_layers + self.n_coda_layers) * (2 * weights + 4 * S * d)
            + sum(self.routed_step_flops_per_token(S, r))
            + 2 * d * self.padded_vocab_size
        )

    def _token_choice_forward_flops_per_token(self, seq_len: int, r: int) -> float:
        """MoR token choice (docs/architecture.md), under balanced routing: step i runs the
        core on the k_i = S (R - i) / R tokens that chose a depth > i (pads not counted), and
        the router Linear(d, R) runs once on every token (not at r = 0), per token of the sequence:
        (p + c)(2W + 4 S d) + n sum_{i<r} [(k_i / S) 2W + 4 (k_i^2 / S) d] + 2 d R + 2 d V."""
        S, d, weights = seq_len, self.dim, self.block_matmul_params()
        return (
            (self.n_prelude_layers + self.n_coda_layers) * (2 * weights + 4 * S * d)
            + sum(self.routed_step_flops_per_token(S, r))
            + (2 * d * self.num_recurrences if r > 0 else 0)  # the router, skipped at r = 0
            + 2 * d * self.padded_vocab_size
        )

    def train_flops_per_token(self, seq_len: int, recurrences: float | None = None) -> float:
        """Forward + backward = 3x the training forward, torchtitan's convention (6N per
        token); with `backprop_recurrences` = k, the r - k steps before the last k run
        forward only (no backward: 2x their forward less). A routed step (MoR) runs on its
        k_i tokens only, so the untracked steps are the first r - k of
        `routed_step_flops_per_token`, not r - k whole steps; token choice's router runs
        before the steps, with its gradient, and stays in."""
        r = self.expected_recurrences if recurrences is None else recurrences
        flops = 3 * self.forward_flops_per_token(seq_len, r, training=True)
        k = self.backprop_recurrences
        if not self.is_recurrent or k is None or r <= k:
            return flops
        if self.router != "none":
            untracked = sum(self.routed_step_flops_per_token(seq_len, round(r))[: round(r) - k])
            return flops - 2 * untracked
        step = self.n_core_layers * (2 * self.block_matmul_params() + 4 * seq_len * self.dim)
        step += 2 * self.recurrence_matmul_params()
        return flops - 2 * (r - k) * step  # no backward for untracked steps

    def expected_train_flops_per_token(self, seq_len: int) -> float:
        """E_r[train_flops_per_token(S, r)] over the training depth distribution: what the
        logged MFU averages over the sampled depths (grt_titan/components/metrics.py).

        Not the FLOPs at E[r]: with truncated backprop (k) the count bends at r = k, so at
        E[r] it overstates Poisson's (k = 8) by 3.0% at small scale, 0.8% at large.
        Uniform: the mean over r_min..R; fixed: at R; Poisson (unbounded): the count is
        affine in r from r = k on, so the exact sum over P(r = j), j < k, plus that line
        at the mean of the rest (E[r] known).
        """
        if not self.is_recurrent or self.depth_sampling == "fixed":
            return self.train_flops_per_token(seq_len)
        if self.depth_sampling == "uniform":
            depths = range(self.min_recurrences, self.num_recurrences + 1)
            return sum(self.train_flops_per_token(seq_len, r) for r in depths) / len(depths)

        k = self.backprop_recurrences or 1  # without truncation the count is affine from r = 1
        head = heavy_tail_depth_probabilities(self.expected_recurrences, k)  # P(r = j), j = 1..k-1
        flops = [self.train_flops_per_token(seq_len, j) for j in range(1, k + 2)]  # r = 1..k+1
        slope = flops[k] - flops[k - 1]  # per step from r = k on
        tail_mass = 1.0 - sum(head)
        tail_mean_minus_k = self.expected_recurrences - sum(j * p for j, p in enumerate(head, 1)) - k * tail_mass
        return sum(f * p for f, p in zip(flops, head)) + tail_mass * flops[k - 1] + slope * tail_mean_minus_k

    def get_nparams_and_flops(self, model: nn.Module, seq_len: int) -> tuple[int, int]:
        """Stored parameters (a tied weight once) and training FLOPs/token, the expectation
        over the depth distribution (`expected_train_flops_per_token`): torchtitan fixes this
        at start-up, and it is the long-run value of the logged per-interval mean."""
        nparams = sum(p.numel() for p in model.parameters())
        return nparams, int(self.expected_train_flops_per_token(seq_len))

    def replace(self, **changes) -> "GRTModelArgs":
        return dataclasses.replace(self, **changes)
