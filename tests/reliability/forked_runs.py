"""Single-rank runs of the reliability worker forked from one interpreter that has imported
torch, torchtitan and grt_titan once.

    python -m tests.reliability.forked_runs PLAN.json

On CI's 2 shared cores about half of a small run's CPU time is that import. Each run is
still a process of its own, forked from a parent that has only imported (no model, no
process group, no RNG use): nothing of one run reaches another, so a resumed run starts
from its checkpoint alone, as after a real restart.

PLAN: {"parallel": N, "pipelines": [[RUN, ...], ...]}. The runs of a pipeline go one after
the other; up to N pipelines at a time. RUN: {"args": [the worker's arguments], "log": path
(its stdout and stderr), "copy": [src, dst] (optional, a folder copied before the run)}.
Writes PLAN's "result" path: each pipeline's exit codes (a pipeline stops at a failed run).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys

from tests.forked_torchrun import exit_forked_child, rank_environment, set_job_arguments
from tests.grt_test_helpers import free_port
from tests.reliability import reliability_worker

# What every run imports (reliability_worker.main's imports): once, here, before the forks.
for _module in ("torchtitan.train", "grt_titan", "grt_titan.components.trainer"):
    importlib.import_module(_module)


def _run(run: dict) -> int:
    """Fork one run of the worker as rank 0 of a world of one; its exit code."""
    if "copy" in run:
        src, dst = run["copy"]
        shutil.copytree(src, dst)
    port = free_port()
    pid = os.fork()
    if pid == 0:
        def body() -> None:
            log = os.open(run["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.environ.update(rank_environment(0, 1, port))
            set_job_arguments("reliability_worker", run["args"])
            reliability_worker.main()

        exit_forked_child(body)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _pipeline(runs: list[dict], result: str) -> None:
    codes = []
    for run in runs:
        codes.append(_run(run))
        if codes[-1] != 0:
            break
    with open(result, "w") as f:
        json.dump(codes, f)


def main(plan_path: str) -> None:
    with open(plan_path) as f:
        plan = json.load(f)
    pipelines = plan["pipelines"]
    results = [f"{plan['result']}.{i}" for i in range(len(pipelines))]
    running: set[int] = set()
    for runs, result in zip(pipelines, results):
        if len(running) >= plan["parallel"]:
            running.discard(os.wait()[0])
        pid = os.fork()
        if pid == 0:
            exit_forked_child(lambda: _pipeline(runs, result))
        running.add(pid)
    while running:
        running.discard(os.wait()[0])
    codes = []
    for result in results:
        if os.path.exists(result):
            with open(result) as f:
                codes.append(json.load(f))
        else:
            codes.append([-1])  # the pipeline process itself failed (its traceback is in stderr)
    with open(plan["result"], "w") as f:
        json.dump(codes, f)


if __name__ == "__main__":
    main(sys.argv[1])
