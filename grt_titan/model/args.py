"""Configuration of the Gated Recurrent Transformer: its fields, the sizes derived from them,
the `[grt]` overrides (`update_from_config`) and the checks common to every method.

A field made with `setting` is a `[grt]` setting, declared once: its name, type, default and
help text; the `[grt]` section of both hosts, `CONFIGURABLE_FIELDS` and the HF config map are
derived from it (grt_titan/model/settings.py). The paper's settings and the parts' keys are
declared here; each method's own settings in its module (`METHOD_SETTINGS`, the args' bases).

Each part's rules and FLOPs term live in its method module (grt_titan/model/part.py,
docs/methods.md); the args iterate over the table of parts (grt_titan/model/part_table.py),
`GRTModelArgs.parts`, which grt_titan/model/__init__.py hands them. The FLOP count (paper eq. 1
and the parts' terms) is grt_titan/model/flops.py's; the args delegate to it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from torch import nn

from grt_titan.field_checks import field_problems

from . import flops
from .methods import MODULES, table
from .part import Bad, Part
from .settings import declared_settings, setting

BlockStyle = Literal["gpt2", "llama", "qwen3"]
# The depth curriculum's ramp (grt_titan/model/depth_law.py): p, or 1 - sqrt(1 - p), at p = step / N.
DepthCurriculumShape = Literal["linear", "1-sqrt"]
# The keys of the recurrence's parts (docs/methods.md, "The parts"): each allows the choices
# that the rows of the table of methods make (grt_titan/model/methods/table.py), GRT's first,
# so a method's row gives its key its new choice.
DepthSampling = Literal[table.choices("depth_sampling")]  # uniform, fixed, poisson_lognormal
Injection = Literal[table.choices("injection")]  # proj, none, deviation
Update = Literal[table.choices("update")]  # gate, overwrite, deviation
InitialState = Literal[table.choices("initial_state")]  # prelude, random, anchor
StepAdapter = Literal[table.choices("step_adapter")]  # none, lora
Objective = Literal[table.choices("objective")]  # final, exit_distribution
Router = Literal[table.choices("router")]  # none, expert_choice, token_choice

# The parts that make GRT itself (the other methods change some of them): its row's.
GRT_PARTS: dict[str, Any] = {
    name: table.GRT.parts[name]
    for name in ("injection", "update", "initial_state", "step_adapter", "objective", "router")
}
# Each method's own settings, declared in its module: the args' bases, which `[grt]` lists
# after the args' own settings (grt_titan/model/settings.py, `reading_order`).
METHOD_SETTINGS = tuple(module.SETTINGS for module in MODULES)


@dataclass
class GRTModelArgs(*METHOD_SETTINGS):
    """Architecture of one GRT flavor: `n_prelude_layers + n_core_layers x R + n_coda_layers`.

    A dense model is the same args with `n_core_layers = 0` (no projection, no gate).
    Names follow the paper: prelude, core, coda, gate, recurrence.
    What torchtitan 0.2.2 calls on model args (its BaseModelArgs, duck-typed):
    `update_from_config` and `get_nparams_and_flops`.
    """

    # The one field of torchtitan 0.2.2's BaseModelArgs, once our base class: run records,
    # flavor files and retrofit records hold it (dataclasses.asdict), and load with it.
    _enforced: str = "This field is used to enforce all fields have defaults."
    block_style: BlockStyle = setting(
        "gpt2",
        "Block style of the flavor's blocks: gpt2 (the paper's) or llama (torchtitan's).",
    )
    dim: int = 768
    n_heads: int = 12
    n_kv_heads: int | None = None  # llama style only (grouped-query attention)
    vocab_size: int = 50257  # the tokenizer's vocabulary (ids it can emit)
    # Rows of the embedding and head: padded_vocab_size. `[grt]` lists it after
    # backprop_recurrences (--help, run records), where the section first had it.
    vocab_multiple_of: int = setting(
        1,
        """Pad the embedding and LM head rows to a multiple of this (e.g. 128: GPT-2's 50257 ->
        50304), so tensor-parallel vocabulary shards are equal and the head matmul has an
        aligned size. The padded ids are never inputs or targets; their logits stay in the
        training softmax (as in nanoGPT / Megatron) and the Hugging Face export drops them.
        Default 1 (no padding); `vocab_size` stays the tokenizer's.""",
        listed_after="backprop_recurrences",
    )
    max_seq_len: int = 1024  # gpt2: learned positions; llama: RoPE table length
    norm_eps: float = 1e-5

    n_prelude_layers: int = 1
    n_core_layers: int = 1
    n_coda_layers: int = 1

    # Recurrence (paper section 3): r ~ Uniform{min..num_recurrences} per training forward.
    num_recurrences: int = setting(4, "R: the largest training depth and the default inference depth.")
    min_recurrences: int = setting(1, "r_min: training depths are drawn from Uniform{r_min..R}.")
    eval_recurrences: int | None = setting(None, "Depth used in eval mode (validation); default R.")
    depth_sampling: DepthSampling = setting(
        "uniform",
        """uniform: r ~ Uniform{r_min..R} per training forward; fixed: always R (ablations);
        poisson_lognormal: heavy-tail Poisson (Geiping et al. 2025), mean `depth_mean`.""",
    )
    # Exported as initial_state_seed: the seed of the HF model's eval-mode state table.
    depth_seed: int = setting(
        0,
        "Seed of the depth sequence; r of forward t is a function of (seed, t) alone.",
        hf="initial_state_seed",
    )
    depth_curriculum_steps: int = setting(
        0,
        """Depth curriculum (McLeish et al. 2025): over the first N optimizer steps the depth law
        ramps up from r_min (uniform: its maximum r_min -> R; fixed: the depth r_min -> R;
        poisson_lognormal: the mean r_min -> depth_mean), then stays. Counted in optimizer steps
        (each of [training] global_batch_size / (local_batch_size x data-parallel degree)
        forwards); 0 (default) = no curriculum. Refused on a dense model and with a router.""",
    )
    depth_curriculum_shape: DepthCurriculumShape = setting(
        "linear",
        """The ramp's shape at p = step / N: linear (default), p; or 1-sqrt, 1 - sqrt(1 - p) (slow
        first, cheaper); a depth bound is rounded up (McLeish et al.'s code offers both).""",
    )
    # Training forwards per optimizer step (the job's gradient accumulation), set by
    # `update_from_config`: forward t belongs to step t // forwards_per_step of the curriculum.
    forwards_per_step: int = 1

    state_noise_std: float = setting(0.1, "sigma_x of the state noise added before W_proj in training (paper: 0.1).")
    gate_noise_std: float = setting(0.1, "sigma_g of the per-scalar gate-logit noise in training (paper: 0.1).")
    gate_temperature: float = setting(1.0, "tau, divides the gate logits (paper: 1.0).", hf=True, hf_dense=True)
    gate_bias_init: float = setting(4.0, "Initial bias of the gate MLP's last layer (paper: +4, g ~ 0.98).")
    gate_hidden_dim: int | None = None  # d_gate; None means dim
    gate_override: float | None = setting(
        None,
        "Ablation: force the gate to this constant in [0, 1] (1 copies, 0 overwrites).",
        hf=True,
        hf_dense=True,
    )
    backprop_recurrences: int | None = setting(
        None,
        """Truncated backprop through depth: gradients flow through the last k steps only
        (the earlier ones run without autograd); unset = through all r steps.""",
    )

    # Parts of the recurrence (GRT: proj, gate, prelude, uniform, none, final, none).
    injection: Injection = setting(
        "proj",
        """proj: the step's input is W_proj [h + eps_x ; h_pre] (GRT eq. 2, Huginn's adapter);
        none: h + eps_x, the prelude output is not re-injected; deviation: h - h*, the deviation
        from SCSE's anchor (with update and initial_state of the same row, docs/methods.md).""",
        hf=True,
    )
    update: Update = setting(
        "gate",
        """gate: h <- g h + (1 - g) o (GRT eq. 4); overwrite: h <- o; deviation: SCSE's
        h <- h + m s (o - (h - h*)), m = 0 for a sequence at its anchor.""",
        hf=True,
    )
    initial_state: InitialState = setting(
        "prelude",
        """prelude: h_0 = h_pre (GRT); random: a fresh TruncNormal(0, initial_state_std) state
        every forward (heavy-tail Poisson); anchor: SCSE's learned anchor h* = e + a A e and
        h_0 = e + b B e from the prelude output e.""",
        hf=True,
    )
    step_adapter: StepAdapter = setting(
        "none",
        """lora: one LoRA adapter per (core block, recurrence step) on every linear of the core
        (Relaxed Recursive Transformers); the depth is then fixed to R.""",
        hf=True,
    )
    objective: Objective = setting(
        "final",
        """final: cross-entropy at the last step; exit_distribution: Ouro's expected loss over a
        learned exit distribution minus exit_entropy_weight x its entropy.""",
        hf=True,
    )
    step_supervision: bool = setting(
        False,
        """Per-step supervision (docs/tasks.md): training reads out every recurrence step t and
        trains it toward the record's t-th step target (prompt/completion data with `steps`);
        steps past the last target keep the final answer. Default false.""",
    )
    router: Router = setting(
        "none",
        """expert_choice: Mixture-of-Recursions, a router per step picks the tokens it updates;
        token_choice: MoR's token choice, one router picks each token's number of steps.""",
        hf=True,
    )

    # llama style (grt_titan/model/blocks/llama.py, torchtitan 0.2.2's llama3 block)
    multiple_of: int = 256
    ffn_dim_multiplier: float | None = None
    rope_theta: float = 10000.0

    # Explicit sizes of a model retrofitted from a Hugging Face source (grt_titan/hf/retrofit.py);
    # None keeps the derivation of the properties below (every flavor, old checkpoints and TOMLs).
    ffn_dim: int | None = None  # MLP hidden size; None: ffn_hidden_dim's derivation
    attention_head_dim: int | None = None  # per-head width; None: dim // n_heads (qwen3: explicit)
    tie_word_embeddings: bool | None = None  # None: tied for gpt2 blocks, untied otherwise
    # llama RoPE scaling [factor, low_freq_factor, high_freq_factor, original_max_position_embeddings]
    # (blocks/llama.py's RoPEScalingArgs); None: its default (8, 1, 4, 8192), torchtitan's; factor 1: none.
    rope_scaling: list[float] | None = None

    @property
    def is_recurrent(self) -> bool:
        return self.n_core_layers > 0

    @property
    def method_name(self) -> str:
        """The row of the paper's table 1 (or figure 5's ladder) that these parts make:
        a lookup in grt_titan/model/methods/table.py."""
        return table.method_name(self)

    @property
    def non_grt_parts(self) -> dict[str, Any]:
        """The parts set to something other than GRT's (empty for GRT and dense models)."""
        if not self.is_recurrent:
            return {}
        return {name: getattr(self, name) for name, default in GRT_PARTS.items() if getattr(self, name) != default}

    # The table of parts (grt_titan/model/part_table.py), handed over by grt_titan/model/__init__.py.
    parts: ClassVar[tuple[Part, ...]] = ()

    @property
    def active_parts(self) -> list[Part]:
        """The parts these args select, in the table's order (none for a dense model)."""
        return [part for part in self.parts if part.active(self)]

    def part(self, key: str) -> Part | None:
        """The active part of `[grt]` key `key`, None if its choice has none (or the model is dense)."""
        return next((part for part in self.active_parts if part.key == key), None)

    @property
    def extrapolates(self) -> bool:
        """Depths above R are defined: no per-step module (MoR's routers, RRT's adapters)."""
        return not any(part.per_step for part in self.active_parts)

    @property
    def per_step_readout(self) -> bool:
        """Every recurrence step is read out through coda, norm and head (Ouro)."""
        return any(part.reads_every_step for part in self.active_parts)

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
        """MLP hidden size: `ffn_dim` if set; else 4d for gpt2, for llama exactly as its
        FeedForward (blocks/llama.py's LlamaFeedForward) computes it."""
        if self.ffn_dim is not None:
            return self.ffn_dim
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
        return self.dim // self.n_heads if self.attention_head_dim is None else self.attention_head_dim

    @property
    def tie_embeddings(self) -> bool:
        # The paper's nanoGPT blocks tie the LM head to the embedding; llama does not
        # (unless `tie_word_embeddings` says otherwise: a retrofitted source's own choice).
        if self.tie_word_embeddings is not None:
            return self.tie_word_embeddings
        return self.block_style == "gpt2"

    @property
    def expected_recurrences(self) -> float:
        """Mean training depth E[r] of the configured depth law (0 for a dense model)."""
        return self.part("depth_sampling").mean_depth(self) if self.is_recurrent else 0.0

    @property
    def unrolled_layers(self) -> int:
        """Block executions of a forward at depth R: p + n*R + c."""
        return self.n_prelude_layers + self.n_core_layers * self.num_recurrences + self.n_coda_layers

    def validate(self, where: str = "model args") -> None:
        """Raise ValueError naming the offending field and what is allowed: the fields' types
        and choices, the sizes, the depth, then each part's rules (`Part.validate`)."""

        def bad(field: str, value, allowed: str) -> ValueError:
            return ValueError(f"{where}: {field} = {value!r} is invalid; {allowed}")

        if not self.parts:
            raise RuntimeError(
                "GRTModelArgs.parts is empty: import grt_titan.model (its __init__.py hands over the table of parts)"
            )
        # Types and Literal choices first (TOML values are not type-checked by torchtitan),
        # NaN/inf floats too.
        problems = field_problems(self, f"{where}:")
        if problems:
            raise ValueError(problems[0])
        self._validate_sizes(bad)
        if self.is_recurrent:
            self._validate_depth(bad)
        for part in self.parts:
            part.validate(self, bad)

    def _validate_sizes(self, bad: Bad) -> None:
        for name in ("dim", "n_heads", "vocab_size", "vocab_multiple_of", "max_seq_len"):
            if getattr(self, name) < 1:
                raise bad(name, getattr(self, name), "must be >= 1")
        if self.attention_head_dim is None and self.dim % self.n_heads:
            raise bad("dim", self.dim, f"must be divisible by n_heads = {self.n_heads}")
        self._validate_explicit_sizes(bad)
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

    def _validate_explicit_sizes(self, bad: Bad) -> None:
        """The retrofit fields (ffn_dim, attention_head_dim, rope_scaling): what the blocks support."""
        if self.ffn_dim is not None and self.ffn_dim < 1:
            raise bad("ffn_dim", self.ffn_dim, "must be >= 1 or unset")
        if self.attention_head_dim is not None:
            if self.attention_head_dim < 2 or self.attention_head_dim % 2:
                raise bad("attention_head_dim", self.attention_head_dim, "must be an even number >= 2 or unset")
            if self.block_style != "qwen3" and self.attention_head_dim * self.n_heads != self.dim:
                raise bad(
                    "attention_head_dim",
                    self.attention_head_dim,
                    f"must be dim // n_heads = {self.dim // self.n_heads} for {self.block_style} blocks "
                    "(only qwen3 blocks have an explicit head width)",
                )
        if self.rope_scaling is not None:
            if self.block_style != "llama":
                raise bad("rope_scaling", self.rope_scaling, "is a llama-blocks setting (unset for gpt2 and qwen3)")
            if len(self.rope_scaling) != 4 or min(self.rope_scaling) <= 0:
                raise bad(
                    "rope_scaling",
                    self.rope_scaling,
                    "must be 4 positive numbers [factor, low_freq_factor, high_freq_factor, "
                    "original_max_position_embeddings]",
                )
            if self.rope_scaling[1] >= self.rope_scaling[2]:
                raise bad("rope_scaling", self.rope_scaling, "needs low_freq_factor < high_freq_factor")

    def _validate_depth(self, bad: Bad) -> None:
        """The recurrence's depth, noise and truncation, whatever its parts."""
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
        if self.backprop_recurrences is not None and self.backprop_recurrences < 1:
            raise bad("backprop_recurrences", self.backprop_recurrences, "must be >= 1 or unset")

    def update_from_config(self, job_config, **kwargs) -> None:
        """Apply `[grt]` overrides and `training.seq_len`, then validate. What a host knows of
        the whole job (forwards per step, the start-up checks) it adds itself: torchtitan
        0.2.2's `JobModelArgs` (grt_titan/spec.py), 0.3's model config (torchtitan_0_3/model.py)."""
        grt = getattr(job_config, "grt", None)
        if grt is not None:
            for name in CONFIGURABLE_FIELDS:
                value = getattr(grt, name, None)
                if value is not None:
                    setattr(self, name, value)
        if self.block_style != "gpt2":  # RoPE table long enough (gpt2 positions are learned)
            self.max_seq_len = max(self.max_seq_len, job_config.training.seq_len)
        self.validate(where=f"flavor {job_config.model.flavor!r} with [grt] overrides")

    # ---- FLOPs: grt_titan/model/flops.py (eq. 1 plus each active part's term) -------------

    def forward_flops_per_token(self, seq_len: int, recurrences: float | None = None, training: bool = False) -> float:
        """Forward FLOPs per token at depth r (default E[r]): `flops.forward_flops_per_token`."""
        return flops.forward_flops_per_token(self, seq_len, recurrences, training)

    def train_flops_per_token(self, seq_len: int, recurrences: float | None = None) -> float:
        """Training FLOPs per token at depth r (default E[r]): `flops.train_flops_per_token`."""
        return flops.train_flops_per_token(self, seq_len, recurrences)

    def expected_train_flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token over the depth law: `flops.expected_train_flops_per_token`."""
        return flops.expected_train_flops_per_token(self, seq_len)

    def get_nparams_and_flops(self, model: nn.Module, seq_len: int) -> tuple[int, int]:
        """torchtitan's start-up numbers: `flops.nparams_and_flops`."""
        return flops.nparams_and_flops(self, model, seq_len)

    def replace(self, **changes) -> "GRTModelArgs":
        return dataclasses.replace(self, **changes)


# The fields that the `[grt]` TOML section may override, the declared settings (`setting`
# above, grt_titan/model/settings.py), in `[grt]`'s order: `GRTSection` (grt_titan/sections.py)
# is made of them, and it is `grt-titan table`'s settings order.
CONFIGURABLE_FIELDS = tuple(f.name for f, _ in declared_settings(GRTModelArgs))
