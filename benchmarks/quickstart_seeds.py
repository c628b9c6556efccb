"""docs/tasks.md's quickstart, run as written on several initialisations, timed
(docs/results/quickstart_loops.md).

    python benchmarks/quickstart_seeds.py --workdir /tmp/quickstart --seeds 0 1 2

The commands are the bash blocks before the page's first `##` heading, read from the page
itself, so the study measures what a reader runs. They run in `--workdir` (a fresh folder with
this checkout's train_configs/ linked in): the data once, then the training run and eval-task
per seed, the preset's own seed (`[debug] seed`) as printed and each other seed with
`--debug.seed S` and a dump folder of its own. It prints each seed's minutes (the data's
included, as a reader would wait) and the `loops = depth` line, and checks the page's promise:
every depth >= 4 answered at r = d with accuracy >= 0.5, at least 0.3 above r = 1 and 0.3 above
guessing (one symbol of the table's).
"""

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "tasks.md"
BLOCK = re.compile(r"^```bash\n(.*?)^```", re.M | re.S)
TRAINER = "grt_titan.train"


def quickstart_commands(page: Path = PAGE) -> list[str]:
    """The shell commands of the bash blocks before the page's first `##` heading."""
    text = page.read_text().split("\n## ", 1)[0]
    commands = []
    for block in BLOCK.findall(text):
        commands += [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    if not any(TRAINER in c for c in commands) or not any("eval-task" in c for c in commands):
        raise SystemExit(f"{page}: the quickstart has no training run or no eval-task before its first '##'")
    return commands


def preset(train_command: str) -> dict:
    """The TOML the training command names."""
    args = shlex.split(train_command)
    return tomllib.loads((REPO / args[args.index("--job.config_file") + 1]).read_text())


def for_seed(command: str, seed: int, toml: dict) -> str:
    """The command for an initialisation: as printed for the preset's own seed (`[debug] seed`),
    else with its own seed and a dump folder beside the preset's."""
    if seed == toml.get("debug", {}).get("seed"):
        return command
    dump = Path(toml["job"]["dump_folder"]).as_posix()  # "./outputs/x" as the commands print it
    command = command.replace(f"{dump}/", f"{dump}_s{seed}/")
    if TRAINER in command:
        command += f" --debug.seed {seed} --job.dump_folder {dump}_s{seed}"
    return command


def eval_folder(command: str) -> Path:
    args = shlex.split(command)
    return Path(args[args.index("--out") + 1])


def promise_problems(result: dict, symbols: int = 10) -> list[str]:
    """Where the eval_task.json breaks the quickstart's promise (docs/tasks.md)."""
    problems = []
    guess = 1 / symbols
    for depth, at_loops in result["at_loops"].items():
        if int(depth) < 4:
            continue
        at_one = result["accuracy"][depth]["1"]
        if at_loops < 0.5 or at_loops - at_one < 0.3 or at_loops - guess < 0.3:
            problems.append(f"depth {depth}: {at_loops:.2f} at r = d, {at_one:.2f} at r = 1, guessing {guess:.2f}")
    return problems


def run(command: str, cwd: Path, log) -> float:
    start = time.monotonic()
    print(f"$ {command}", file=log, flush=True)
    # The programs of this Python's environment (grt-titan, torchrun), activated or not.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(command, shell=True, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode:
        raise SystemExit(f"`{command}` exited {proc.returncode} (its output: {log.name})")
    return time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True, help="a fresh folder to run in")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="the preset's own seed runs as printed")
    opts = p.parse_args(argv)
    work = Path(opts.workdir)
    work.mkdir(parents=True, exist_ok=False)
    (work / "train_configs").symlink_to(REPO / "train_configs")
    commands = quickstart_commands()
    first_train = next(i for i, c in enumerate(commands) if TRAINER in c)
    data, per_seed = commands[:first_train], commands[first_train:]
    with open(work / "quickstart.log", "w") as log:
        data_s = sum(run(c, work, log) for c in data)
        print(f"data: {data_s / 60:.1f} min")
        failed = False
        toml = preset(per_seed[0])
        for seed in opts.seeds:
            seeded = [for_seed(c, seed, toml) for c in per_seed]
            seconds = data_s + sum(run(c, work, log) for c in seeded)
            result = json.loads((work / eval_folder(seeded[-1]) / "eval_task.json").read_text())
            cells = ", ".join(f"{d}: {a:.2f}" for d, a in result["at_loops"].items())
            at_one = ", ".join(f"{d}: {row['1']:.2f}" for d, row in result["accuracy"].items())
            problems = promise_problems(result)
            failed |= bool(problems)
            print(f"seed {seed}: {seconds / 60:.1f} min; r = d: {cells}; r = 1: {at_one}")
            print("  " + ("; ".join(problems) if problems else "every depth >= 4 as promised"))
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())
