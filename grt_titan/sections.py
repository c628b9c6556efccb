"""The grt_titan TOML sections, declared once for every host (docs/training.md).

`[grt]`, `[data]`, `[distill]`, `[loss_spike]`, `[grt_metrics]` and the fields grt_titan adds
to torchtitan's `[model]`, `[optimizer]`, `[training]` and `[checkpoint]`. Plain dataclasses
that import no torchtitan: torchtitan 0.2.2 merges them into its JobConfig
(grt_titan/job_config.py), torchtitan 0.3 holds them in grt_titan's `Trainer.Config`
(grt_titan/torchtitan_0_3/). Every `[grt]` model field defaults to None, meaning "keep the
flavor's value"; set values are validated at start-up by `GRTModelArgs.update_from_config`,
with the key named in the error.

No `from __future__ import annotations` here: both hosts' parsers resolve these types.
"""

from dataclasses import dataclass, field
from typing import Literal

from grt_titan.model.args import (
    BlockStyle,
    DepthCurriculumShape,
    DepthSampling,
    InitialState,
    Injection,
    Objective,
    Router,
    RouterInference,
    RouterUpdate,
    StepAdapter,
    Update,
)
from grt_titan.tokenizer import GPT2_TIKTOKEN_PATH

# torchtitan's registered name of the float8 linear converter ([model] converters).
FLOAT8_CONVERTER = "quantize.linear.float8"

RecurrenceCheckpoint = Literal["block", "step"]
DistillLoss = Literal["forward_kl"]


@dataclass
class GRTSection:
    """The `[grt]` TOML section: model overrides (unset keeps the flavor's value) and how the
    recurrence is checkpointed and sharded. (Not the Hugging Face `GRTConfig` of exports.)"""

    block_style: BlockStyle | None = None
    """Block style of the flavor's blocks: gpt2 (the paper's) or llama (torchtitan's)."""

    num_recurrences: int | None = None
    """R: the largest training depth and the default inference depth."""

    min_recurrences: int | None = None
    """r_min: training depths are drawn from Uniform{r_min..R}."""

    eval_recurrences: int | None = None
    """Depth used in eval mode (validation); default R."""

    depth_sampling: DepthSampling | None = None
    """uniform: r ~ Uniform{r_min..R} per training forward; fixed: always R (ablations);
    poisson_lognormal: heavy-tail Poisson (Geiping et al. 2025), mean `depth_mean`."""

    depth_seed: int | None = None
    """Seed of the depth sequence; r of forward t is a function of (seed, t) alone."""

    depth_curriculum_steps: int | None = None
    """Depth curriculum (McLeish et al. 2025): over the first N optimizer steps the depth law
    ramps up from r_min (uniform: its maximum r_min -> R; fixed: the depth r_min -> R;
    poisson_lognormal: the mean r_min -> depth_mean), then stays. Counted in optimizer steps
    (each of [training] global_batch_size / (local_batch_size x data-parallel degree)
    forwards); 0 (default) = no curriculum. Refused on a dense model and with a router."""

    depth_curriculum_shape: DepthCurriculumShape | None = None
    """The ramp's shape at p = step / N: linear (default), p; or 1-sqrt, 1 - sqrt(1 - p) (slow
    first, cheaper); a depth bound is rounded up (McLeish et al.'s code offers both)."""

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

    # ---- parts of the recurrence: each method and ablation rung is one choice of these
    # (docs/architecture.md, "Methods as parts"; train_configs/paper/ sets them per row).

    injection: Injection | None = None
    """proj: the step's input is W_proj [h + eps_x ; h_pre] (GRT eq. 2, Huginn's adapter);
    none: h + eps_x, the prelude output is not re-injected; deviation: h - h*, the deviation
    from SCSE's anchor (with update and initial_state of the same row, docs/methods.md)."""

    update: Update | None = None
    """gate: h <- g h + (1 - g) o (GRT eq. 4); overwrite: h <- o; deviation: SCSE's
    h <- h + m s (o - (h - h*)), m = 0 for a sequence at its anchor."""

    initial_state: InitialState | None = None
    """prelude: h_0 = h_pre (GRT); random: a fresh TruncNormal(0, initial_state_std) state
    every forward (heavy-tail Poisson); anchor: SCSE's learned anchor h* = e + a A e and
    h_0 = e + b B e from the prelude output e."""

    initial_state_std: float | None = None
    """Std of the random initial state (default 0.02, cut at 3 std)."""

    depth_mean: float | None = None
    """poisson_lognormal depth sampling: the mean training depth E[r]; default the uniform
    sampler's (r_min + R) / 2, so both spend the same expected compute."""

    anchor_scale: float | None = None
    """SCSE: a, the anchor's scale in h* = e + a A e (default 0.1)."""

    initial_deviation_scale: float | None = None
    """SCSE: b, the initial state's scale in h_0 = e + b B e (default 0.1)."""

    deviation_step_size: float | None = None
    """SCSE: s, the step's scale in Delta <- Delta + m s G(Delta) (default 0.5)."""

    deviation_mask_eps: float | None = None
    """SCSE: epsilon of the zero-deviation mask m = 1{||Delta||_F^2 > epsilon}, per sequence
    (default 1e-8)."""

    step_adapter: StepAdapter | None = None
    """lora: one LoRA adapter per (core block, recurrence step) on every linear of the core
    (Relaxed Recursive Transformers); the depth is then fixed to R."""

    lora_rank: int | None = None
    """Rank of each per-step LoRA adapter (default 64)."""

    lora_scale: float | None = None
    """Output scale alpha / rank of the LoRA adapters (default 2)."""

    objective: Objective | None = None
    """final: cross-entropy at the last step; exit_distribution: Ouro's expected loss over a
    learned exit distribution minus exit_entropy_weight x its entropy."""

    exit_entropy_weight: float | None = None
    """Ouro: beta, the weight of the exit distribution's entropy (default 0.05)."""

    exit_threshold: float | None = None
    """Ouro inference: exit at the first step whose cumulative exit probability >= this
    (default 1.0: run every step)."""

    step_supervision: bool | None = None
    """Per-step supervision (docs/tasks.md): training reads out every recurrence step t and
    trains it toward the record's t-th step target (prompt/completion data with `steps`);
    steps past the last target keep the final answer. Default false."""

    step_supervision_steps: int | None = None
    """With step_supervision: per-step supervision for the first N optimizer steps, then the
    final answer alone for the rest of the run (the outcome-only annealing of arXiv 2608.11233);
    0 (default): per-step supervision throughout (docs/tasks.md)."""

    router: Router | None = None
    """expert_choice: Mixture-of-Recursions, a router per step picks the tokens it updates;
    token_choice: MoR's token choice, one router picks each token's number of steps."""

    router_capacity: list[float] | None = None
    """MoR: share of the tokens each step keeps, one float per step, non-increasing, in (0, 1]
    (TOML `[1.0, 0.75, 0.5, 0.25]`, command line `--grt.router_capacity 1 0.75 0.5 0.25`);
    default (R - i) / R."""

    router_scale: float | None = None
    """MoR: alpha; a selected token's update is scaled by sigmoid(router logit) x alpha (0.1)."""

    router_aux_weight: float | None = None
    """MoR: weight of the router's BCE auxiliary loss (0.001)."""

    router_balance_weight: float | None = None
    """MoR token choice: weight of the balancing loss R sum_j P_j f_j (0.1)."""

    router_z_loss_weight: float | None = None
    """MoR token choice: weight of the router z-loss, mean logsumexp(logits)^2 (0: off)."""

    router_inference: RouterInference | None = None
    """MoR in eval mode (validation, `grt-titan analyze`): `top_k` (default) routes as in
    training, top-k of the sequence per step, so validation loss matches the training rule
    but is not causal; `threshold` sends a token on to step i while it was active at step
    i-1 and sigmoid(router logit) > 0.5, causal (what generation uses; eager only: refused
    with [compile] enable and validation on). Training always uses top_k
    (docs/architecture.md)."""

    router_update: RouterUpdate | None = None
    """MoR expert choice: a routed token's update with router weight g. `delta` (default):
    h + g (core(h) - h), the paper's H + g f(H); `block`: h + g core(h) = (1 + g) h + g f(h),
    the released code's `x + g * Block(x)` (its Block holds the residual), which the MoR TOMLs
    of train_configs/paper/ use (docs/architecture.md, "Mixture-of-Recursions")."""

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
class GRTTrainingConfig:
    """Fields grt_titan adds to torchtitan's `[training]` section (merged into it)."""

    trainable: list[str] = field(default_factory=lambda: ["*"])
    """Parameters the optimizer trains: fnmatch patterns over the model's parameter names
    (`recurrence.step.gate.*`) or the shorthands `recurrent` (W_proj, the gate and the core),
    `parts` (the recurrence outside the core: W_proj and the gate) and `adapter` (RRT's
    per-step adapters). Every other parameter is frozen: bitwise unchanged, outside the
    optimizer and its checkpointed state, still in the model checkpoint and the export
    (docs/training.md). Default: every parameter."""


@dataclass
class GRTCheckpointConfig:
    """Fields grt_titan adds to torchtitan's `[checkpoint]` section (merged into it); they act
    only under `python -m grt_titan.train` (docs/reliability.md)."""

    checksums: bool = True
    """Save a CRC32 of every shard file with each checkpoint (inside DCP's commit) and verify
    them before loading: a corrupted checkpoint is named and the previous complete one is
    loaded instead. Costs one read of the written files at save and of the loaded ones at
    load (docs/benchmarks.md)."""


@dataclass
class LossSpikeConfig:
    """The `[loss_spike]` TOML section: rewind to the last checkpoint at a loss spike and skip
    the batches at it (docs/reliability.md). Acts only under `python -m grt_titan.train`."""

    enable: bool = False
    """Check every step's training loss before the optimizer step."""

    factor: float = 2.0
    """A step is a spike when its loss exceeds factor x the median of the last `window`
    steps' losses (or is NaN/inf)."""

    window: int = 50
    """Steps in the running median; no relative check until that many steps are known (the
    median's history is saved in the checkpoint)."""

    skip_batches: int = 10
    """Global batches skipped from the spike's batch on, after rewinding (>= 1)."""

    max_rewinds: int = 3
    """Give up (stop with an error) at the spike after this many rewinds of the run."""


@dataclass
class DistillConfig:
    """The `[distill]` TOML section: a frozen teacher's logits as a second training signal
    (docs/distillation.md). Off while `teacher` is empty; the student's loss per token is
    (1 - alpha) CE + alpha T^2 KL(teacher_T || student_T), averaged like the CE."""

    teacher: str = ""
    """The teacher: a torchtitan checkpoint step folder (or a checkpoint folder: its latest
    complete step) with `teacher_config`, or a Hugging Face folder that `grt-titan import-hf`
    reads (a grt_titan export, a stock GPT-2 / Llama folder). Empty: no distillation."""

    teacher_config: str = ""
    """The teacher's training TOML when `teacher` is a torchtitan checkpoint (its flavor and
    `[grt]` overrides give the architecture); unused for a Hugging Face folder."""

    alpha: float = 0.5
    """Weight of the KD term, in [0, 1]: 0 trains on CE alone (the teacher only logged),
    1 on the KD term alone."""

    temperature: float = 1.0
    """T > 0: both distributions are softmax(logits / T); the KD term is scaled by T^2 so
    its gradient keeps the CE's magnitude as T changes (Hinton et al. 2015)."""

    loss: DistillLoss = "forward_kl"
    """forward_kl: KL(teacher || student) over the full (padded) vocabulary, per token."""


@dataclass
class GRTModelDefaults:
    """grt_titan's defaults for torchtitan's `[model]` section (merged into it)."""

    hf_assets_path: str = str(GPT2_TIKTOKEN_PATH)
    """Tokenizer: a `.tiktoken` rank file or a folder holding one, or a Hugging Face
    tokenizer folder holding `tokenizer.json` (Llama 3.x, Qwen3; docs/data.md). Default:
    the GPT-2 ranks shipped in the package. torchtitan's own default,
    `./tests/assets/tokenizer`, does not exist outside torchtitan's repository, and its
    config loader warns about it on every run."""


# Parallelisms the GRT has on neither host, and why: refused at start-up in one line
# (`unsupported_degree`), by 0.2.2's config checks and 0.3's recipe alike.
UNSUPPORTED_DEGREES = {
    "pipeline_parallel_degree": "the shared core cannot be split across stages",
    "context_parallel_degree": "the GRT's plans do not shard attention over context",
    "expert_parallel_degree": "the GRT has no experts",
}


def unsupported_degree(key: str, value: int) -> str:
    """The start-up line for `[parallelism] key = value` of `UNSUPPORTED_DEGREES`."""
    return f"[parallelism] {key} = {value} is not supported ({UNSUPPORTED_DEGREES[key]}); allowed: 1"


def fault_tolerance_enabled(job_config) -> bool:
    """`[fault_tolerance] enable`: False for a config without the section (a test's stand-in)."""
    ft = getattr(job_config, "fault_tolerance", None)
    return ft is not None and bool(ft.enable)
