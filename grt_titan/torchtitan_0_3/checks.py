"""Start-up checks of a torchtitan 0.3 config: grt_titan/config_checks.py's shared checks, which
0.2.2 runs in `GRTModelArgs.update_from_config`, on the config's 0.2.2-shaped view.

`check_config` runs in `GRTTrainer.__init__`, after the command line is applied and before
anything is built, and stops a bad config in 0.2.2's line (`invalid job config: ...`, each
problem naming the key and what is allowed): a TP degree that does not divide the heads or the
MLP width, a sequence length TP cannot split, linears float8 would silently leave in high
precision, a wrong type or choice in the TOML, bad optimizer, schedule, checkpoint or batch
values, a missing dataset, a resume from a model-only checkpoint.

Checked elsewhere on this host, so not here: the parallelisms and features it does not run
(refusals.py, recipe.py: converters other than float8, `[distill]`, `[fault_tolerance]`),
`[loss_spike]` (trainer.py) and the active parts' rules (model.py's `update_from_config`).
Not a rule here: 0.2.2's DDP with TP (0.3 shards replicas without sharding as HSDP).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from grt_titan.checkpoints.start_load import initial_load_problems
from grt_titan.config_checks import config_field_problems, raise_problems, shared_problems
from grt_titan.field_checks import field_problems
from grt_titan.model import GRTModelArgs
from grt_titan.run_reader import flavor_args
from grt_titan.sections import FLOAT8_CONVERTER
from grt_titan.torchtitan_0_3.optimizer import OptimizerKeys
from grt_titan.torchtitan_0_3.view import job_view


def optimizer_keys(config) -> OptimizerKeys:
    groups = config.optimizer.param_groups
    if not groups:
        return OptimizerKeys()
    group = groups[-1]  # the catch-all, last
    kwargs, defaults = group.optimizer_kwargs, OptimizerKeys()
    beta1, beta2 = kwargs.get("betas", (defaults.beta1, defaults.beta2))
    keys = {k: kwargs.get(k, getattr(defaults, k)) for k in ("lr", "eps", "weight_decay")}
    return OptimizerKeys(name=group.optimizer_name, beta1=beta1, beta2=beta2, **keys)


def type_problems(config) -> list[str]:
    """Types and choices of the set fields: every section under 0.3's name (a TOML's values are
    placed without tyro's checks, recipe.py), the float8 keys, 0.2.2's optimizer keys."""
    problems = config_field_problems(config, skip=("model_spec",))
    float8 = config.model_spec.model.float8
    if float8 is not None:
        problems += field_problems(float8, "[quantize.linear.float8]", only_changed=True)
    return problems + field_problems(optimizer_keys(config), "[optimizer]")


def check_view(config) -> SimpleNamespace:
    """`job_view` plus the sections the shared checks read, under 0.2.2's names: `[training]`
    with the dataset, `[validation]` at training's shape (the only one 0.3 validates at)."""
    view = job_view(config)
    t, loader, v = config.training, config.dataloader, config.validator
    float8 = config.model_spec.model.float8
    view.model.converters = [] if float8 is None else [FLOAT8_CONVERTER]
    view.quantize = SimpleNamespace(linear=SimpleNamespace(float8=float8))
    view.training = SimpleNamespace(
        **{f.name: getattr(t, f.name) for f in dataclasses.fields(t)},
        dataset=loader.dataset,
        dataset_path=loader.dataset_path,
    )
    view.validation = SimpleNamespace(
        enable=v.enable,
        freq=v.freq,
        steps=v.steps,
        seq_len=t.seq_len,
        local_batch_size=t.local_batch_size,
        dataset=v.dataloader.dataset,
        dataset_path=v.dataloader.dataset_path,
    )
    view.optimizer = optimizer_keys(config)
    for name in ("parallelism", "lr_scheduler", "checkpoint", "compile", "comm"):
        setattr(view, name, getattr(config, name))
    return view


def model_args(config) -> GRTModelArgs:
    """The flavor's args with `[grt]` and the sequence length applied and validated, as
    model.py's `update_from_config` makes them."""
    args = flavor_args(config.model_spec.model.flavor, source="[model] flavor")
    args.update_from_config(job_view(config))
    return args


def check_config(config) -> None:
    """Raise one ValueError naming every problem of the config (config_checks.raise_problems)."""
    problems = type_problems(config)
    if problems:  # wrong types would make the range checks raise TypeError
        raise_problems(problems)
    view = check_view(config)
    problems = shared_problems(view, model_args(config))
    if config.checkpoint.enable:  # 0.3 loads initial_load_path only with checkpointing on
        problems += initial_load_problems(view)
    if problems:
        raise_problems(problems)
