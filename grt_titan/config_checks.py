"""Start-up checks of a whole job config against the model it builds (docs/reliability.md).

`check_job_config` runs at the end of the spec's `JobModelArgs.update_from_config`
(grt_titan/spec.py), i.e. where torchtitan 0.2.2's Trainer turns the flavor into
model args: after
the process group, the tokenizer and the training dataloader exist, before the model, its
parallel plans, the optimizer, the checkpointer or the validator are built. Every problem found is reported
in one `ValueError`, one line per problem, each naming the TOML key (`[section] key`) and
what is allowed, instead of an assertion or a traceback from deep inside torch later.
That includes the checkpoint a resume would load: one holding only the model weights
(torchtitan's model-only last save) is reported here, not by DCP at load time; and the
`[checkpoint] initial_load_path` a fresh start would load, which must be a checkpoint
(otherwise DCP or torchtitan's loader would fail after the model is built).

Each feature's checks live with the feature (named in `shared_problems` and
`check_job_config`, which keep their order): the parallelism's in infra/parallel_checks.py,
float8's and the converters' in infra/float8_checks.py, `[training] trainable`'s in
infra/trainable.py, the datasets' and the vocabulary's in data/checks.py, `[distill]`'s in
teacher.py, what torchtitan's own trainer would skip in components/plain_trainer.py, the
checkpoint a start or a resume loads in checkpoints/start_load.py. Here: the order, the
one-line report, the sections' types and values, and the parts' rules on the job's settings.

`shared_problems` are the checks that hold on both hosts: torchtitan 0.3 runs them on its
config's 0.2.2-shaped view (grt_titan/torchtitan_0_3/checks.py). The rest are 0.2.2's alone
(its launchers, converter registry, degrees, DDP, teacher and the parts' rules, which 0.3
checks elsewhere); what only 0.2.2 has is imported inside the function that reads it.

`Flavors` is the spec's flavor table: an unknown `[model] flavor` raises the same kind of
error naming the known flavors (torchtitan looks the flavor up before update_from_config).
"""

from __future__ import annotations

import dataclasses

from grt_titan.checkpoints.start_load import initial_load_problems, resume_problems
from grt_titan.components.loss_spike import config_problems as loss_spike_problems
from grt_titan.components.plain_trainer import (
    plain_trainer_fault_tolerance_problems,
    plain_trainer_initial_load_problems,
)
from grt_titan.data.checks import dataset_problems, vocab_problems
from grt_titan.field_checks import field_problems
from grt_titan.infra.float8_checks import converter_problems, float8_problems
from grt_titan.infra.parallel_checks import (
    data_parallel_problems,
    data_parallel_shard,
    ddp_problems,
    degree_problems,
    sequence_problems,
    tensor_parallel_problems,
)
from grt_titan.infra.trainable import job_trainable_problems
from grt_titan.model.flavors import flavor_from_file
from grt_titan.model.part import JobSettings

OPTIMIZERS = ("Adam", "AdamW")  # what torchtitan 0.2.2's build_optimizers knows


class UnknownFlavorError(KeyError, ValueError):
    """`[model] flavor` is not in the table (a KeyError for Mapping semantics, a ValueError
    like every other config error)."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0])


class Flavors(dict):
    """The spec's `model_args`: a dict whose missing keys name the allowed flavors."""

    def __missing__(self, key):
        try:  # a flavor file (`grt-titan retrofit`'s model_args.json): a fresh copy per lookup
            args = flavor_from_file(key)
        except ValueError as e:
            raise UnknownFlavorError(str(e)) from None
        if args is not None:
            return args
        raise UnknownFlavorError(f"[model] flavor = {key!r} is not a grt flavor; allowed: {', '.join(sorted(self))}")


def _sections(config, prefix: str = "", skip: tuple[str, ...] = ()):
    """(`[name]`, dataclass instance) for every (nested) section of the job config but `skip`."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name in skip:
            continue
        if dataclasses.is_dataclass(value):
            name = f"{prefix}.{f.name}" if prefix else f.name
            yield f"[{name}]", value
            yield from _sections(value, name)


# ---- the job config against the model ---------------------------------------------------


def forwards_per_step(job_config) -> int:
    """Training forwards per optimizer step: torchtitan's gradient accumulation,
    global_batch_size / (local_batch_size x data-parallel degree); 1 without it (-1) or when
    the degrees are unknown. Set on the args by each host (grt_titan/spec.py's JobModelArgs,
    0.3's trainer): the depth curriculum counts optimizer steps, the depth sampler forwards."""
    t, shard = job_config.training, data_parallel_shard(job_config)
    dp = job_config.parallelism.data_parallel_replicate_degree * (shard or 0)
    if t.global_batch_size <= 0 or t.local_batch_size < 1 or dp < 1:
        return 1
    return max(1, t.global_batch_size // (t.local_batch_size * dp))


def _method_problems(job_config, args) -> list[str]:
    """What the active parts cannot run with (docs/architecture.md, "Methods as parts"): each
    part's `job_problems`, written in its method module, on the job's settings it reads."""
    job = _job_settings(job_config)
    return [problem for part in args.active_parts for problem in part.job_problems(job, args)]


def _job_settings(job_config) -> JobSettings:
    """The values of a job config that the parts' start-up rules read."""
    v = job_config.validation
    seq_lens = {"training": job_config.training.seq_len}
    if v.enable:
        seq_lens["validation"] = v.seq_len
    return JobSettings(
        tensor_parallel_degree=job_config.parallelism.tensor_parallel_degree,
        compiled=job_config.compile.enable and "model" in job_config.compile.components,
        validation=v.enable,
        seq_lens=seq_lens,
    )


def _training_problems(job_config) -> list[str]:
    t, o, s = job_config.training, job_config.optimizer, job_config.lr_scheduler
    checks = [
        ("[training] steps", t.steps, t.steps >= 1, ">= 1"),
        ("[training] max_norm", t.max_norm, t.max_norm > 0, "> 0"),
        ("[optimizer] name", o.name, o.name in OPTIMIZERS, ", ".join(OPTIMIZERS)),
        ("[optimizer] lr", o.lr, o.lr >= 0, ">= 0"),
        ("[optimizer] eps", o.eps, o.eps >= 0, ">= 0"),
        ("[optimizer] beta1", o.beta1, 0 <= o.beta1 < 1, "[0, 1)"),
        ("[optimizer] beta2", o.beta2, 0 <= o.beta2 < 1, "[0, 1)"),
        ("[optimizer] weight_decay", o.weight_decay, o.weight_decay >= 0, ">= 0"),
        ("[lr_scheduler] warmup_steps", s.warmup_steps, s.warmup_steps >= 0, ">= 0"),
        ("[lr_scheduler] min_lr_factor", s.min_lr_factor, 0 <= s.min_lr_factor <= 1, "[0, 1]"),
        (
            "[lr_scheduler] decay_ratio",
            s.decay_ratio,
            s.decay_ratio is None or 0 <= s.decay_ratio <= 1,
            "unset or [0, 1]",
        ),
        ("[metrics] log_freq", job_config.metrics.log_freq, job_config.metrics.log_freq >= 1, ">= 1"),
    ]
    v = job_config.validation
    if v.enable:
        checks += [
            ("[validation] freq", v.freq, v.freq >= 1, ">= 1"),
            ("[validation] steps", v.steps, v.steps == -1 or v.steps >= 1, "-1 (whole split) or >= 1"),
        ]
    c = job_config.checkpoint
    if c.enable:
        checks += [
            ("[checkpoint] interval", c.interval, c.interval >= 1, ">= 1"),
            (
                "[checkpoint] keep_latest_k",
                c.keep_latest_k,
                c.keep_latest_k == 0 or c.keep_latest_k >= 2,
                "0 (keep all) or >= 2 (the newest may be half-written)",
            ),
            (
                "[checkpoint] last_save_in_hf",
                c.last_save_in_hf,
                not c.last_save_in_hf or c.last_save_model_only,
                "true only with last_save_model_only = true",
            ),
        ]
    d = getattr(job_config, "data", None)
    if d is not None:
        checks.append(
            ("[data] default_val_fraction", d.default_val_fraction, 0 <= d.default_val_fraction < 1, "[0, 1)")
        )
    problems = [f"{key} = {value!r} is invalid; allowed: {allowed}" for key, value, ok, allowed in checks if not ok]
    spike = getattr(job_config, "loss_spike", None)
    return problems + (loss_spike_problems(spike, c.enable) if spike is not None else [])


def config_field_problems(job_config, skip: tuple[str, ...] = ()) -> list[str]:
    """Type and Literal-choice problems of every section's set fields (TOML or command line),
    but the sections named in `skip`."""
    problems = []
    for where, section in _sections(job_config, skip=skip):
        problems += field_problems(section, where, only_changed=True)
    return problems


def shared_problems(job_config, args) -> list[str]:
    """The checks that hold on both hosts, in the order they are reported (torchtitan 0.3 runs
    them on its config's 0.2.2-shaped view: grt_titan/torchtitan_0_3/checks.py)."""
    return [
        *_training_problems(job_config),
        *sequence_problems(job_config, args),
        *tensor_parallel_problems(job_config, args),
        *data_parallel_problems(job_config),
        *vocab_problems(job_config, args),
        *float8_problems(job_config, args),
        *dataset_problems(job_config),
        *job_trainable_problems(job_config, args),
        *resume_problems(job_config),
    ]


def check_job_config(job_config, model_args) -> None:
    """Raise ValueError naming the key and the allowed values for a config that cannot run.

    All problems are collected first and reported together, one per line.
    """
    problems = config_field_problems(job_config)
    if problems:  # wrong types would make the range checks below raise TypeError
        raise_problems(problems)
    # torchtitan 0.2.2's converters build the teacher (torchtitan 0.3 refuses [distill]).
    from grt_titan.teacher import distill_problems

    problems += degree_problems(job_config)
    problems += ddp_problems(job_config)
    problems += _method_problems(job_config, model_args)
    problems += converter_problems(job_config)
    problems += shared_problems(job_config, model_args)
    problems += distill_problems(job_config, model_args)
    problems += initial_load_problems(job_config)
    problems += plain_trainer_initial_load_problems(job_config)
    problems += plain_trainer_fault_tolerance_problems(job_config)
    if problems:
        raise_problems(problems)


def raise_problems(problems: list[str]) -> None:
    """One ValueError for every problem: one line for one, a line each for several."""
    if len(problems) == 1:
        raise ValueError(f"invalid job config: {problems[0]}")
    raise ValueError("invalid job config:\n" + "\n".join(f"  - {p}" for p in problems))
