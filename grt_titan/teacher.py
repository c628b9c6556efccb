"""The distillation teacher (`[distill]`, docs/distillation.md): read from its source, built
and sharded like the student, frozen; and what the start-up checks ask of it.

Why a module of its own, above components/: the teacher is read with the package's readers
(grt_titan/checkpoints/ for a torchtitan checkpoint and its TOML, the import-hf readers of grt_titan/hf/
for a Hugging Face folder) and sharded with the student's plans (infra/), which the trainer in
components/ may not import (docs/architecture.md, "Layer order"). The train spec names
`build_teacher` as its `build_teacher_fn` (grt_titan/spec.py), which `GRTTrainer` calls;
config_checks calls `distill_problems`.

The teacher is never part of the student's state: not in `model_parts`, so neither the
checkpointer nor the optimizer sees it. Every start (a resume too) reads it from its source,
so the steps after a resume see the same teacher as the uninterrupted run.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torchtitan.config import TORCH_DTYPE_MAP
from torchtitan.protocols.model_converter import build_model_converters
from torchtitan.tools import utils as tt_utils
from torchtitan.tools.logging import logger

from grt_titan.checkpoints.folders import METADATA_FILE, latest_step_folder
from grt_titan.checkpoints.hf_weights import read_hf_weights
from grt_titan.checkpoints.load import load_checkpoint, native_state_from_hf
from grt_titan.components.plain_trainer import plain_trainer_runs
from grt_titan.data.checks import tokenizer_path
from grt_titan.hf.config_map import model_args_from_hf_config
from grt_titan.hf.stock_folders import dense_args_from_stock_config, is_stock_config, read_stock_folder
from grt_titan.infra.float8_checks import float8_problems
from grt_titan.infra.parallel_checks import data_parallel_shard
from grt_titan.infra.parallelize import parallelize_teacher
from grt_titan.model.args import GRTModelArgs
from grt_titan.model.model import build_meta_model
from grt_titan.model.state_dict_adapter import optional_native_keys
from grt_titan.run_reader import CheckpointError, load_model_args
from grt_titan.runtime.fake_backend import is_fake_backend
from grt_titan.sections import FLOAT8_CONVERTER, DistillConfig
from grt_titan.tokenizer import export_tokenizer, load_tokenizer, resolve_tokenizer_source

# Text both tokenizers encode at start-up: equal ids (and vocabulary size) = one tokenizer.
TOKENIZER_PROBE = "Distillation needs one vocabulary: the teacher's 1,234 logits, über ☃."


@dataclass(frozen=True)
class TeacherSource:
    """Where the teacher's weights and architecture come from."""

    kind: Literal["checkpoint", "hf"]
    path: Path  # the step folder (checkpoint) or the Hugging Face folder
    config: Path | None = None  # the teacher's training TOML (checkpoint only)


def teacher_source(cfg: DistillConfig) -> TeacherSource:
    """The source `[distill] teacher` names; CheckpointError naming the key if unreadable."""
    path = Path(cfg.teacher)
    if not path.exists():
        raise CheckpointError(f"[distill] teacher = {cfg.teacher!r} does not exist")
    if (path / "config.json").is_file():
        return TeacherSource("hf", path)
    step = latest_step_folder(path)
    if not (step / METADATA_FILE).is_file() and not list(step.glob("*.safetensors")):
        raise CheckpointError(
            f"[distill] teacher = {cfg.teacher!r} is neither a Hugging Face folder (config.json) nor a "
            "torchtitan checkpoint (a step-N folder with DCP's .metadata, or a folder holding one)"
        )
    if not cfg.teacher_config:
        raise CheckpointError(
            f"[distill] teacher_config is empty, but teacher = {cfg.teacher!r} is a torchtitan checkpoint; "
            "allowed: the teacher's training TOML (its flavor and [grt] overrides)"
        )
    return TeacherSource("checkpoint", step, Path(cfg.teacher_config))


def _hf_config(folder: Path) -> dict:
    try:
        return json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"[distill] teacher: {folder / 'config.json'} cannot be read: {e}") from e


def teacher_args(source: TeacherSource) -> GRTModelArgs:
    """The teacher's architecture: its TOML (flavor + `[grt]`), or its config.json as
    `grt-titan import-hf` reads it (a stock GPT-2 / Llama folder as the dense model)."""
    if source.kind == "checkpoint":
        try:
            return load_model_args(source.config)[0]
        except CheckpointError as e:
            raise CheckpointError(f"[distill] teacher_config: {e}") from e
    config = _hf_config(source.path)
    return dense_args_from_stock_config(config) if is_stock_config(config) else model_args_from_hf_config(config)


def teacher_state(source: TeacherSource, args: GRTModelArgs) -> dict[str, torch.Tensor]:
    """The teacher's full native state dict on the CPU, read as export / import read it."""
    if source.kind == "checkpoint":
        return load_checkpoint(source.path, args)[0]
    if is_stock_config(_hf_config(source.path)):
        return read_stock_folder(source.path)[1]
    return native_state_from_hf(read_hf_weights(source.path), args)


def teacher_tokenizer(source: TeacherSource):
    """The tokenizer the teacher was trained with: its TOML's `[model] hf_assets_path`, or
    the Hugging Face folder's tokenizer files (the shipped GPT-2 ranks for grt_titan's exports)."""
    if source.kind == "hf":
        return export_tokenizer(source.path)
    from grt_titan.job_config import GRTConfigManager

    job = GRTConfigManager().parse_args(["--job.config_file", str(source.config)])
    return load_tokenizer(resolve_tokenizer_source(job.model.hf_assets_path))


# ---- the start-up checks ------------------------------------------------------------------


def parameter_count(args: GRTModelArgs) -> int:
    """Stored parameters (a tied head counted once)."""
    params = {id(p): p.numel() for p in build_meta_model(args).parameters()}
    return sum(params.values())


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per rank the layout must hold for the student and the teacher, activations aside."""

    student: int  # fp32 parameters, gradients and AdamW's two moments, sharded
    teacher: int  # fp32 parameters sharded, plus its largest unit gathered and its logits

    @property
    def total(self) -> int:
        return self.student + self.teacher


def memory_estimate(
    student: GRTModelArgs, teacher: GRTModelArgs, shards: int, tp: int, tokens: int, param_bytes: int
) -> MemoryEstimate:
    """A lower bound per rank: `shards` x `tp` ranks share each weight; `tokens` per microbatch;
    the teacher's gathered blocks are in `param_bytes` per value (FSDP's param dtype). The
    teacher's part is the larger of its running share and, under FSDP x TP, its load (its TP
    shard whole, before FSDP shards it)."""
    ranks = max(shards, 1) * max(tp, 1)
    teacher_params = parameter_count(teacher)
    block = teacher_params / max(teacher.n_prelude_layers + teacher.n_core_layers + teacher.n_coda_layers, 1)
    logits = tokens * teacher.padded_vocab_size / max(tp, 1) * 4 * 3  # float32 logits, p and a
    running = teacher_params * 4 / ranks + block * param_bytes / max(tp, 1) + logits
    # FSDP x TP loads the TP shards whole before FSDP shards them (parallelize_teacher).
    loading = teacher_params * 4 / tp if shards > 1 and tp > 1 else 0
    return MemoryEstimate(student=int(parameter_count(student) * 16 / ranks), teacher=int(max(running, loading)))


def device_memory_bytes() -> int | None:
    """What one rank may use: the accelerator's memory, or on CPU the machine's memory
    shared by the ranks on it; None if unknown."""
    if tt_utils.device_type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    return total // max(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), 1)


def teacher_problems(
    job_config, student: GRTModelArgs, shards: int | None, device_bytes: int | None, student_tokenizer=None
) -> list[str]:
    """One line per problem of `[distill]`, each naming its key; [] without a teacher.

    `shards`: the data-parallel shard degree (None: unknown, no memory check);
    `device_bytes`: memory per rank (None: not checked, e.g. on the fake backend)."""
    cfg: DistillConfig = job_config.distill
    if not cfg.teacher:
        return []
    problems = []
    if not 0 <= cfg.alpha <= 1:
        problems.append(f"[distill] alpha = {cfg.alpha!r} is invalid; allowed: [0, 1]")
    if not cfg.temperature > 0:
        problems.append(f"[distill] temperature = {cfg.temperature!r} is invalid; allowed: > 0")
    try:
        source = teacher_source(cfg)
        teacher = teacher_args(source)
    except (CheckpointError, ValueError, OSError) as e:
        allowed = (
            ""
            if "allowed:" in str(e)
            else "; allowed: a torchtitan checkpoint with its TOML, or a folder import-hf reads"
        )
        return problems + [f"{e}{allowed}"]
    if teacher.vocab_size != student.vocab_size or teacher.padded_vocab_size != student.padded_vocab_size:
        problems.append(
            f"[distill] teacher: vocabulary {teacher.vocab_size} (padded to {teacher.padded_vocab_size}) differs "
            f"from the student's {student.vocab_size} (padded to {student.padded_vocab_size}); allowed: a teacher "
            "with the student's tokenizer and [grt] vocab_multiple_of"
        )
    elif student_tokenizer is not None:
        try:
            theirs = teacher_tokenizer(source)
        except (OSError, ValueError, SystemExit) as e:
            problems.append(f"[distill] teacher: its tokenizer cannot be read ({e}); allowed: the student's tokenizer")
        else:
            if theirs.get_vocab_size() != student_tokenizer.get_vocab_size() or theirs.encode(
                TOKENIZER_PROBE, add_bos=False, add_eos=False
            ) != student_tokenizer.encode(TOKENIZER_PROBE, add_bos=False, add_eos=False):
                problems.append(
                    f"[distill] teacher: its tokenizer ({theirs.path}) differs from the student's "
                    f"([model] hf_assets_path, {student_tokenizer.path}): other ids for the same text; "
                    "allowed: a teacher trained with the student's tokenizer"
                )
    tp = job_config.parallelism.tensor_parallel_degree
    if tp > 1 and (teacher.n_heads % tp or (teacher.n_kv_heads or tp) % tp or teacher.ffn_hidden_dim % tp):
        problems.append(
            f"[distill] teacher: n_heads = {teacher.n_heads}, n_kv_heads = {teacher.n_kv_heads} and the MLP "
            f"width {teacher.ffn_hidden_dim} must be divisible by [parallelism] tensor_parallel_degree = {tp} "
            "(the teacher is sharded like the student); allowed: a teacher that TP can split"
        )
    if shards is not None and device_bytes is not None:
        t = job_config.training
        param_bytes = TORCH_DTYPE_MAP[t.mixed_precision_param].itemsize
        need = memory_estimate(student, teacher, shards, tp, t.local_batch_size * t.seq_len, param_bytes)
        if need.total > device_bytes:
            gib = 2**30
            problems.append(
                f"[distill] teacher = {cfg.teacher!r}: {parameter_count(teacher):,} parameters need about "
                f"{need.teacher / gib:.1f} GiB per rank, with the student's {need.student / gib:.1f} GiB "
                f"(weights, gradients, AdamW) {need.total / gib:.1f} GiB before activations, more than the "
                f"{device_bytes / gib:.1f} GiB a rank has; allowed: more data-parallel shards "
                "([parallelism] data_parallel_shard_degree) or tensor_parallel_degree, or a smaller teacher"
            )
    return problems


def distill_problems(job_config, student: GRTModelArgs) -> list[str]:
    """`[distill]` at start-up: the teacher's source, vocabulary, tokenizer, TP split and memory
    (`teacher_problems`), float8 on its linears, and a trainer that builds it; nothing without
    a teacher. torchtitan 0.2.2's alone (0.3 refuses `[distill]`)."""
    distill = getattr(job_config, "distill", None)
    if distill is None or not distill.teacher:
        return []
    # A fake-backend dry run stands for another machine: its memory is not this one's.
    device_bytes = None if is_fake_backend(job_config) else device_memory_bytes()
    try:
        tokenizer = load_tokenizer(tokenizer_path(job_config))
    except (FileNotFoundError, ValueError):
        return []  # the student's tokenizer is missing: vocab_problems (data/checks.py) says so
    problems = teacher_problems(job_config, student, data_parallel_shard(job_config), device_bytes, tokenizer)
    if not problems and FLOAT8_CONVERTER in job_config.model.converters:  # the teacher's linears convert too
        teacher = teacher_args(teacher_source(distill))
        problems += [f"[distill] teacher: {problem}" for problem in float8_problems(job_config, teacher)]
    if plain_trainer_runs():  # a trainer without a teacher
        problems.append(
            "[distill] teacher is set, but this trainer has no teacher (torchtitan's own -m torchtitan.train); "
            "allowed: python -m grt_titan.train, or no [distill] teacher"
        )
    return problems


# ---- the trainer's teacher ----------------------------------------------------------------


def build_teacher(job_config, parallel_dims) -> nn.Module:
    """The teacher on this rank's device: built on meta, sharded by the student's TP and FSDP
    meshes (`parallelize_teacher`), weights read from the source, frozen, in eval mode.

    The global random state is left as it was (the teacher's throwaway init draws from a
    fork), so a run with a teacher at alpha = 0 trains exactly as one without."""
    source = teacher_source(job_config.distill)
    args = teacher_args(source)
    with torch.device("meta"), tt_utils.set_default_dtype(TORCH_DTYPE_MAP[job_config.training.dtype]):
        model = build_meta_model(args)
    if job_config.model.converters:
        # The student's converters (float8: its linears compute in float8, as the student's;
        # the weights are loaded into them below), before the plans, as torchtitan orders them.
        build_model_converters(job_config, parallel_dims).convert(model)
    state = teacher_state(source, args)

    def load(model: nn.Module) -> None:
        device = torch.device(
            tt_utils.device_type, torch.cuda.current_device() if tt_utils.device_type == "cuda" else 0
        )
        model.to_empty(device=device)
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
            model.init_weights()  # the RoPE table (non-persistent) and a valid starting state
        missing, unexpected = set_model_state_dict(
            model, state, options=StateDictOptions(full_state_dict=True, strict=False)
        )
        state.clear()  # the full copy on the host goes before FSDP x TP shards the teacher
        if unexpected or not set(missing) <= optional_native_keys(args):
            raise CheckpointError(
                f"[distill] teacher {source.path}: weights do not fit its architecture: missing "
                f"{sorted(missing)[:8]}, unexpected {sorted(unexpected)[:8]}"
            )

    model = parallelize_teacher(model, parallel_dims, job_config, load)
    model.requires_grad_(False)
    model.eval()
    logger.info(
        f"Distillation teacher: {source.path} ({source.kind}, {args.method_name}, "
        f"{parameter_count(args):,} parameters), frozen, sharded like the student "
        f"({teacher_layout(parallel_dims)})"
    )
    return model


def teacher_layout(parallel_dims) -> str:
    """How `parallelize_teacher` laid the teacher out, the student's layout: "FSDP 8",
    "FSDP 4 x TP 2", "HSDP 2 x 4"; "replicated, DDP 2" or "one rank" without sharding."""
    pd = parallel_dims
    parts = []
    if pd.fsdp_enabled:
        parts.append(f"HSDP {pd.dp_replicate} x {pd.dp_shard}" if pd.dp_replicate_enabled else f"FSDP {pd.dp_shard}")
    if pd.tp_enabled:
        parts.append(f"TP {pd.tp}")
    if parts:
        return " x ".join(parts)
    return f"replicated, DDP {pd.dp_replicate}" if pd.dp_replicate_enabled else "one rank"
