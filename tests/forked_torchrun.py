"""A torchrun job for the tests whose ranks share one interpreter start.

    python -m tests.forked_torchrun NPROC MODULE [ARGS...]

runs `python -m MODULE ARGS` as ranks 0..NPROC-1 of one gloo job, like
`torchrun --nproc_per_node=NPROC --local-ranks-filter=0 -m MODULE ARGS`: rank 0's output goes
to this process's stdout and stderr, the exit code is 0 only if every rank exits 0, and when
one rank fails the others are stopped and the failed rank's last output is printed.

Why: on CI's 2 cores, importing torch, torchtitan and grt_titan costs about 9 s of CPU per
process, as much as a small test run itself, and torchrun adds an agent process that imports
torch too. Here the import happens once, in this process, and the ranks are forked from it
after nothing but imports (no model, no process group, no RNG use), so each rank still starts
from a clean state. Jobs that restart ranks (`--max-restarts`) need torchrun's agent and keep
using it (grt_test_helpers.torchrun), as do the docs' commands (tests/docs).
"""

from __future__ import annotations

import ctypes
import importlib
import os
import runpy
import signal
import sys
import tempfile
import time
import traceback
from typing import Callable, NoReturn

PRELOADED = ("torchtitan.train", "grt_titan", "grt_titan.components.trainer")
PR_SET_PDEATHSIG = 1  # linux/prctl.h
STOP_GRACE_S = 5.0  # torchrun's agent also gives the surviving ranks a few seconds on SIGTERM


def rank_environment(rank: int, nproc: int, port: int) -> dict[str, str]:
    """What torchrun exports to rank `rank` of a single-node job of `nproc` ranks."""
    return dict(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
        GROUP_RANK="0", ROLE_RANK=str(rank), ROLE_WORLD_SIZE=str(nproc), ROLE_NAME="default",
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_RESTART_COUNT="0",
        TORCHELASTIC_MAX_RESTARTS="0", TORCHELASTIC_RUN_ID="forked",
    )


def set_job_arguments(module: str, args: list[str]) -> None:
    """`sys.argv` as `python -m MODULE ARGS` sets it. torchtitan binds
    `ConfigManager.parse_args(args=sys.argv[1:])` when it is imported, so a process that
    imported it before knowing the job's arguments (tests/launch_server.py) rebinds that default."""
    sys.argv = [module, *args]
    manager = sys.modules.get("torchtitan.config.manager")
    if manager is not None:
        manager.ConfigManager.parse_args.__defaults__ = (list(args),)


def preload() -> None:
    for name in PRELOADED:
        importlib.import_module(name)


def run_module_as_main(module: str) -> int:
    """`python -m module` in this process; its exit code as the interpreter would report it."""
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as e:  # sys.exit(n) inside the job
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1


def die_with_parent() -> None:
    """This process gets SIGKILL when its parent dies (a test's timeout kills the launcher), as
    torchrun's workers would not."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def exit_forked_child(body: Callable[[], int | None]) -> NoReturn:
    """End a forked child with `body()`'s exit code (None: 0; an exception: 1, its traceback
    printed), flushed, and without the parent's atexit handlers or finalizers."""
    code = 1
    try:
        code = body() or 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def job_command(module: str, args: list[str], nproc: int | None = None) -> list[str]:
    """The command line of `python -m module args`, or of its `nproc` ranks under this launcher."""
    return [sys.executable, "-m", *(("tests.forked_torchrun", str(nproc)) if nproc else ()), module, *args]


def _rank_main(module: str, rank: int, nproc: int, port: int, log: str | None) -> NoReturn:
    def body() -> int:
        die_with_parent()
        if log is not None:  # ranks other than 0: their output is shown only if they fail
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
        os.environ.update(rank_environment(rank, nproc, port))
        return run_module_as_main(module)

    exit_forked_child(body)


def _describe(status: int) -> tuple[int, str]:
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        name = signal.Signals(-code).name
        return code, f"exit code {code} (signal {-code}, {name}) ({name})"
    return code, f"exit code {code}"


def run_ranks(nproc: int, module: str) -> int:
    """Fork ranks 0..nproc-1 of `python -m module` (sys.argv set) and wait for them: 0 if every
    rank exits 0; when one fails, the others are stopped and its last output is printed."""
    from tests.grt_test_helpers import free_port

    port = free_port()
    logs = tempfile.mkdtemp(prefix="forked-torchrun-")
    sys.stdout.flush()
    sys.stderr.flush()
    children: dict[int, int] = {}  # pid -> rank
    for rank in range(nproc):
        log = None if rank == 0 else os.path.join(logs, f"rank{rank}.log")
        pid = os.fork()
        if pid == 0:
            _rank_main(module, rank, nproc, port, log)
        children[pid] = rank
    failed: list[tuple[int, str]] = []
    deadline = None
    while children:
        if deadline is None:
            pid, status = os.wait()
        else:  # a rank failed: the others get a grace period, then SIGKILL
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                if time.monotonic() > deadline:
                    for other in children:
                        os.kill(other, signal.SIGKILL)
                    deadline = float("inf")
                time.sleep(0.1)
                continue
        rank = children.pop(pid)
        code, text = _describe(status)
        if code != 0:
            failed.append((rank, text))
            if deadline is None:
                for other in children:
                    os.kill(other, signal.SIGTERM)
                deadline = time.monotonic() + STOP_GRACE_S
    for rank, text in failed:
        print(f"[forked_torchrun] rank {rank} failed: {text}", file=sys.stderr)
        log = os.path.join(logs, f"rank{rank}.log")
        if rank != 0 and os.path.exists(log):
            with open(log, errors="replace") as f:
                tail = f.read()[-8000:]
            print(f"[forked_torchrun] rank {rank}'s last output:\n{tail}", file=sys.stderr)
    for name in os.listdir(logs):
        os.unlink(os.path.join(logs, name))
    os.rmdir(logs)
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit():
        print("usage: python -m tests.forked_torchrun NPROC MODULE [ARGS...]", file=sys.stderr)
        return 2
    nproc, module, args = int(argv[0]), argv[1], argv[2:]
    set_job_arguments(module, args)  # before the import, as under `python -m MODULE`
    preload()
    return run_ranks(nproc, module)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
