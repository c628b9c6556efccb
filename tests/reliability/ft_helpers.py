"""A torchft lighthouse and replica groups as processes a test starts, kills and restarts.

Each replica group is one job of tests/launcher.py (one process, or several gloo ranks as
torchrun would run them) running tests/reliability/ft_worker.py with its own rendezvous store
and dump folder; the groups find each other through the lighthouse. A group is forked by the
launcher's server like every other test job (`launcher.start`): about 12 group starts per run
of test_fault_tolerance.py, each otherwise an interpreter start that imports torchtitan.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from grt_test_helpers import ANSI, SHORT_DEBUG_RUN, STEP_LINE
from tests.launcher import Job, free_port, job_env, rank_environment, start

FT_LINE = re.compile(r"FT step=(\d+) committed=(\d+) live=(\d+) weights=(\w+) sent=(\d+)")
HEALED_LINE = re.compile(r"FT healed bytes=(\d+)")
UNCOMMITTED_LINE = re.compile(r"Fault tolerance: step (\d+) was not committed")
WORKER = "tests.reliability.ft_worker"
# A small, fast job: the debug GRT at batch 2 x 64 tokens, every step logged.
FT_RUN = [*SHORT_DEBUG_RUN, "--training.local_batch_size", "2", "--metrics.no-enable-tensorboard"]


def lighthouse_command(*flags: str) -> list[str]:
    """`torchft_lighthouse FLAGS`, in a process that does not import torch (lighthouse.py)."""
    return [sys.executable, str(Path(__file__).with_name("lighthouse.py")), *flags]


@dataclass
class Lighthouse:
    port: int
    log: Path
    join_timeout_ms: int = 3000
    min_replicas: int = 1  # groups a quorum needs
    proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Lighthouse:
        command = lighthouse_command(
            "--min_replicas",
            str(self.min_replicas),
            "--bind",
            f"[::]:{self.port}",
            "--join_timeout_ms",
            str(self.join_timeout_ms),
        )
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "a") as out:
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@dataclass
class Group:
    """One replica group: a job (tests/launcher.py) and its log (appended to across restarts)."""

    replica_id: int
    group_size: int
    folder: Path
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    nproc: int = 1  # ranks in the group: one process, or the launcher's ranks (rank 0's output)
    proc: Job | None = None

    @property
    def log(self) -> Path:
        return self.folder / f"group{self.replica_id}.log"

    def start(self, lighthouse: Lighthouse) -> Group:
        self.folder.mkdir(parents=True, exist_ok=True)
        args = [
            *self.args,
            "--job.dump_folder",
            str(self.folder / "dump"),
            "--fault_tolerance.enable",
            "--fault_tolerance.replica_id",
            str(self.replica_id),
            "--fault_tolerance.group_size",
            str(self.group_size),
            "--fault_tolerance.lighthouse",
            lighthouse.address,
        ]
        if self.nproc == 1:  # the process itself is rank 0 of 1, as in grt_test_helpers.one_process
            env, nproc = job_env({**rank_environment(0, 1, free_port()), **self.env}), None
        else:
            env, nproc = job_env(self.env), self.nproc
        self.proc = start(WORKER, args, self.log, env=env, nproc=nproc)
        return self

    def kill(self) -> None:
        """SIGKILL the group, every rank of it (launcher.Job.kill: the job's process group)."""
        self.proc.kill()
        self.proc.wait()

    def text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def steps(self) -> list[tuple[int, int, int, str]]:
        """(step, committed, live groups, weights digest) of every step line, in order."""
        return [(int(s), int(c), int(n), w) for s, c, n, w, _ in FT_LINE.findall(self.text())]

    def sent_bytes(self) -> dict[int, int]:
        """Bytes this group all-reduced in each step (the last line per step)."""
        return {int(s): int(b) for s, _, _, _, b in FT_LINE.findall(self.text())}

    def losses(self) -> dict[int, float]:
        """torchtitan's logged loss per step."""
        return {int(s): float(loss) for s, loss, _ in STEP_LINE.findall(ANSI.sub("", self.text()))}

    def healed_bytes(self) -> list[int]:
        return [int(b) for b in HEALED_LINE.findall(self.text())]

    def last_step(self) -> int:
        steps = self.steps()
        return steps[-1][0] if steps else 0

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)


@contextlib.contextmanager
def no_process_left(lighthouse: Lighthouse, groups: list[Group]):
    """Whatever fails inside the block, no group (nor the lighthouse) outlives it."""
    try:
        yield
    finally:
        for g in groups:
            if g.proc is not None and g.proc.poll() is None:
                g.kill()
        lighthouse.stop()


def run_to_the_end(lighthouse: Lighthouse, groups: list[Group], timeout: float = 300) -> list[int]:
    """Start every group, wait for each; their exit codes."""
    with no_process_left(lighthouse, groups):
        for g in groups:
            g.start(lighthouse)
        return [g.wait(timeout=timeout) for g in groups]


def tails(groups: list[Group], chars: int = 4000) -> str:
    """The end of each group's log, for a failure message."""
    return "\n".join(f"--- group {g.replica_id}\n{g.text()[-chars:]}" for g in groups)


def wait_until(condition, timeout: float, what: str, groups: list[Group]) -> float:
    """Poll `condition()` until true; return the time it took. On timeout, fail with the logs' tails."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{tails(groups, 3000)}")
        time.sleep(0.2)
    return time.monotonic() - start


def uncommitted_steps(group: Group) -> set[int]:
    """The trainer steps this group's log names as not committed (the trainer's warning)."""
    return {int(s) for s in UNCOMMITTED_LINE.findall(group.text())}


def digests_by_step(group: Group) -> dict[int, str]:
    """The weights digest after each step (the last line per step: a restarted group repeats)."""
    return {step: weights for step, _, _, weights in group.steps()}
