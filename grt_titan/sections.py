"""The grt_titan TOML sections, declared once for every host (docs/training.md).

`[grt]`, `[data]`, `[distill]`, `[loss_spike]`, `[grt_metrics]` and the fields grt_titan adds
to torchtitan's `[model]`, `[optimizer]`, `[training]` and `[checkpoint]`. Plain dataclasses
that import no torchtitan: torchtitan 0.2.2 merges them into its JobConfig
(grt_titan/job_config.py), torchtitan 0.3 holds them in grt_titan's `Trainer.Config`
(grt_titan/torchtitan_0_3/). The `[grt]` model keys are made from the settings' one
declaration beside `GRTModelArgs` (grt_titan/model/settings.py); each defaults to None, meaning
"keep the flavor's value"; set values are validated at start-up by
`GRTModelArgs.update_from_config`, with the key named in the error.

No `from __future__ import annotations` here: both hosts' parsers resolve these types.
"""

import typing
from dataclasses import dataclass, field, make_dataclass
from typing import Annotated, Literal

from typing_extensions import Doc

from grt_titan.model.args import GRTModelArgs
from grt_titan.model.settings import declared_settings
from grt_titan.tokenizer import GPT2_TIKTOKEN_PATH

# torchtitan's registered name of the float8 linear converter ([model] converters).
FLOAT8_CONVERTER = "quantize.linear.float8"

RecurrenceCheckpoint = Literal["block", "step"]
DistillLoss = Literal["forward_kl"]


def settings_section(args_cls: type) -> type:
    """The model keys of `[grt]`: each declared setting of `args_cls` (grt_titan/model/settings.py),
    of its type or None (keep the flavor's value), with its declared help as both hosts' `--grt.*`
    help (tyro reads PEP 727's `Doc`)."""
    hints = typing.get_type_hints(args_cls)
    keys = [(f.name, Annotated[hints[f.name] | None, Doc(s.help)], None) for f, s in declared_settings(args_cls)]
    cls = make_dataclass("GRTModelSettings", keys)
    cls.__module__ = __name__  # make_dataclass's `module` argument needs Python 3.12
    return cls


GRTModelSettings = settings_section(GRTModelArgs)


@dataclass
class GRTSection(GRTModelSettings):
    """The `[grt]` TOML section: model overrides (unset keeps the flavor's value) and how the
    recurrence is checkpointed and sharded. (Not the Hugging Face `GRTConfig` of exports.)"""

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
    load (docs/results/cpu_speed.md, "Checkpoint checksums")."""


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
