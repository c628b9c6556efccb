"""The `[grt]` and `[data]` TOML sections, merged into torchtitan's JobConfig.

No `from __future__ import annotations` here: torchtitan resolves these types at parse time.

Selected with `[job] custom_config_module = "grt_titan.job_config"` (torchtitan 0.2.2's
`experimental.custom_args_module` route rejects new sections). Every `[grt]` model field
defaults to None, meaning "keep the flavor's value"; set values are validated at start-up
by `GRTModelArgs.update_from_config`, with the key named in the error.
"""


from dataclasses import dataclass, field
from typing import Literal

from grt_titan.data.config import DataConfig
from grt_titan.tokenizer import GPT2_TIKTOKEN_PATH


# torchtitan's registered name of the float8 linear converter ([model] converters).
FLOAT8_CONVERTER = "quantize.linear.float8"

RecurrenceCheckpoint = Literal["block", "step"]


@dataclass
class GRTSection:
    """The `[grt]` TOML section: model overrides (unset keeps the flavor's value) and how the
    recurrence is checkpointed and sharded. (Not the Hugging Face `GRTConfig` of exports.)"""

    block_style: Literal["gpt2", "llama"] | None = None
    """Block style of the flavor's blocks: gpt2 (the paper's) or llama (torchtitan's)."""

    num_recurrences: int | None = None
    """R: the largest training depth and the default inference depth."""

    min_recurrences: int | None = None
    """r_min: training depths are drawn from Uniform{r_min..R}."""

    eval_recurrences: int | None = None
    """Depth used in eval mode (validation); default R."""

    depth_sampling: Literal["uniform", "fixed"] | None = None
    """uniform: r ~ Uniform{r_min..R} per training forward; fixed: always R (ablations)."""

    depth_seed: int | None = None
    """Seed of the depth sequence; r of forward t is a function of (seed, t) alone."""

    state_noise_std: float | None = None
    """sigma_x of the state noise added before W_proj in training (paper: 0.1)."""

    gate_noise_std: float | None = None
    """sigma_g of the per-scalar gate-logit noise in training (paper: 0.1)."""

    gate_temperature: float | None = None
    """tau, divides the gate logits (paper: 1.0)."""

    gate_bias_init: float | None = None
    """Initial bias of the gate MLP's last layer (paper: +4, g ~ 0.98)."""

    gate_override: float | None = None
    """Ablation: force the gate to this constant in [0, 1] (1 copies, 0 overwrites)."""

    backprop_recurrences: int | None = None
    """Truncated backprop through depth: gradients flow through the last k steps only
    (the earlier ones run without autograd); unset = through all r steps."""

    vocab_multiple_of: int | None = None
    """Pad the embedding and LM head rows to a multiple of this (e.g. 128: GPT-2's 50257 ->
    50304), so tensor-parallel vocabulary shards are equal and the head matmul has an
    aligned size. The padded ids are never inputs or targets; their logits stay in the
    training softmax (as in nanoGPT / Megatron) and the Hugging Face export drops them.
    Default 1 (no padding); `vocab_size` stays the tokenizer's."""

    recurrence_checkpoint: RecurrenceCheckpoint = "block"
    """With [activation_checkpoint] mode != none: `block` applies torchtitan's mode to every
    prelude, core and coda block; `step` checkpoints each recurrence step (W_proj + core +
    gate) as one region, so only the state between steps is kept."""

    core_reshard_after_forward: bool = False
    """FSDP: False keeps the gathered core for the backward (one all-gather per step);
    True frees it after the forward and gathers it again in backward (less memory)."""


@dataclass
class GRTMetricsConfig:
    """The `[grt_metrics]` TOML section (docs/observability.md)."""

    enable: bool = True
    """Log per-recurrence-step gate statistics and the update ratio on log steps
    (`metrics.log_freq`). False installs no hook: zero cost."""

    validation_depths: bool = True
    """At each validation also evaluate every depth r in {0..R, R+2} and log
    `validation_metrics/loss_r{r}`, `validation_metrics/flops_per_token_r{r}` and a plot.
    Costs R/2 + 2 to R + 2 times a plain validation (docs/observability.md)."""


@dataclass
class GRTOptimizerConfig:
    """Fields grt_titan adds to torchtitan's `[optimizer]` section (merged into it).

    They live there, not in `[grt]`, because the spec's optimizer builder receives only the
    `[optimizer]` section (docs/reliability.md).
    """

    on_nonfinite: Literal["stop", "skip"] = "stop"
    """A step whose gradient norm is NaN or inf (a non-finite loss makes it so): `stop`
    raises before the optimizer step, naming the step, so no NaN weight reaches a
    checkpoint; `skip` leaves parameters and optimizer state unchanged for that step, logs a
    warning naming it and trains on (the learning-rate schedule still advances)."""


@dataclass
class GRTModelDefaults:
    """grt_titan's defaults for torchtitan's `[model]` section (merged into it)."""

    hf_assets_path: str = str(GPT2_TIKTOKEN_PATH)
    """Tokenizer: a `.tiktoken` rank file or a folder holding one (docs/data.md). Default:
    the GPT-2 ranks shipped in the package. torchtitan's own default,
    `./tests/assets/tokenizer`, does not exist outside torchtitan's repository, and its
    config loader warns about it on every run."""


@dataclass
class JobConfig:
    model: GRTModelDefaults = field(default_factory=GRTModelDefaults)
    grt: GRTSection = field(default_factory=GRTSection)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: GRTOptimizerConfig = field(default_factory=GRTOptimizerConfig)
    grt_metrics: GRTMetricsConfig = field(default_factory=GRTMetricsConfig)
