"""The paper's comparison suite at CPU scale: every row of table 1 and every rung of figure 5,
trained from its own TOML (train_configs/paper/) on 2 CPU ranks with identical tokens, then
tabulated by `grt-titan table`.

    python benchmarks/paper_suite.py                      # small_* and ladder_* rows, 40 steps each
    python benchmarks/paper_suite.py --rows 'small_*' --steps 100 --out /tmp/suite
    python benchmarks/paper_suite.py --static --rows '*'  # architecture columns at paper scale, no training

Each TOML keeps its method's parts ([grt]) and recipe; `cpu_scale_overrides` swaps only the
size: its flavor for the debug-size one with the same layout shape (1 + 2x4 + 1 or 0 + 2x5 + 0
at d = 128, 10 block applications, like dense_debug's 10 layers), sequence 64, float32, no
compile, no checkpoints, validation at the end. This shows that every row trains and reports
at debug size; it is no claim about the paper's numbers (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomli

REPO = Path(__file__).resolve().parents[1]
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
        "--job.config_file", str(path), "--job.dump_folder", str(dump_folder),
        "--model.flavor", debug_flavor,
        "--training.steps", str(steps), "--training.seq_len", "64",
        "--training.local_batch_size", "4", "--training.global_batch_size", "8",
        "--training.mixed_precision_param", "float32", "--debug.seed", str(seed),
        "--lr_scheduler.warmup_steps", str(max(1, steps // 10)),
        "--compile.no-enable", "--activation_checkpoint.mode", "none", "--checkpoint.no-enable",
        "--metrics.log_freq", "10", "--metrics.enable-tensorboard",
        "--validation.freq", str(steps), "--validation.steps", "4",
        "--validation.local_batch_size", "4", "--validation.seq_len", "64",
    ]
    if recurrences is not None:
        args += ["--grt.num_recurrences", str(recurrences)]
    return args


# Table 1's published columns per row (the paper's text): stored params and validation loss.
PAPER_TABLE1 = {
    "small_dense": ("124M", 3.15), "small_mor": ("36M", 3.30), "small_poisson": ("36M", 3.23),
    "small_ouro": ("36M", 3.19), "small_rrt": ("36M+LoRA", 3.14), "small_grt": ("36M", 3.14),
    "medium_dense": ("354M", 2.84), "medium_mor": ("124M", 3.02), "medium_poisson": ("124M", 2.97),
    "medium_ouro": ("124M", 2.93), "medium_rrt": ("124M+LoRA", 2.95), "medium_grt": ("124M", 2.89),
    "large_dense": ("774M", 2.71), "large_mor": ("288M", 2.91), "large_poisson": ("288M", 2.93),
    "large_ouro": ("288M", 2.82), "large_rrt": ("288M+LoRA", 2.85), "large_grt": ("288M", 2.77),
    "medium_isoparams_mor": ("354M", 2.78), "medium_isoparams_poisson": ("354M", 2.74),
    "medium_isoparams_grt": ("354M", 2.76), "large_isoparams_mor": ("774M", 2.69),
    "large_isoparams_poisson": ("774M", 2.70), "large_isoparams_grt": ("774M", 2.65),
}


def static_table(rows: list[Path]) -> str:
    """Table 1's architecture columns of each row's TOML at paper scale, no training: ours
    (from the model args and a meta-device build) beside the paper's parameter count."""
    from grt_titan.analysis.table import layout, stored_parameters
    from grt_titan.model.checkpoint import load_model_args

    lines = ["| row | method | layout | unique layers | block applications | GFLOPs/token fwd (S=1024) "
             "| params (ours) | params (table 1) |", "|---|---|---|---|---|---|---|---|"]
    for path in rows:
        args, _ = load_model_args(path)  # the flavor with the TOML's [grt] parts, as analyze reads it
        unique = args.n_prelude_layers + args.n_core_layers + args.n_coda_layers
        flops = args.forward_flops_per_token(1024, args.eval_depth if args.is_recurrent else 0) / 1e9
        params = stored_parameters(args) / 1e6
        paper = PAPER_TABLE1.get(path.stem, ("-", None))[0]
        lines.append(f"| {path.stem} | {args.method_name} | {layout(args)} | {unique} | {args.unrolled_layers} "
                     f"| {flops:.3f} | {params:.1f}M | {paper} |")
    return "\n".join(lines)


def train_row(path: Path, steps: int, out: Path, seed: int = 0, nproc: int = 2) -> tuple[int, float, str]:
    """(exit code, seconds, output tail) of one row's training run."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "--local-ranks-filter=0",
           "-m", "grt_titan.train", *cpu_scale_overrides(path, steps, out / path.stem, seed)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    return proc.returncode, time.perf_counter() - start, (proc.stdout + proc.stderr)[-3000:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", default=["small_*", "ladder_*"], help="TOML name patterns")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="run folders (default: a temp dir)")
    parser.add_argument("--static", action="store_true",
                        help="print the rows' architecture columns at paper scale (no training)")
    args = parser.parse_args(argv)
    if args.static:
        print(static_table(sorted({p for pattern in args.rows for p in paper_configs(pattern)})))
        return 0
    out = args.out or Path(tempfile.mkdtemp(prefix="paper_suite_"))
    rows = sorted({p for pattern in args.rows for p in paper_configs(pattern)})
    if not rows:
        parser.error(f"no TOML in {PAPER_CONFIGS} matches {args.rows}")
    failed = []
    for path in rows:
        code, seconds, tail = train_row(path, args.steps, out, args.seed)
        print(f"{path.stem:28s} exit {code}  {seconds:6.1f} s", flush=True)
        if code != 0:
            failed.append(path.stem)
            print(tail, file=sys.stderr)
    trained = [p for p in rows if p.stem not in failed]
    codes = []
    # Table 1's rows, then figure 5's ladder in rung order (a table of its own, and the PNG).
    for name, runs, extra in (
        ("table1", [p for p in trained if not p.stem.startswith("ladder_")], ["--csv", str(out / "table1.csv")]),
        ("ladder", [p for p in trained if p.stem.startswith("ladder_")],
         ["--csv", str(out / "ladder.csv"), "--ladder-png", str(out / "ladder.png")]),
    ):
        if not runs:
            continue
        table = subprocess.run([sys.executable, "-m", "grt_titan.cli", "table", *(str(out / p.stem) for p in runs),
                                *extra], cwd=REPO, capture_output=True, text=True)
        print(f"\n{name}:\n{table.stdout}{table.stderr}")
        codes.append(table.returncode)
    return 1 if failed or any(codes) else 0


if __name__ == "__main__":
    sys.exit(main())
