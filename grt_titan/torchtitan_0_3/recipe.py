"""A training TOML (torchtitan 0.2.2's format, train_configs/) as torchtitan 0.3's config.

One recipe per scale: `trainer_config(path)` reads the same TOML that 0.2.2 parses and fills
`GRTTrainer.Config` with it, key by key (`PLACES`). A key this host does not run yet, set to
anything but its inert value, stops the start in one line that names the key, the file and the
host (`HostRefusal`); so does a command-line override that turns such a feature on
(refusals.py). Keys the TOML leaves out take torchtitan 0.3's defaults.

The refusal lines and the checks of command-line overrides are refusals.py's.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from torchtitan.components.optimizer.optimizer import ParamGroupConfig
from torchtitan.config import CommConfig, CompileConfig, ParallelismConfig
from torchtitan.config.configs import DebugConfig
from torchtitan.distributed.activation_checkpoint import ActivationCheckpointing, FullAC, SelectiveAC

from grt_titan.data.config import DataConfig
from grt_titan.run_reader import read_recipe
from grt_titan.sections import (
    FLOAT8_CONVERTER,
    UNSUPPORTED_DEGREES,
    GRTMetricsConfig,
    GRTSection,
    LossSpikeConfig,
    unsupported_degree,
)
from grt_titan.tokenizer import GPT2_TIKTOKEN_PATH
from grt_titan.torchtitan_0_3.checkpoint import GRTCheckpointManager
from grt_titan.torchtitan_0_3.components import GRTDataLoaderConfig, GRTLoss, GRTLRSchedulersConfig, GRTTokenizerConfig
from grt_titan.torchtitan_0_3.metrics import GRTMetricsProcessor
from grt_titan.torchtitan_0_3.model import MODEL_NAME, EveryNthBlockAC, Float8Converter, model_spec
from grt_titan.torchtitan_0_3.optimizer import GRTOptimizersContainer, OptimizerKeys
from grt_titan.torchtitan_0_3.refusals import refusal
from grt_titan.torchtitan_0_3.trainer import GRTTrainer, GRTTrainingConfig
from grt_titan.torchtitan_0_3.validate import GRTValidator

# Keys that only the 0.2.2 host reads: how it finds grt_titan. Meaningless on 0.3, so accepted.
ZERO_TWO_ONLY = {("job", "custom_config_module"), ("experimental", "custom_import"), ("model", "name")}
# Keys accepted only at their inert value (the feature off): anything else is refused.
INERT = {
    ("activation_checkpoint", "early_stop"): False,
    ("fault_tolerance", "enable"): False,
    ("distill", "teacher"): "",
}
# The 0.3 field each supported 0.2.2 key fills: (section, key) -> (component, field).
PLACES = {
    **{
        ("training", k): ("training", k)
        for k in (
            "local_batch_size",
            "global_batch_size",
            "seq_len",
            "steps",
            "max_norm",
            "dtype",
            "mixed_precision_param",
            "mixed_precision_reduce",
            "gc_freq",
            "enable_cpu_offload",
            "trainable",
        )
    },
    ("training", "dataset"): ("dataloader", "dataset"),
    ("training", "dataset_path"): ("dataloader", "dataset_path"),
    **{
        ("lr_scheduler", k): ("lr_scheduler", k) for k in ("warmup_steps", "decay_ratio", "decay_type", "min_lr_factor")
    },
    ("optimizer", "implementation"): ("optimizer", "implementation"),
    **{
        ("parallelism", k): ("parallelism", k)
        for k in (
            "data_parallel_shard_degree",
            "data_parallel_replicate_degree",
            "tensor_parallel_degree",
            "fsdp_reshard_after_forward",
        )
    },
    **{
        ("metrics", k): ("metrics", k)
        for k in (
            "log_freq",
            "enable_tensorboard",
            "save_tb_folder",
            "save_for_all_ranks",
            "enable_wandb",
            "disable_color_printing",
        )
    },
    **{
        ("checkpoint", k): ("checkpoint", k)
        for k in (
            "enable",
            "folder",
            "interval",
            "initial_load_path",
            "initial_load_model_only",
            "initial_load_in_hf",
            "last_save_model_only",
            "last_save_in_hf",
            "export_dtype",
            "keep_latest_k",
            "load_step",
            "exclude_from_loading",
            "enable_first_step_checkpoint",
            "create_seed_checkpoint",
            "async_mode",
            "checksums",
        )
    },
    **{("validation", k): ("validator", k) for k in ("enable", "freq", "steps")},
    ("validation", "dataset"): ("validation_loader", "dataset"),
    ("validation", "dataset_path"): ("validation_loader", "dataset_path"),
    **{("comm", k): ("comm", k) for k in ("init_timeout_seconds", "train_timeout_seconds", "trace_buf_size")},
    **{("compile", k): ("compile", k) for k in ("enable", "components", "backend")},
    **{("debug", k): ("debug", k) for k in ("seed", "deterministic")},
    ("job", "dump_folder"): ("trainer", "dump_folder"),
    ("job", "description"): ("trainer", "description"),
    ("job", "config_file"): ("trainer", "config_file"),  # set by run_reader.read_recipe
    ("model", "hf_assets_path"): ("trainer", "hf_assets_path"),
}
# `[quantize.linear.float8]` keys: Float8Converter's fields (model.py), 0.2.2's names.
FLOAT8_KEYS = {f.name for f in dataclasses.fields(Float8Converter.Config)} - {"model_compile_enabled"}
# Read by the functions below rather than placed field by field.
WHOLE = {"grt", "data", "quantize", "loss_spike"}
READ_BELOW = {
    ("model", "flavor"),
    ("model", "converters"),
    ("parallelism", "disable_loss_parallel"),
    ("optimizer", "name"),
    ("optimizer", "lr"),
    ("optimizer", "beta1"),
    ("optimizer", "beta2"),
    ("optimizer", "eps"),
    ("optimizer", "weight_decay"),
    ("optimizer", "on_nonfinite"),
    ("validation", "local_batch_size"),
    ("validation", "seq_len"),
    ("activation_checkpoint", "mode"),
    ("activation_checkpoint", "selective_ac_option"),
    ("activation_checkpoint", "preserve_rng_state"),
    ("activation_checkpoint", "determinism_check"),
    ("activation_checkpoint", "debug"),
    ("activation_checkpoint", "per_op_sac_force_recompute_mm_shapes_by_fqns"),
    ("grt_metrics", "enable"),
    ("grt_metrics", "validation_depths"),
}


def check_keys(recipe: dict[str, dict[str, Any]], source: str) -> None:
    """Every key is placed, read below, 0.2.2's own, or inert; else one line names it."""
    for section, values in recipe.items():
        if section in WHOLE:
            continue
        for key, value in values.items():
            where = (section, key)
            if where in PLACES or where in READ_BELOW or where in ZERO_TWO_ONLY:
                continue
            if section == "parallelism" and key in UNSUPPORTED_DEGREES:
                if value == 1:
                    continue
                raise ValueError(f"{source}: {unsupported_degree(key, value)}")
            if where in INERT and (INERT[where] is None or value == INERT[where]):
                continue
            raise refusal(f"[{section}] {key}", value, source)
    if recipe.get("model", {}).get("name", MODEL_NAME) != MODEL_NAME:
        raise ValueError(f"{source}: [model] name = {recipe['model']['name']!r}; grt_titan trains {MODEL_NAME!r}")


def optimizer_config(values: dict[str, Any], source: str) -> GRTOptimizersContainer.Config:
    """0.2.2's `[optimizer]` as one catch-all param group, the same optimizer and settings, and
    its non-finite step guard (`on_nonfinite`, optimizer.py)."""
    keys = OptimizerKeys(**{f.name: values[f.name] for f in dataclasses.fields(OptimizerKeys) if f.name in values})
    if keys.name not in ("AdamW", "Adam"):
        raise refusal("[optimizer] name", keys.name, source)
    kwargs = {"lr": keys.lr, "betas": (keys.beta1, keys.beta2), "eps": keys.eps, "weight_decay": keys.weight_decay}
    return GRTOptimizersContainer.Config(
        param_groups=[ParamGroupConfig(pattern=r".*", optimizer_name=keys.name, optimizer_kwargs=kwargs)],
        on_nonfinite=values.get("on_nonfinite", "stop"),
    )


def activation_checkpoint(values: dict[str, Any], source: str) -> ActivationCheckpointing.Config | None:
    """0.2.2's `[activation_checkpoint]` as 0.3's policy: none, full, per-op selective, or
    0.2.2's every-Nth-block selective (its default, `selective_ac_option = "2"`), which 0.3
    dropped: grt_titan's EveryNthBlockAC (model.py)."""
    mode = values.get("mode", "selective")
    common = {k: values[k] for k in ("preserve_rng_state", "determinism_check", "debug") if k in values}
    if mode == "none":
        return None
    if mode == "full":
        return FullAC.Config(**common)
    option = values.get("selective_ac_option", "2")
    if mode != "selective":
        raise refusal("[activation_checkpoint] mode", mode, source)
    if option.isdigit():
        return EveryNthBlockAC.Config(every=int(option), **common)
    if option != "op":
        raise ValueError(
            f"{source}: [activation_checkpoint] selective_ac_option = {option!r}; allowed: 'op' or a number"
        )
    if "per_op_sac_force_recompute_mm_shapes_by_fqns" in values:
        common["force_recompute_mm_shapes_by_fqns"] = values["per_op_sac_force_recompute_mm_shapes_by_fqns"]
    return SelectiveAC.Config(**common)


def validation_loader(recipe: dict[str, dict[str, Any]], source: str) -> GRTDataLoaderConfig:
    """0.3 validates at the training batch and sequence length: other values are refused."""
    validation, training = recipe.get("validation", {}), recipe.get("training", {})
    for key in ("local_batch_size", "seq_len"):
        if key in validation and validation[key] != training.get(key, validation[key]):
            raise refusal(f"[validation] {key} (unlike [training] {key})", validation[key], source)
    return GRTDataLoaderConfig(dataset="grt_default", split="val", infinite=False)


def grt_metrics(recipe: dict[str, dict[str, Any]]) -> GRTMetricsConfig:
    """`[grt_metrics]`: the gate metrics and r-aware FLOPs (`enable`: grt_titan's metrics
    processor, metrics.py) and the depth-wise validation curve (`validation_depths`:
    grt_titan's validator, validate.py), both on unless set, as on 0.2.2; `[metrics]` is placed
    key by key (PLACES)."""
    section = recipe.get("grt_metrics", {})
    return GRTMetricsConfig(
        enable=section.get("enable", True), validation_depths=section.get("validation_depths", True)
    )


def model_converters(recipe: dict[str, dict[str, Any]], source: str) -> list[Float8Converter.Config]:
    """`[model] converters`: float8 (`quantize.linear.float8`) with its `[quantize.linear.float8]`
    keys, 0.2.2's names and meaning (model.py, Float8Converter); any other converter is refused."""
    names = recipe.get("model", {}).get("converters", [])
    for name in names:
        if name != FLOAT8_CONVERTER:
            raise refusal("[model] converters", name, source)
    float8 = float8_keys(recipe.get("quantize", {}), source)
    if not names:
        return []
    compile_ = recipe.get("compile", {})
    compiled = compile_.get("enable", False) and "model" in compile_.get("components", ["model", "loss"])
    return [Float8Converter.Config(model_compile_enabled=compiled, **float8)]


def float8_keys(quantize: dict[str, Any], source: str) -> dict[str, Any]:
    """`[quantize.linear.float8]`, the one `[quantize]` table this host reads: other keys are refused."""
    linear = quantize.get("linear", {})
    float8 = linear.get("float8", {})
    others = [(f"[quantize] {k}", v) for k, v in quantize.items() if k != "linear"]
    others += [(f"[quantize.linear] {k}", v) for k, v in linear.items() if k != "float8"]
    others += [(f"[quantize.linear.float8] {k}", v) for k, v in float8.items() if k not in FLOAT8_KEYS]
    if others:
        raise refusal(*others[0], source)
    return float8


def place(config: GRTTrainer.Config, recipe: dict[str, dict[str, Any]]) -> None:
    targets: dict[str, Callable[[], Any]] = {
        "trainer": lambda: config,
        "validation_loader": lambda: config.validator.dataloader,
    }
    for (section, key), (component, name) in PLACES.items():
        if key in recipe.get(section, {}):
            target = targets[component]() if component in targets else getattr(config, component)
            setattr(target, name, recipe[section][key])


def trainer_config(path: str | Path) -> GRTTrainer.Config:
    """`GRTTrainer.Config` of a training TOML."""
    source = str(path)
    recipe = read_recipe(source)
    check_keys(recipe, source)
    config = GRTTrainer.Config(
        model_spec=model_spec(
            recipe.get("model", {}).get("flavor", "debug"),
            converters=model_converters(recipe, source),
            loss_parallel=not recipe.get("parallelism", {}).get("disable_loss_parallel", False),
        ),
        hf_assets_path=str(GPT2_TIKTOKEN_PATH),
        tokenizer=GRTTokenizerConfig(),
        dataloader=GRTDataLoaderConfig(),
        optimizer=optimizer_config(recipe.get("optimizer", {}), source),
        lr_scheduler=GRTLRSchedulersConfig(),
        training=GRTTrainingConfig(),
        parallelism=ParallelismConfig(spmd_backend="partial_dtensor"),  # the DTensor plans of grt_titan/infra
        checkpoint=GRTCheckpointManager.Config(),
        activation_checkpoint=activation_checkpoint(recipe.get("activation_checkpoint", {}), source),
        compile=CompileConfig(),
        comm=CommConfig(),
        metrics=GRTMetricsProcessor.Config(),
        validator=GRTValidator.Config(dataloader=validation_loader(recipe, source)),
        debug=DebugConfig(),
        loss=GRTLoss.Config(),
        grt=GRTSection(**recipe.get("grt", {})),
        data=DataConfig(**recipe.get("data", {})),
        loss_spike=LossSpikeConfig(**recipe.get("loss_spike", {})),
        grt_metrics=grt_metrics(recipe),
    )
    place(config, recipe)
    return config
