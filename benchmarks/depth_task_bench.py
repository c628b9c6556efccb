"""Depth that pays, measured: each row trained on a multi-step task at equal training FLOPs,
then scored by problem depth x recurrence r (docs/tasks.md, "The depth benchmark").

    python benchmarks/depth_task_bench.py --out /tmp/depth_bench              # every row, chains
    python benchmarks/depth_task_bench.py --rows grt_steps grt --steps 600 --out /tmp/depth_bench
    python benchmarks/depth_task_bench.py --task iterated-function --test-depths 1-10 --out ...

It writes the task (`grt-titan task`, depths 1-6 for training, --test-depths for the test
split), prepares it over the task vocabulary, trains every row from
train_configs/grt_task_debug.toml on one CPU process each (--parallel at once), and runs
`grt-titan eval-task` on each last checkpoint, with the halting rules on the rows that halt.
The first row's --steps set the FLOP budget: every other row trains for as many steps as its
training FLOPs per token (torchtitan's count, `get_nparams_and_flops`) allow. Rows:

- grt_steps / grt: the GRT (the preset) with and without per-step supervision;
- unlooped: the same blocks at r = 1 (the recurrence never iterated);
- dense: the isoFLOP twin, 1 + R + 1 unshared layers (the GRT's block applications at R);
- poisson_steps, mor, ouro, rrt_steps: table 1's four rows, their [grt] parts from
  train_configs/paper/small_*.toml at the task's size and R; per-step supervision where the
  method takes it (Ouro's exit distribution and MoR's router do not);
- scse_steps: SCSE (train_configs/paper/small_scse.toml's parts, its llama blocks), per-step
  supervision.

Results: `summary.md` (the tables printed at the end) and `results.json` in --out, every run's
folder beside them; run again with the same --out, it reuses the rows it finished. It makes
no claim beyond the task, sizes and budget it ran.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import tomllib

from grt_titan.analysis.task_eval import halting_table

REPO = Path(__file__).resolve().parents[1]
PRESET = REPO / "train_configs" / "grt_task_debug.toml"
PAPER = REPO / "train_configs" / "paper"
TRAIN_DEPTHS = "1-6"
# eval-task's rules on the rows that halt; the learned one's probe is fitted on the training records.
HALTING = ["kl:0.01", "argmax:1", "learned:0.1"]
# Per row: the paper TOML whose [grt] parts it takes (None: the preset's), and the overrides.
ROWS: dict[str, tuple[str | None, list[str]]] = {
    "grt_steps": (None, ["--grt.step_supervision", "True"]),
    "grt": (None, []),
    "unlooped": (None, ["--grt.num_recurrences", "1", "--grt.min_recurrences", "1", "--grt.depth_sampling", "fixed"]),
    "dense": (None, ["--model.flavor", "dense_task_debug_words"]),
    "poisson_steps": ("small_poisson", ["--grt.step_supervision", "True", "--grt.backprop_recurrences", "8"]),
    "mor": ("small_mor", []),
    "ouro": ("small_ouro", []),
    "rrt_steps": ("small_rrt", ["--grt.step_supervision", "True", "--grt.lora_rank", "16"]),
    "scse_steps": ("small_scse", ["--grt.step_supervision", "True"]),  # llama blocks, as its TOML
}
PART_KEYS_KEPT_FROM_THE_PRESET = {"num_recurrences", "min_recurrences"}


def paper_grt(stem: str) -> dict:
    """The [grt] section of a paper TOML, less its depth (the task's R, not table 1's 10)."""
    grt = tomllib.loads((PAPER / f"{stem}.toml").read_text())["grt"]
    return {key: value for key, value in grt.items() if key not in PART_KEYS_KEPT_FROM_THE_PRESET}


def paper_parts(stem: str) -> list[str]:
    """`paper_grt` as overrides."""
    return [arg for key, value in paper_grt(stem).items() for arg in (f"--grt.{key}", str(value))]


@functools.cache
def sequence_length(data: Path) -> int:
    """The preset trains one record per sequence: the longest record's, to a multiple of 8."""
    import numpy as np

    longest = max(
        int(np.diff(np.fromfile(data / f"{split}_records.bin", dtype="<i8")).max()) for split in ("train", "val")
    )
    return -(-(longest - 1) // 8) * 8


def row_overrides(row: str, data: Path, vocab: Path) -> list[str]:
    stem, extra = ROWS[row]
    seq_len = str(sequence_length(data))
    args = ["--model.flavor", "task_debug_words", "--model.hf_assets_path", str(vocab)]
    args += ["--training.dataset", str(data), "--validation.dataset", str(data)]
    args += ["--training.seq_len", seq_len, "--validation.seq_len", seq_len]
    return args + (paper_parts(stem) if stem else []) + extra


def flops_per_token(overrides: list[str], preset: Path = PRESET) -> tuple[int, float]:
    """(parameters, training FLOPs per token) of `preset` with `overrides`, on the meta device."""
    from grt_titan.model.model import build_meta_model
    from grt_titan.run_reader import load_model_args

    args, config = load_model_args(preset, overrides, training_schedule=True)
    return args.get_nparams_and_flops(build_meta_model(args), config.training.seq_len)


def equal_flop_steps(costs: dict[str, tuple[int, float]], reference: str, steps: int, shown) -> dict[str, int]:
    """Each row's steps at `reference`'s training FLOPs over `steps` steps, from (parameters,
    training FLOPs per token) per row; the `shown` rows printed with theirs."""
    budget = costs[reference][1] * steps
    out = {row: max(1, round(budget / flops)) for row, (_, flops) in costs.items()}
    for row in shown:
        print(f"{row}: {costs[row][0]:,} parameters, {costs[row][1]:,.0f} training FLOPs/token, {out[row]} steps")
    return out


def run(command: list[str], log: Path, threads: int = 1) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.run(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:6])} ... exited {proc.returncode}; see {log}")
    return time.perf_counter() - start


def prepare_task(opts, out: Path) -> tuple[Path, Path, Path, Path]:
    cli = [sys.executable, "-m", "grt_titan.cli"]
    vocab, data, test = out / "vocab", out / "data", out / f"{opts.task}-test.jsonl"
    train = out / f"{opts.task}-train.jsonl"
    task = [*cli, "task", opts.task, "--seed", str(opts.seed)]
    run([*cli, "task", "vocab", "--out", str(vocab)], out / "task.log")
    run([*task, "--depths", TRAIN_DEPTHS, "--n", str(opts.problems), "--out", str(train)], out / "task.log")
    run([*task, "--depths", opts.test_depths, "--n", str(opts.test_problems), "--split", "test", "--out", str(test)],
        out / "task-test.log")  # fmt: skip
    prepare = [*cli, "prepare", str(train), "--out", str(data), "--tokenizer", str(vocab), "--val-fraction", "0.02"]
    run(prepare, out / "prepare.log")
    return vocab, data, test, train


def train_and_score(row: str, steps: int, opts, vocab: Path, data: Path, test: Path, train_records: Path) -> dict:
    """One row trained and scored; a row already done in --out (its result.json) is read back."""
    folder = opts.out / row
    done = folder / "result.json"
    if done.exists() and (finished := json.loads(done.read_text()))["steps"] == steps:
        return finished
    folder.mkdir(parents=True, exist_ok=True)
    overrides = row_overrides(row, data, vocab)
    train = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1", "--rdzv-backend=c10d"]
    train += ["--rdzv-endpoint=localhost:0", "-m", "grt_titan.train", "--job.config_file", str(PRESET), *overrides]
    train += ["--job.dump_folder", str(folder), "--training.steps", str(steps), "--debug.seed", str(opts.seed)]
    train += ["--checkpoint.interval", str(steps), "--validation.freq", str(steps), "--validation.steps", "10"]
    train_s = run(train, folder / "train.log")
    score = [sys.executable, "-m", "grt_titan.cli", "eval-task", str(folder / "checkpoint" / f"step-{steps}")]
    score += ["--config", str(folder / "grt_run.json"), "--data", str(test), "--trained-depths", TRAIN_DEPTHS]
    score += ["--out", str(folder / "eval"), "--no-progress"]
    if row not in ("dense", "unlooped", "mor"):  # one depth, or a router that decides it
        score += [arg for rule in HALTING for arg in ("--halting", rule)] + ["--probe-data", str(train_records)]
    eval_s = run(score, folder / "eval.log")
    result = json.loads((folder / "eval" / "eval_task.json").read_text())
    result = {"row": row, "steps": steps, "train_s": train_s, "eval_s": eval_s, "eval": result}
    done.write_text(json.dumps(result) + "\n")
    return result


def accuracy_at(result: dict, depth: int, r: int | None) -> float | None:
    by_r = result["eval"]["accuracy"].get(str(depth), {})
    if r is None:  # a model of one depth: its only column
        return next(iter(by_r.values()), None)
    return by_r.get(str(r))


def summary(results: list[dict], depths: range, recurrences: int) -> str:
    def cell(x):
        return "-" if x is None else f"{x:.2f}"

    head = "| row | steps | train s | " + " | ".join(f"d{d} r=1/R/2R" for d in depths) + " |"
    lines = [head, "|" + "---|" * (3 + len(depths))]
    for res in results:
        rs = {"dense": (None,), "unlooped": (1,)}.get(res["row"], (1, recurrences, 2 * recurrences))
        cells = ["/".join(cell(accuracy_at(res, d, r)) for r in rs) for d in depths]
        lines.append(f"| {res['row']} | {res['steps']} | {res['train_s']:.0f} | " + " | ".join(cells) + " |")
    lines += ["", "| row | mean arrival step by depth (problems arrived / scored) |", "|---|---|"]
    for res in results:
        means = []
        for d in depths:
            scored = res["eval"].get("arrival", {}).get(str(d), [])
            arrived = [a for a in scored if a is not None]
            if arrived:
                means.append(f"d{d}: {sum(arrived) / len(arrived):.1f} ({len(arrived)}/{len(scored)})")
        lines.append(f"| {res['row']} | {', '.join(means) or '-'} |")
    for res in results:  # eval-task's halting table, one per row that halts
        if res["eval"].get("halting"):
            lines += ["", f"Halting, {res['row']}:", "", halting_table(res["eval"]["halting"])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="folder for the task, the runs and the summary")
    p.add_argument("--task", default="chains", choices=["chains", "iterated-function", "mano"])
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    p.add_argument("--steps", type=int, default=1000, help="the first row's steps; the FLOP budget of every row")
    p.add_argument("--problems", type=int, default=30000, help="training problems")
    p.add_argument("--test-depths", default="1-8", help="A-B: test problem depths (training: 1-6)")
    p.add_argument("--test-problems", type=int, default=400)
    p.add_argument("--parallel", type=int, default=2, help="runs at once (one CPU process each)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plan", action="store_true", help="write the task, print each row's FLOPs and steps, stop")
    opts = p.parse_args(argv)
    opts.out.mkdir(parents=True, exist_ok=True)
    vocab, data, test, train_records = prepare_task(opts, opts.out)
    costs = {row: flops_per_token(row_overrides(row, data, vocab)) for row in opts.rows}
    steps = equal_flop_steps(costs, opts.rows[0], opts.steps, opts.rows)
    if opts.plan:
        return 0
    with ThreadPoolExecutor(opts.parallel) as pool:
        futures = [
            pool.submit(train_and_score, row, steps[row], opts, vocab, data, test, train_records) for row in opts.rows
        ]
        results = [f.result() for f in futures]
    from grt_titan.data.tasks import parse_depths
    from grt_titan.run_reader import load_model_args

    recurrences = load_model_args(PRESET, row_overrides("grt", data, vocab))[0].num_recurrences
    text = summary(results, parse_depths(opts.test_depths), recurrences)
    print(text)
    (opts.out / "summary.md").write_text(text + "\n")
    (opts.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
