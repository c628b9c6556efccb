"""A job for tests/test_launcher.py: prints what it was started with, then exits.

python -m tests.launch_probe [--sleep S] [--exit N] [--fail-rank R] [--kill-self SIGNAL] [ARGS...]
(GRT_PROBE_STARTED=FILE: the file, holding the probe's pid, is made once it has printed its line;
GRT_PROBE_PIDS=DIR: each rank writes its pid to DIR/RANK, for a test that checks they are gone:
a served job's ranks are forks of the server, whose command line pgrep sees, not the probe's)
python -m tests.launch_probe --torch-logs
(Its line says what torchtitan.train sleeps and times with, where a launcher job loaded it.)
"""

import json
import os
import sys
import time


def write_pid(path: str) -> None:
    """This process's pid into `path`, whole once the file exists (written aside, then renamed)."""
    with open(path + ".part", "w") as f:
        f.write(str(os.getpid()))
    os.rename(path + ".part", path)


def end_of_training_sleep() -> dict:
    """Whether torchtitan.train's `time` still sleeps, and still times (launcher._skip_end_of_training_wait)."""
    train = sys.modules.get("torchtitan.train")
    if train is None:
        return {}
    return {"sleeps": train.time.sleep is time.sleep, "clock": train.time.perf_counter is time.perf_counter}


if __name__ == "__main__":
    args = sys.argv[1:]
    options = {}
    if args[:1] == ["--torch-logs"]:  # torch's log settings as TORCH_LOGS made them
        import logging

        import torch._logging._internal as logs

        print(
            json.dumps(
                {"recompiles_log_level": logging.DEBUG if logs.log_state.is_artifact_enabled("recompiles") else None}
            )
        )
        sys.exit(0)
    while args and args[0] in ("--sleep", "--exit", "--fail-rank", "--kill-self"):
        options[args[0]] = float(args[1])
        args = args[2:]
    rank = int(os.environ.get("RANK", "0"))
    if os.environ.get("GRT_PROBE_PIDS"):  # before the line: a test that read the line finds the file
        write_pid(os.path.join(os.environ["GRT_PROBE_PIDS"], str(rank)))
    print(
        json.dumps(
            {
                "argv": sys.argv,
                "cwd": os.getcwd(),
                "path": [p for p in sys.path[:3] if "site-packages" not in p],
                "rank": rank,
                "pid": os.getpid(),
                "world_size": os.environ.get("WORLD_SIZE"),
                "torch_seed": __import__("torch").initial_seed(),
                "probe": os.environ.get("GRT_PROBE"),
                "stdin": sys.stdin.read(),
                **end_of_training_sleep(),
            }
        ),
        flush=True,
    )
    if os.environ.get("GRT_PROBE_STARTED"):
        write_pid(os.environ["GRT_PROBE_STARTED"])
    if "--kill-self" in options:
        os.kill(os.getpid(), int(options["--kill-self"]))
    time.sleep(options.get("--sleep", 0))
    if options.get("--fail-rank") == rank:
        print(f"rank {rank} fails", file=sys.stderr)
        sys.exit(3)
    sys.exit(int(options.get("--exit", 0)))
