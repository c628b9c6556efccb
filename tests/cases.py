"""The tests' declarative tables of layouts and cases, shared with the benchmark scripts
(benchmarks/ imports these; tests import nothing from benchmarks/).

- PARITY_LAYOUTS: the parallel layouts that must reproduce one rank's losses and gradients
  (tests/infra/test_parallel_parity.py and the method parity tests).
- PAPER_CONFIGS: the paper's rows (train_configs/paper/), their debug-size training arguments
  and table 1's published columns (benchmarks/paper_suite.py, tests/infra/test_paper_configs.py,
  docs/paper_suite.md's static table).
- MATRIX_CASES: every parallel combination a user of the large presets will try, FSDP x TP
  {1, 2, 4} x compile x AC x float8 on 8 fake-backend ranks (benchmarks/parallel_matrix.py runs
  them all; tests/infra/test_parallel_matrix.py the corners).
"""

from __future__ import annotations

import fnmatch
import itertools
from pathlib import Path

import tomli

REPO = Path(__file__).resolve().parents[1]

# name -> (ranks, layout): `dp` is the data-parallel degree the global batch is split over,
# `args` extra command-line options, every other key a `--parallelism.KEY VALUE` override.
ONE_RANK = {"dp": 1, "data_parallel_shard_degree": 1}
# FSDP 2 alone is fsdp2_ac_op_sac less AC (whose recompute is exact: the golden AC runs), and
# reproduces the golden losses (tests/infra/test_golden_losses.py); its own parity run went
# when the suite's time was cut (tests/README.md).
PARITY_LAYOUTS = {
    "tp2": (2, {"dp": 1, "data_parallel_shard_degree": 1, "tensor_parallel_degree": 2}),
    "fsdp2_tp2": (4, {"dp": 2, "data_parallel_shard_degree": 2, "tensor_parallel_degree": 2}),
    "ddp2": (2, {"dp": 2, "data_parallel_shard_degree": 1, "data_parallel_replicate_degree": 2}),
    # Checkpointing each recurrence step is held to the golden losses with noise on
    # (tests/infra/test_golden_losses.py), a stronger check than this noise-free parity.
    "fsdp2_ac_op_sac": (
        2,
        {"args": ["--activation_checkpoint.mode", "selective", "--activation_checkpoint.selective_ac_option", "op"]},
    ),
}

MATRIX_WORLD_SIZE = 8
AC_ARGS = {
    "none": ["--activation_checkpoint.mode", "none"],
    "selective": ["--activation_checkpoint.mode", "selective", "--activation_checkpoint.selective_ac_option", "op"],
    "full": ["--activation_checkpoint.mode", "full"],
}
FLOAT8_ARGS = [
    "--model.converters",
    "quantize.linear.float8",
    "--quantize.linear.float8.emulate",
    "--quantize.linear.float8.enable_fsdp_float8_all_gather",
    "--quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp",
]
# name -> (TP degree, compiled, AC mode, float8)
MATRIX_CASES = {
    f"tp{tp}-{'compile' if compiled else 'eager'}-ac_{ac}-{'float8' if float8 else 'bf16'}": (tp, compiled, ac, float8)
    for tp, compiled, ac, float8 in itertools.product((1, 2, 4), (False, True), AC_ARGS, (False, True))
}
# torchtitan 0.2.2 runs float8 under compile only on SM89+ GPUs: its emulation (all a CPU
# can do) is eager-only, and it refuses the combination at start-up.
EMULATION_LIMIT = "GPU only: torchtitan's float8 emulation is eager-only"


def matrix_case_args(name: str, dump_folder: str, compile_backend: str = "inductor") -> list[str]:
    """grt_debug (d = 128, 4 heads) at sequence 64, one bf16 step, in the case's layout."""
    tp, compiled, ac, float8 = MATRIX_CASES[name]
    args = [
        "--comm.mode",
        "fake_backend",
        "--job.config_file",
        "train_configs/grt_debug.toml",
        "--job.dump_folder",
        dump_folder,
        "--training.steps",
        "1",
        "--training.seq_len",
        "64",
        "--training.local_batch_size",
        "2",
        "--training.mixed_precision_param",
        "bfloat16",
        "--parallelism.data_parallel_shard_degree",
        str(MATRIX_WORLD_SIZE // tp),
        "--parallelism.tensor_parallel_degree",
        str(tp),
        "--validation.no-enable",
        "--metrics.no-enable-tensorboard",
        "--metrics.log_freq",
        "1",
        *AC_ARGS[ac],
    ]
    if compiled:
        args += ["--compile.enable", "--compile.components", "model,loss", "--compile.backend", compile_backend]
    if float8:
        args += FLOAT8_ARGS
    return args


def runnable_here(name: str) -> bool:
    import torch

    _, compiled, _, float8 = MATRIX_CASES[name]
    return not (compiled and float8) or torch.cuda.is_available()


# ---- the paper's rows ----------------------------------------------------------------------

PAPER_CONFIGS = REPO / "train_configs" / "paper"
# flavor of a paper TOML -> (debug flavor with the same layout shape, its R)
DEBUG_FLAVOR = {
    "small_core_only": ("debug_core_only", 5),
    **{name: ("debug", 4) for name in ("small", "medium", "large", "medium_isoparams", "large_isoparams")},
    **{f"dense_{size}": ("dense_debug", None) for size in ("small", "medium", "large")},
}


def paper_configs(pattern: str = "*") -> list[Path]:
    return sorted(p for p in PAPER_CONFIGS.glob("*.toml") if fnmatch.fnmatch(p.stem, pattern))


def cpu_scale_overrides(path: Path, steps: int, dump_folder: Path, seed: int = 0) -> list[str]:
    """Command-line arguments that train `path` at debug size on CPU, its parts unchanged."""
    flavor = tomli.loads(path.read_text())["model"]["flavor"]
    if flavor not in DEBUG_FLAVOR:
        raise ValueError(f"{path}: flavor {flavor!r} has no debug-size counterpart; known: {sorted(DEBUG_FLAVOR)}")
    debug_flavor, recurrences = DEBUG_FLAVOR[flavor]
    args = [
        "--job.config_file",
        str(path),
        "--job.dump_folder",
        str(dump_folder),
        "--model.flavor",
        debug_flavor,
        "--model.hf_assets_path",
        "grt_titan/assets/gpt2_4k.tiktoken",  # the debug flavors' tokenizer (docs/data.md)
        "--training.steps",
        str(steps),
        "--training.seq_len",
        "64",
        "--training.local_batch_size",
        "4",
        "--training.global_batch_size",
        "8",
        "--training.mixed_precision_param",
        "float32",
        "--debug.seed",
        str(seed),
        "--lr_scheduler.warmup_steps",
        str(max(1, steps // 10)),
        "--compile.no-enable",
        "--activation_checkpoint.mode",
        "none",
        "--checkpoint.no-enable",
        "--metrics.log_freq",
        "10",
        "--metrics.enable-tensorboard",
        "--validation.freq",
        str(steps),
        "--validation.steps",
        "4",
        "--validation.local_batch_size",
        "4",
        "--validation.seq_len",
        "64",
    ]
    if recurrences is not None:
        args += ["--grt.num_recurrences", str(recurrences)]
    return args


# Table 1's published columns per row (the paper's text): stored params and validation loss.
PAPER_TABLE1 = {
    "small_dense": ("124M", 3.15),
    "small_mor": ("36M", 3.30),
    "small_poisson": ("36M", 3.23),
    "small_ouro": ("36M", 3.19),
    "small_rrt": ("36M+LoRA", 3.14),
    "small_grt": ("36M", 3.14),
    "medium_dense": ("354M", 2.84),
    "medium_mor": ("124M", 3.02),
    "medium_poisson": ("124M", 2.97),
    "medium_ouro": ("124M", 2.93),
    "medium_rrt": ("124M+LoRA", 2.95),
    "medium_grt": ("124M", 2.89),
    "large_dense": ("774M", 2.71),
    "large_mor": ("288M", 2.91),
    "large_poisson": ("288M", 2.93),
    "large_ouro": ("288M", 2.82),
    "large_rrt": ("288M+LoRA", 2.85),
    "large_grt": ("288M", 2.77),
    "medium_isoparams_mor": ("354M", 2.78),
    "medium_isoparams_poisson": ("354M", 2.74),
    "medium_isoparams_grt": ("354M", 2.76),
    "large_isoparams_mor": ("774M", 2.69),
    "large_isoparams_poisson": ("774M", 2.70),
    "large_isoparams_grt": ("774M", 2.65),
}


def static_table(rows: list[Path]) -> str:
    """Table 1's architecture columns of each row's TOML at paper scale, no training: ours
    (from the model args and a meta-device build) beside the paper's parameter count."""
    from grt_titan.analysis.table import layout, stored_parameters
    from grt_titan.run_reader import load_model_args

    lines = [
        "| row | method | layout | unique layers | block applications | GFLOPs/token fwd (S=1024) "
        "| params (ours) | params (table 1) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for path in rows:
        args, _ = load_model_args(path)  # the flavor with the TOML's [grt] parts, as analyze reads it
        unique = args.n_prelude_layers + args.n_core_layers + args.n_coda_layers
        flops = args.forward_flops_per_token(1024, args.eval_depth if args.is_recurrent else 0) / 1e9
        params = stored_parameters(args) / 1e6
        paper = PAPER_TABLE1.get(path.stem, ("-", None))[0]
        lines.append(
            f"| {path.stem} | {args.method_name} | {layout(args)} | {unique} | {args.unrolled_layers} "
            f"| {flops:.3f} | {params:.1f}M | {paper} |"
        )
    return "\n".join(lines)
