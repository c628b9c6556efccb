"""Start-up checks of a whole job config against the model it builds (docs/reliability.md).

`check_job_config` runs at the end of `GRTModelArgs.update_from_config` (installed there by
`grt_titan.spec` at registration), i.e. where torchtitan 0.2.2's Trainer turns the flavor into
model args: after
the process group, the tokenizer and the training dataloader exist, before the model, its
parallel plans, the optimizer, the checkpointer or the validator are built. Every problem found is reported
in one `ValueError`, one line per problem, each naming the TOML key (`[section] key`) and
what is allowed, instead of an assertion or a traceback from deep inside torch later.
That includes the checkpoint a resume would load: one holding only the model weights
(torchtitan's model-only last save) is reported here, not by DCP at load time; and the
`[checkpoint] initial_load_path` a fresh start would load, which must be a checkpoint
(otherwise DCP or torchtitan's loader would fail after the model is built).

`shared_problems` are the checks that hold on both hosts: torchtitan 0.3 runs them on its
config's 0.2.2-shaped view (grt_titan/torchtitan_0_3/checks.py). The rest are 0.2.2's alone
(its launchers, converter registry, degrees, DDP and the parts' rules, which 0.3 checks
elsewhere); what only 0.2.2 has is imported inside the function that reads it.

`Flavors` is the spec's flavor table: an unknown `[model] flavor` raises the same kind of
error naming the known flavors (torchtitan looks the flavor up before update_from_config).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os

import torch.distributed as dist
from torch import nn

from grt_titan.checkpoint_io import initial_load_problems, initial_load_source, resume_problems
from grt_titan.components.loss_spike import config_problems as loss_spike_problems
from grt_titan.data.default_corpus import NAME as DEFAULT_DATASET
from grt_titan.data.shards import find_manifest
from grt_titan.runtime.fake_backend import is_fake_backend
from grt_titan.field_checks import field_problems
from grt_titan.infra.trainable import configured_entries, trainable_problems
from grt_titan.model.flavors import flavor_from_file
from grt_titan.model.model import build_meta_model
from grt_titan.model.part import JobSettings
from grt_titan.sections import FLOAT8_CONVERTER, UNSUPPORTED_DEGREES, fault_tolerance_enabled, unsupported_degree
from grt_titan.tokenizer import GPT2_VOCAB_SIZE, load_tokenizer, resolve_tokenizer_source

# torchtitan's flag in [quantize.linear.float8] filter_fqns that lets torchao skip small layers.
FLOAT8_AUTO_FILTER = "auto_filter_small_kn"
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


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def _world_size(job_config) -> int | None:
    """The trainer's world size (its process group exists already), else the launcher's."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    value = os.environ.get("NGPU" if job_config.comm.mode != "default" else "WORLD_SIZE")
    return int(value) if value and value.isdigit() else None


def _data_parallel_shard(job_config) -> int | None:
    """The data-parallel shard degree (-1 resolved as torchtitan does: the ranks the other
    degrees leave); None when the world size is unknown or a degree is invalid (named elsewhere)."""
    p, world = job_config.parallelism, _world_size(job_config)
    if not world or p.data_parallel_replicate_degree < 1 or p.tensor_parallel_degree < 1:
        return None
    if p.data_parallel_shard_degree >= 1:
        return p.data_parallel_shard_degree
    others = p.data_parallel_replicate_degree * p.tensor_parallel_degree
    return world // (others * max(p.context_parallel_degree, 1) * max(p.pipeline_parallel_degree, 1))


def forwards_per_step(job_config) -> int:
    """Training forwards per optimizer step: torchtitan's gradient accumulation,
    global_batch_size / (local_batch_size x data-parallel degree); 1 without it (-1) or when
    the degrees are unknown. Installed as `GRTModelArgs.job_forwards_per_step` (grt_titan.spec):
    the depth curriculum counts optimizer steps, the depth sampler forwards."""
    t, shard = job_config.training, _data_parallel_shard(job_config)
    dp = job_config.parallelism.data_parallel_replicate_degree * (shard or 0)
    if t.global_batch_size <= 0 or t.local_batch_size < 1 or dp < 1:
        return 1
    return max(1, t.global_batch_size // (t.local_batch_size * dp))


def _degree_problems(job_config) -> list[str]:
    """Parallelisms the GRT has on neither host (torchtitan 0.3 refuses them in refusals.py)."""
    p = job_config.parallelism
    return [unsupported_degree(key, getattr(p, key)) for key in UNSUPPORTED_DEGREES if getattr(p, key) != 1]


def _sequence_shapes(job_config) -> list[tuple[str, object]]:
    """(`name`, section) of the sequence shapes the job runs: `[training]`, and `[validation]`
    when it validates at another shape (at training's, training's line says it all)."""
    t, v = job_config.training, job_config.validation
    shapes = [("training", t)]
    if v.enable and (v.seq_len, v.local_batch_size) != (t.seq_len, t.local_batch_size):
        shapes.append(("validation", v))
    return shapes


def _tensor_parallel_problems(job_config, args) -> list[str]:
    p, problems = job_config.parallelism, []
    tp = p.tensor_parallel_degree
    if tp < 1:
        return [f"[parallelism] tensor_parallel_degree = {tp} is invalid; allowed: >= 1"]
    if tp > 1:
        heads = args.n_heads if args.n_kv_heads is None else math.gcd(args.n_heads, args.n_kv_heads)
        if args.n_heads % tp or (args.n_kv_heads is not None and args.n_kv_heads % tp):
            kv = "" if args.n_kv_heads is None else f" and n_kv_heads = {args.n_kv_heads}"
            problems.append(
                f"[parallelism] tensor_parallel_degree = {tp} must divide the flavor's "
                f"n_heads = {args.n_heads}{kv}; allowed: {_divisors(heads)}"
            )
        hidden = args.ffn_hidden_dim
        if hidden % tp:
            problems.append(
                f"[parallelism] tensor_parallel_degree = {tp} must divide the MLP hidden size "
                f"{hidden}; allowed: {_divisors(math.gcd(hidden, heads))}"
            )
    # parallelize_grt's rule (torchtitan's seq_len_divisor: tp x 2 x cp), checked here first.
    divisor = tp * 2 * max(p.context_parallel_degree, 1)
    seq_len = job_config.training.seq_len
    if seq_len >= 1 and seq_len % divisor:
        problems.append(
            f"[training] seq_len = {seq_len} must be divisible by {divisor} "
            "(2 x tensor_parallel_degree x context_parallel_degree); allowed: a multiple of it"
        )
    v = dict(_sequence_shapes(job_config)).get("validation")
    if tp > 1 and v is not None and v.seq_len >= 1 and v.seq_len % tp:
        problems.append(
            f"[validation] seq_len = {v.seq_len} must be divisible by tensor_parallel_degree = {tp} "
            "(sequence parallel); allowed: a multiple of it"
        )
    return problems


def _data_parallel_problems(job_config) -> list[str]:
    p, t, problems = job_config.parallelism, job_config.training, []
    dp_replicate, dp_shard = p.data_parallel_replicate_degree, p.data_parallel_shard_degree
    if dp_replicate < 1:
        problems.append(f"[parallelism] data_parallel_replicate_degree = {dp_replicate} is invalid; allowed: >= 1")
    if dp_shard != -1 and dp_shard < 1:
        problems.append(f"[parallelism] data_parallel_shard_degree = {dp_shard} is invalid; allowed: -1 or >= 1")
    shard = _data_parallel_shard(job_config)
    if shard is None or dp_replicate < 1:
        return problems
    if t.local_batch_size >= 1 and t.global_batch_size > 0:
        dp = dp_replicate * shard
        if dp >= 1 and t.global_batch_size % (t.local_batch_size * dp):
            problems.append(
                f"[training] global_batch_size = {t.global_batch_size} must be a multiple of "
                f"local_batch_size x data-parallel degree = {t.local_batch_size} x {dp}; "
                "allowed: -1 (no gradient accumulation) or a multiple of that"
            )
    return problems


def _ddp_problems(job_config) -> list[str]:
    """0.2.2 applies DDP to replicas without sharding (torchtitan 0.3 shards them as HSDP)."""
    p = job_config.parallelism
    dp_replicate, tp = p.data_parallel_replicate_degree, p.tensor_parallel_degree
    if dp_replicate > 1 and tp > 1 and _data_parallel_shard(job_config) == 1:
        return [
            f"[parallelism] data_parallel_replicate_degree = {dp_replicate} without sharding is DDP, "
            f"which cannot be combined with tensor_parallel_degree = {tp}; allowed: HSDP "
            "(data_parallel_shard_degree > 1) or tensor_parallel_degree = 1"
        ]
    return []


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


def _sequence_problems(job_config, args) -> list[str]:
    problems = []
    for name, cfg in _sequence_shapes(job_config):
        if cfg.seq_len < 1:
            problems.append(f"[{name}] seq_len = {cfg.seq_len} is invalid; allowed: >= 1")
        elif args.block_style == "gpt2" and cfg.seq_len > args.max_seq_len:
            problems.append(
                f"[{name}] seq_len = {cfg.seq_len} exceeds the learned positions of flavor "
                f"{job_config.model.flavor!r} (max_seq_len = {args.max_seq_len}); "
                f"allowed: 1 .. {args.max_seq_len}"
            )
        if cfg.local_batch_size < 1:
            problems.append(f"[{name}] local_batch_size = {cfg.local_batch_size} is invalid; allowed: >= 1")
    return problems


def _tokenizer_path(job_config):
    model = job_config.model
    return resolve_tokenizer_source(getattr(model, "tokenizer_path", None)) or resolve_tokenizer_source(
        getattr(model, "hf_assets_path", None)
    )


def _tokenizer_vocab_size(job_config) -> int:
    path = _tokenizer_path(job_config)
    return GPT2_VOCAB_SIZE if path is None else load_tokenizer(path).get_vocab_size()


def _distill_problems(job_config, args) -> list[str]:
    """`[distill]`: the teacher's source, vocabulary, tokenizer, TP split and memory
    (grt_titan/teacher.py); nothing without a teacher."""
    distill = getattr(job_config, "distill", None)
    if distill is None or not distill.teacher:
        return []
    # torchtitan 0.2.2's converters build the teacher (torchtitan 0.3 refuses [distill]).
    from grt_titan.teacher import device_memory_bytes, teacher_args, teacher_problems, teacher_source

    # A fake-backend dry run stands for another machine: its memory is not this one's.
    device_bytes = None if is_fake_backend(job_config) else device_memory_bytes()
    try:
        tokenizer = load_tokenizer(_tokenizer_path(job_config))
    except (FileNotFoundError, ValueError):
        return []  # the student's tokenizer is missing: _vocab_problems says so
    problems = teacher_problems(job_config, args, _data_parallel_shard(job_config), device_bytes, tokenizer)
    if not problems and FLOAT8_CONVERTER in job_config.model.converters:  # the teacher's linears convert too
        teacher = teacher_args(teacher_source(distill))
        problems += [f"[distill] teacher: {problem}" for problem in _float8_problems(job_config, teacher)]
    from grt_titan.components.trainer import GRTTrainer  # here: torchtitan.train is a large import

    if dist.is_initialized() and GRTTrainer.build_teacher is None:  # a trainer without a teacher
        problems.append(
            "[distill] teacher is set, but this trainer has no teacher (torchtitan's own -m torchtitan.train); "
            "allowed: python -m grt_titan.train, or no [distill] teacher"
        )
    return problems


def _trainable_problems(job_config, args) -> list[str]:
    entries = configured_entries(job_config)
    return [] if entries is None else trainable_problems(build_meta_model(args), entries)


def _plain_trainer_initial_load_problems(job_config) -> list[str]:
    """torchtitan's own trainer skips `initial_load_path` with checkpointing off (grt_titan's
    loads it): refused there rather than a silent start from random weights."""
    c = job_config.checkpoint
    path, key = initial_load_source(c, job_config.model.hf_assets_path)
    if c.enable or path is None:
        return []
    from grt_titan.components.trainer import GRTTrainer  # here: torchtitan.train is a large import

    if dist.is_initialized() and GRTTrainer.build_teacher is None:  # not grt_titan.train's trainer
        return [
            f"{key} = {path!r} is not loaded by torchtitan's own "
            "-m torchtitan.train with [checkpoint] enable = false (it would train from random weights); "
            "allowed: python -m grt_titan.train (loads it and saves nothing), or [checkpoint] enable = true"
        ]
    return []


def _plain_trainer_fault_tolerance_problems(job_config) -> list[str]:
    """torchtitan's own trainer ignores `[fault_tolerance]`: refused there rather than a run
    that trains unprotected while its config says it is protected."""
    if not fault_tolerance_enabled(job_config):
        return []
    from grt_titan.components.trainer import GRTTrainer  # here: torchtitan.train is a large import

    if dist.is_initialized() and GRTTrainer.build_teacher is None:  # not grt_titan.train's trainer
        return [
            "[fault_tolerance] enable = true is ignored by torchtitan's own -m torchtitan.train (it would train "
            "without torchft's quorum); allowed: python -m grt_titan.train, or [fault_tolerance] enable = false"
        ]
    return []


def _vocab_problems(job_config, args) -> list[str]:
    try:
        vocab = _tokenizer_vocab_size(job_config)
    except (FileNotFoundError, ValueError) as e:  # a set hf_assets_path without one tokenizer
        return [str(e)]
    if args.vocab_size < vocab:
        return [
            f"[model] flavor = {job_config.model.flavor!r} has vocab_size = {args.vocab_size}, "
            f"smaller than the tokenizer's {vocab} ([model] hf_assets_path = "
            f"{job_config.model.hf_assets_path!r}); allowed: a flavor with vocab_size >= {vocab} "
            "or the tokenizer it was made for"
        ]
    return []


def _float8_problems(job_config, args) -> list[str]:
    """Linears that float8 would silently leave in high precision (dims not multiples of 16).

    torchtitan's filter skips such a layer without a word; a model whose width is not a
    multiple of 16 would then train (almost) entirely in bf16. The LM head is exempt: its
    rows are the vocabulary (GPT-2: 50257), which torchtitan documents as skipped.
    """
    if FLOAT8_CONVERTER not in job_config.model.converters:
        return []
    filter_fqns = list(job_config.quantize.linear.float8.filter_fqns)
    if FLOAT8_AUTO_FILTER in filter_fqns:
        return []  # torchao chooses which layers to convert
    model = build_meta_model(args)
    skipped = tuple(name for part in args.parts for name in part.float8_skip)
    bad = []
    for fqn, module in model.named_modules():
        # The LM head (vocabulary rows) and the linears a part names (Part.float8_skip: Ouro's
        # exit gate, one output; MoR's routers, a dot product per token) stay in high precision.
        if not isinstance(module, nn.Linear) or fqn == "output" or fqn.startswith(skipped):
            continue
        if any(f in fqn for f in filter_fqns):
            continue
        out_features, in_features = module.weight.shape
        if out_features % 16 or in_features % 16:
            bad.append(f"{fqn} ({in_features} -> {out_features})")
    if not bad:
        return []
    shown = ", ".join(bad[:4]) + (f" and {len(bad) - 4} more" if len(bad) > 4 else "")
    return [
        f"[model] converters = {list(job_config.model.converters)!r}: float8 needs both "
        f"dimensions of a linear to be multiples of 16, and {len(bad)} linear(s) are not: "
        f"{shown}. They would silently stay in high precision; allowed: a flavor whose dims "
        f"are multiples of 16, or name them in [quantize.linear.float8] filter_fqns "
        f"(or add {FLOAT8_AUTO_FILTER!r})"
    ]


def _converter_problems(job_config) -> list[str]:
    """`[model] converters` names torchtitan does not know (it would fail with a bare
    `KeyError` when building the converters, after the model). torchtitan 0.2.2's registry:
    0.3 takes float8 alone (torchtitan_0_3/recipe.py)."""
    import torchtitan.components.quantization  # noqa: F401  registers the float8 and mx converters
    from torchtitan.protocols.model_converter import _registry_model_converter_cls

    registered = sorted(_registry_model_converter_cls)
    problems = []
    for name in job_config.model.converters:
        if name in registered:
            continue
        # "float8" -> "quantize.linear.float8": same last component, linear before grouped_mm.
        tail = str(name).rsplit(".", 1)[-1]
        close = sorted((r for r in registered if r.rsplit(".", 1)[-1] == tail), key=lambda r: ".linear." not in r)
        close = close or difflib.get_close_matches(str(name), registered, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(f"[model] converters: unknown converter {name!r}{hint}; allowed: {', '.join(registered)}")
    return problems


def _dataset_problems(job_config) -> list[str]:
    problems = []
    sections = [("training", job_config.training)]
    if job_config.validation.enable:
        sections.append(("validation", job_config.validation))
    for name, cfg in sections:
        if cfg.dataset == DEFAULT_DATASET:
            continue  # prepared on first use, at dataset_path or in the cache
        key, value = (
            (f"[{name}] dataset_path", cfg.dataset_path) if cfg.dataset_path else (f"[{name}] dataset", cfg.dataset)
        )
        if not value:
            problems.append(f"{key} is empty; allowed: {DEFAULT_DATASET!r} or a folder made by `grt-titan prepare`")
            continue
        try:
            find_manifest(value, key)
        except FileNotFoundError as e:
            problems.append(f"{e}; allowed: {DEFAULT_DATASET!r} or a folder made by `grt-titan prepare`")
    return problems


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
        *_sequence_problems(job_config, args),
        *_tensor_parallel_problems(job_config, args),
        *_data_parallel_problems(job_config),
        *_vocab_problems(job_config, args),
        *_float8_problems(job_config, args),
        *_dataset_problems(job_config),
        *_trainable_problems(job_config, args),
        *resume_problems(job_config),
    ]


def check_job_config(job_config, model_args) -> None:
    """Raise ValueError naming the key and the allowed values for a config that cannot run.

    All problems are collected first and reported together, one per line.
    """
    problems = config_field_problems(job_config)
    if problems:  # wrong types would make the range checks below raise TypeError
        raise_problems(problems)
    problems += _degree_problems(job_config)
    problems += _ddp_problems(job_config)
    problems += _method_problems(job_config, model_args)
    problems += _converter_problems(job_config)
    problems += shared_problems(job_config, model_args)
    problems += _distill_problems(job_config, model_args)
    problems += initial_load_problems(job_config)
    problems += _plain_trainer_initial_load_problems(job_config)
    problems += _plain_trainer_fault_tolerance_problems(job_config)
    if problems:
        raise_problems(problems)


def raise_problems(problems: list[str]) -> None:
    """One ValueError for every problem: one line for one, a line each for several."""
    if len(problems) == 1:
        raise ValueError(f"invalid job config: {problems[0]}")
    raise ValueError("invalid job config:\n" + "\n".join(f"  - {p}" for p in problems))
