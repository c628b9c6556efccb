"""SCSE against the GRT and the other rows on the toy language model, at equal training FLOPs:
validation loss at every depth r = 0..4R (inside and beyond the trained R) and the anchor
response, from `grt-titan analyze` on each row's last checkpoint (docs/methods.md, "SCSE";
docs/results/scse.md).

    python benchmarks/scse_bench.py --out /tmp/scse_bench                 # every row, 600 GRT steps
    python benchmarks/scse_bench.py --rows grt scse --steps 300 --out /tmp/scse_bench

Every row is grt_debug's size and recipe (1 + 2x4 + 1, d = 128, the embedded corpus, 2 CPU
ranks) with llama blocks, SCSE's (its paper's bias-free core): `grt` (GRT's parts), `scse`
(train_configs/scse_debug.toml), `recurrence` (figure 5's rung 3: no re-injection, no gate,
no noise) and `dense` (dense_debug's 10 layers). The GRT's --steps set the FLOP budget; each
other row trains for as many steps as its training FLOPs per token allow (torchtitan's count).
A second run with the same --out reuses the rows it finished. It makes no claim beyond the
size and budget it ran.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from depth_task_bench import equal_flop_steps, flops_per_token, run  # noqa: E402

CONFIGS = REPO / "train_configs"
LLAMA = ["--grt.block_style", "llama"]
# Per row: its preset and overrides.
ROWS: dict[str, tuple[str, list[str]]] = {
    "grt": ("grt_debug", LLAMA),
    "scse": ("scse_debug", []),
    "recurrence": (
        "grt_debug",
        [*LLAMA, "--grt.injection", "none", "--grt.update", "overwrite"]
        + ["--grt.state_noise_std", "0", "--grt.gate_noise_std", "0"],
    ),
    "dense": ("dense_debug", LLAMA),
}


def train_and_analyze(row: str, steps: int, opts) -> dict:
    folder = opts.out / row
    done = folder / "result.json"
    if done.exists() and (finished := json.loads(done.read_text()))["steps"] == steps:
        return finished
    folder.mkdir(parents=True, exist_ok=True)
    preset, overrides = ROWS[row]
    config = CONFIGS / f"{preset}.toml"
    train = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--rdzv-backend=c10d"]
    train += ["--rdzv-endpoint=localhost:0", "--local-ranks-filter=0", "-m", "grt_titan.train"]
    train += ["--job.config_file", str(config), *overrides, "--job.dump_folder", str(folder)]
    train += ["--training.steps", str(steps), "--debug.seed", str(opts.seed), "--checkpoint.enable"]
    train += ["--checkpoint.interval", str(steps), "--validation.freq", str(steps)]
    train_s = run(train, folder / "train.log")
    out = {"row": row, "steps": steps, "train_s": train_s, "anchor_response": None}
    if row == "dense":  # one depth: its validation loss (analyze reads recurrences)
        line = [x for x in (folder / "train.log").read_text().splitlines() if "validate step" in x][-1]
        out["loss"] = [float(re.search(r"loss:\s+([\d.]+)", re.sub(r"\x1b\[[\d;]*m", "", line)).group(1))]
    else:
        analysis = folder / "analysis"
        analyze = [sys.executable, "-m", "grt_titan.cli", "analyze", str(folder / "checkpoint" / f"step-{steps}")]
        analyze += ["--config", str(folder / "grt_run.json"), "--out", str(analysis), "--no-halting"]
        analyze += ["--num-sequences", str(opts.sequences), "--max-depth", str(4 * opts.recurrences)]
        run(analyze, folder / "analyze.log")
        result = json.loads((analysis / "analysis.json").read_text())
        out["loss"] = result["early_exit"]["loss"]
        out["anchor_response"] = result["step_dynamics"]["anchor_response"]
    done.write_text(json.dumps(out) + "\n")
    return out


def summary(results: list[dict], costs: dict, R: int) -> str:
    depths = [*range(1, R + 1), 2 * R, 4 * R]
    head = "| row | steps | training GFLOPs/token | " + " | ".join(f"r={r}" for r in depths)
    lines = [head + " | anchor response s=1 / R |", "|" + "---|" * (4 + len(depths))]
    for res in results:
        loss = res["loss"]
        if res["row"] == "dense":  # one depth: the trainer's validation, in the r = R column
            cells = ["-"] * (R - 1) + [f"{loss[0]:.4f}*"] + ["-"] * (len(depths) - R)
            anchor = "-"
        else:
            cells = [f"{loss[r]:.4f}" for r in depths]
            anchor = "{:.4f} / {:.4f}".format(res["anchor_response"][0], res["anchor_response"][R - 1])
        flops = costs[res["row"]][1] / 1e9
        lines.append(f"| {res['row']} | {res['steps']} | {flops:.4f} | " + " | ".join(cells) + f" | {anchor} |")
    if any(res["row"] == "dense" for res in results):
        lines.append("\n* dense: the trainer's validation loss (another sample of the split than analyze's)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    p.add_argument("--steps", type=int, default=600, help="the GRT's steps: the FLOP budget of every row")
    p.add_argument("--sequences", type=int, default=32, help="validation sequences analyze scores")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plan", action="store_true", help="print each row's FLOPs and steps, stop")
    opts = p.parse_args(argv)
    opts.out.mkdir(parents=True, exist_ok=True)
    # The asked rows and the GRT, whose steps set the budget.
    costs = {row: flops_per_token(ROWS[row][1], CONFIGS / f"{ROWS[row][0]}.toml") for row in {"grt", *opts.rows}}
    steps = equal_flop_steps(costs, "grt", opts.steps, opts.rows)
    if opts.plan:
        return 0
    from grt_titan.run_reader import load_model_args

    opts.recurrences = load_model_args(CONFIGS / "scse_debug.toml")[0].num_recurrences
    results = [train_and_analyze(row, steps[row], opts) for row in opts.rows]
    text = summary(results, costs, opts.recurrences)
    print(text)
    (opts.out / "summary.md").write_text(text + "\n")
    (opts.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
