"""The one way tests start a job: `launch(module, args, env, timeout, nproc)`, or `start(module,
args, stdout, ...)` for a test that follows, kills and restarts a job while it runs (a `Job`
handle: pid, poll, wait, kill; output appended to a file).

A job is `python -m MODULE ARGS` (nproc None), or `nproc` gloo ranks of it as
`torchrun --nproc_per_node=nproc --local-ranks-filter=0 -m MODULE ARGS` would run them: each
rank gets torchrun's environment, rank 0's output is the job's, the job fails if any rank
fails (the others are then stopped and the failed rank's last output is printed).

Why forking: on CI's 2 cores an interpreter start that imports torch, torchtitan and
grt_titan costs about 9 s of CPU, as much as a small run, and torchrun's agent imports torch
once more. So each pytest process starts one server (`python -m tests.launcher serve SOCKET`)
that imports them once and forks every job, and a job forks its ranks. Nothing but imports
happened before a fork (no model, process group, thread pool or RNG use), each job seeds its
random generators from the OS as a new interpreter does, and the job modules read their
arguments when they run (grt_titan.train.main parses `sys.argv[1:]` then, not torchtitan's
default bound at import). What a fork cannot give is an environment read at import time
(inductor's TORCHINDUCTOR_* settings, OMP threads): a job whose environment differs from the
server's in one of those runs in a fresh interpreter (`python -m tests.launcher run NPROC
MODULE ARGS`), as does every job when GRT_TEST_LAUNCH_SERVER=0. Jobs that restart ranks
(`--max-restarts`) run torchrun's own agent, whose ranks are `python -m tests.launcher call
MODULE ARGS` (`call`: a job of the server that stands in for the rank's process, its exit and
the agent's SIGTERM passed through; grt_test_helpers.restart_command).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import re
import runpy
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Callable, NoReturn

REPO = Path(__file__).resolve().parents[1]


def preloaded() -> tuple[str, ...]:
    """What the server imports before it forks jobs: the installed torchtitan's trainer and
    grt_titan's adapter for it (0.2.2's train spec and trainer, or 0.3's config registry)."""
    from importlib.metadata import version

    if version("torchtitan").startswith("0.2"):
        return ("torchtitan.train", "grt_titan", "grt_titan.spec", "grt_titan.components.trainer")
    return ("torchtitan.train", "grt_titan.config_registry", "grt_titan.torchtitan_0_3.recipe")


PRELOADED = preloaded()
# Environment variables that torch, inductor, OpenMP or MKL read when they are imported or
# first used in a process: a job that changes one of them needs an interpreter of its own...
IMPORT_TIME_ENV = re.compile(r"^(TORCH|PYTORCH|OMP_|MKL_|KMP_|TRITON|CUDA|GOMP_)")
# ... except these: the cache folders are read when inductor first compiles, and a job re-reads
# torch's log settings (`_init_logs`, what `import torch` runs) when it sets them.
PER_JOB_ENV = {"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCH_LOGS", "TORCH_LOGS_OUT"}
# ... and what torchrun's agent reads when it runs (its rendezvous) or sets for its ranks that
# a process group reads when it is made (grt_test_helpers.RESTART_ENV; the agent's rank environment).
PER_JOB_ENV |= {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING"}
# ... and torchrun's TORCHELASTIC_* (rank_environment): torch.distributed.elastic reads them
# when a job runs or fails, never at import. Without this every one-process job
# (grt_test_helpers.one_process) paid a fresh interpreter.
PER_JOB_PREFIX = "TORCHELASTIC_"
PR_SET_PDEATHSIG = 1  # linux/prctl.h
STOP_GRACE_S = 5.0  # torchrun's agent also gives the surviving ranks a few seconds on SIGTERM


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a test job: one thread per rank, unbuffered output, then `env`."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}


def rank_environment(rank: int, nproc: int, port: int) -> dict[str, str]:
    """What torchrun exports to rank `rank` of a single-node job of `nproc` ranks."""
    return dict(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(nproc),
        LOCAL_WORLD_SIZE=str(nproc),
        GROUP_RANK="0",
        ROLE_RANK=str(rank),
        ROLE_WORLD_SIZE=str(nproc),
        ROLE_NAME="default",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        TORCHELASTIC_RESTART_COUNT="0",
        TORCHELASTIC_MAX_RESTARTS="0",
        TORCHELASTIC_RUN_ID="forked",
    )


def needs_fresh_interpreter(env: dict[str, str], server_env: dict[str, str]) -> list[str]:
    """The import-time variables in which `env` differs from the server's (empty: the server can
    run the job)."""
    keys = {
        k
        for k in (*env, *server_env)
        if IMPORT_TIME_ENV.match(k) and k not in PER_JOB_ENV and not k.startswith(PER_JOB_PREFIX)
    }
    return sorted(k for k in keys if env.get(k) != server_env.get(k))


def job_command(module: str, args: list[str], nproc: int | None = None) -> list[str]:
    """The fresh-interpreter command line of a job."""
    return [sys.executable, "-m", "tests.launcher", "run", str(nproc or 0), module, *args]


# ---- inside a job ------------------------------------------------------------------------


def _die_with_parent() -> None:
    """This process gets SIGKILL when its parent dies (a test's timeout kills the job), as
    torchrun's workers would not."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _exit_forked_child(body: Callable[[], int | None]) -> NoReturn:
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


def _run_module_as_main(module: str) -> int:
    """`python -m module` in this process (sys.argv set); its exit code as the interpreter
    would report it."""
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as e:  # sys.exit(n) inside the job
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1


def _describe(status: int) -> tuple[int, str]:
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        name = signal.Signals(-code).name
        return code, f"exit code {code} (signal {-code}, {name})"
    return code, f"exit code {code}"


def _run_ranks(nproc: int, module: str, every_rank_output: bool = False) -> int:
    """Fork ranks 0..nproc-1 of `python -m module` (sys.argv set) and wait for them: 0 if every
    rank exits 0; when one fails, the others are stopped and its last output is printed. With
    `every_rank_output` the other ranks' output follows rank 0's when they end (torchrun
    without --local-ranks-filter shows every rank's)."""
    port = free_port()
    logs = tempfile.mkdtemp(prefix="grt-ranks-")
    sys.stdout.flush()
    sys.stderr.flush()
    children: dict[int, int] = {}  # pid -> rank
    for rank in range(nproc):
        pid = os.fork()
        if pid == 0:

            def body(rank: int = rank) -> int:
                _die_with_parent()
                if rank != 0:  # shown only if the rank fails
                    fd = os.open(os.path.join(logs, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                    os.dup2(fd, 1)
                    os.dup2(fd, 2)
                os.environ.update(rank_environment(rank, nproc, port))
                return _run_module_as_main(module)

            _exit_forked_child(body)
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
        print(f"[launcher] rank {rank} failed: {text}", file=sys.stderr)
        log = os.path.join(logs, f"rank{rank}.log")
        if os.path.exists(log):
            with open(log, errors="replace") as f:
                print(f"[launcher] rank {rank}'s last output:\n{f.read()[-8000:]}", file=sys.stderr)
    if every_rank_output:
        for rank in sorted({*range(1, nproc)} - {rank for rank, _ in failed}):
            sys.stderr.write(_read(os.path.join(logs, f"rank{rank}.log")))
    for name in os.listdir(logs):
        os.unlink(os.path.join(logs, name))
    os.rmdir(logs)
    return 1 if failed else 0


class _TimeWithoutSleep:
    """torchtitan.train's `time` module, less its one `time.sleep`: see _skip_end_of_training_wait."""

    def __getattr__(self, name: str):
        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        pass


def _skip_end_of_training_wait() -> None:
    """torchtitan 0.2.2's Trainer.train ends with `time.sleep(2)` on rank 0 "for other ranks to
    complete" (torchtitan/train.py:707-709, its only sleep), then logs "Training completed". Every
    rank here is waited for by _run_ranks (a job ends when its last rank does), so the jobs this
    launcher forks skip it: 2 s of idle wall time per training job, about 150 jobs per CI run.
    What a job computes, logs and saves is unchanged; a user's run and torchrun's jobs
    (restarts, the docs' commands) keep the sleep. It can go if torchtitan
    drops the sleep or makes it configurable."""
    import torchtitan.train

    torchtitan.train.time = _TimeWithoutSleep()


def _run_job(module: str, args: list[str], nproc: int, every_rank_output: bool = False) -> int:
    sys.argv = [module, *args]  # as `python -m MODULE ARGS` sets it
    _skip_end_of_training_wait()
    if nproc:
        return _run_ranks(nproc, module, every_rank_output)
    return _run_module_as_main(module)


# ---- the server --------------------------------------------------------------------------


def _serve_job(request: dict) -> NoReturn:
    """The body of one forked job."""

    def body() -> int:
        os.setpgid(0, 0)  # the client kills the job's process group on a timeout
        _die_with_parent()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        # Appended: a restarted job's output follows its last run's (tests/reliability/ft_helpers.py),
        # and stdout and stderr may name one file, as with stderr=subprocess.STDOUT.
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), fd)
        sys.stdout.reconfigure(line_buffering=True)  # as PYTHONUNBUFFERED would
        os.chdir(request["cwd"])
        # sys.path as `python -m` builds it: the working directory, then PYTHONPATH's entries.
        sys.path[0] = os.getcwd()
        extra = [path for path in request["env"].get("PYTHONPATH", "").split(os.pathsep) if path]
        sys.path[1:1] = [path for path in extra if path not in sys.path]
        logs_before = {k: os.environ.get(k) for k in ("TORCH_LOGS", "TORCH_LOGS_OUT")}
        os.environ.clear()
        os.environ.update(request["env"])
        if any(os.environ.get(k) != v for k, v in logs_before.items()):
            import torch._logging._internal

            torch._logging._internal._init_logs()
        _fresh_random_state()
        return _run_job(
            request["module"], request["args"], request["nproc"] or 0, request.get("every_rank_output", False)
        )

    _exit_forked_child(body)


def _fresh_random_state() -> None:
    """Random generators seeded as in a fresh interpreter (each from the OS): a fork would
    otherwise hand every job the server's state. (Python's hash seed stays the server's.)"""
    import random

    import torch

    random.seed()
    torch.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def _read_line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("client closed the connection before its request ended")
        data += chunk
    return data


def serve(path: str) -> None:
    """One job per connection: the client sends {"module", "args", "env", "cwd", "nproc",
    "stdout", "stderr"} as a JSON line; the server forks the job (its own process group),
    answers {"pid": ...} at once and {"code": ...} when it ends. A job lives no longer than its
    client's connection: a client that dies (SIGKILL included) takes its job with it, as a
    rank dies with its process. Single-threaded, so nothing holds a lock when it forks."""
    _die_with_parent()
    for name in PRELOADED:
        importlib.import_module(name)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    print("ready", flush=True)
    jobs: dict[int, socket.socket] = {}  # pid -> its client's connection
    abandoned: set[int] = set()  # jobs whose client is gone, killed and not yet reaped
    while True:
        clients = {conn: pid for pid, conn in jobs.items() if pid not in abandoned}
        readable, _, _ = select.select([server, *clients], [], [], 0.05)
        for conn in readable:
            if conn is server:
                _fork_job(server, jobs)
            elif _client_gone(conn):
                with contextlib.suppress(OSError):
                    os.killpg(clients[conn], signal.SIGKILL)
                abandoned.add(clients[conn])
        _reap(jobs, abandoned)


def _fork_job(server: socket.socket, jobs: dict[int, socket.socket]) -> None:
    """Accept one request, fork its job, answer with its pid."""
    conn, _ = server.accept()
    try:
        request = json.loads(_read_line(conn))
    except (ConnectionError, ValueError):
        conn.close()
        return
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        server.close()
        _serve_job(request)
    # The job's own process group before its pid goes out, so that a kill right after the
    # reply reaches it (the job calls setpgid too: whichever runs first makes it).
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)
    with contextlib.suppress(OSError):  # a client already gone: _client_gone sees it next
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    jobs[pid] = conn


def _client_gone(conn: socket.socket) -> bool:
    """Whether a readable client connection was closed (clients send nothing after their request)."""
    try:
        return conn.recv(4096) == b""
    except OSError:
        return True


def _reap(jobs: dict[int, socket.socket], abandoned: set[int]) -> None:
    """Send each ended job's exit code to its client."""
    while jobs:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            break
        conn = jobs.pop(pid, None)
        abandoned.discard(pid)
        if conn is not None:
            try:
                conn.sendall(json.dumps({"code": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            except OSError:  # the client gave up (timeout) and closed its end
                pass
            conn.close()


class _Server:
    """The test process's side: starts the server on first use and runs jobs through it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # tests may launch from several threads (test_presets)
        self.process: subprocess.Popen | None = None
        self.env: dict[str, str] = {}

    def _start(self) -> None:
        import atexit

        self.folder = tempfile.mkdtemp(prefix="grt-launch-")
        atexit.register(shutil.rmtree, self.folder, ignore_errors=True)  # socket, server log
        self.path = os.path.join(self.folder, "socket")
        self.env = job_env()
        log = open(os.path.join(self.folder, "server.log"), "w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.launcher", "serve", self.path],
            cwd=REPO,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        if self.process.stdout.readline().strip() != "ready":
            with open(os.path.join(self.folder, "server.log")) as f:
                raise RuntimeError(f"tests.launcher did not start:\n{f.read()[-4000:]}")

    def can_run(self, module: str, args: list[str], env: dict[str, str]) -> bool:
        """Whether the server can run a job of environment `env` (needs_fresh_interpreter). A job
        it cannot is logged to $GRT_TEST_FRESH_LOG (where the suite's CPU goes, tests/README.md)."""
        self.socket_path()  # the server's environment is known once it runs
        fresh = needs_fresh_interpreter(env, self.env)
        if fresh and os.environ.get("GRT_TEST_FRESH_LOG"):
            with open(os.environ["GRT_TEST_FRESH_LOG"], "a") as log:
                log.write(f"{module} {' '.join(args[:4])}: {', '.join(fresh)}\n")
        return not fresh

    def run(
        self, module: str, args: list[str], env: dict[str, str], timeout: float, nproc: int | None, cwd: Path
    ) -> subprocess.CompletedProcess | None:
        """As subprocess.run(capture_output=True, text=True) of the job; None when the job
        needs an interpreter of its own (needs_fresh_interpreter)."""
        if not self.can_run(module, args, env):
            return None
        return _captured(lambda out, err: _submit(self.socket_path(), module, args, env, nproc, cwd, out, err), timeout)

    def socket_path(self) -> str:
        """The server's socket (started if it is not running), for `call` clients."""
        with self.lock:
            if self.process is None or self.process.poll() is not None:
                self._start()
        return self.path


# ---- a started job -----------------------------------------------------------------------

REPLY_TIMEOUT_S = 60.0  # the server answers a request with the job's pid as soon as it forks


class Job:
    """A job `start` started, as much of subprocess.Popen as tests use: `pid`, `args` (its
    fresh-interpreter command), `poll`, `wait`, and a `kill` that reaches every rank: `pid`
    leads the job's process group (the server makes one per job; a fresh interpreter starts a
    session of its own), and the ranks are forked into it."""

    pid: int
    args: list[str]

    def wait(self, timeout: float | None = None) -> int:
        """The job's exit code once it ends; subprocess.TimeoutExpired after `timeout` s."""
        raise NotImplementedError

    def poll(self) -> int | None:
        """The exit code, or None while the job runs."""
        try:
            return self.wait(0)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL the job's process group: the job and all its ranks."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)


class _ServedJob(Job):
    """A job the server forked: its pid, then its exit code, come as JSON lines on `conn`."""

    def __init__(self, conn: socket.socket, args: list[str]) -> None:
        self.conn, self.args, self.returncode, self.buffer = conn, args, None, b""
        reply = self._message(REPLY_TIMEOUT_S)
        if reply is None:
            raise ConnectionError("the launcher's server closed the connection before starting the job")
        self.pid = reply["pid"]

    def _message(self, timeout: float | None) -> dict | None:
        """The server's next JSON line; None if the server is gone. select() rather than a socket
        timeout: a wait that times out leaves no half-read line behind for the next one."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.conn], [], [], left)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            chunk = self.conn.recv(65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            message = self._message(timeout)
            # None: the server died, and SIGKILL took its jobs with it (_die_with_parent).
            self.returncode = -signal.SIGKILL if message is None else message["code"]
            self.conn.close()
        return self.returncode


class _FreshJob(Job):
    """A job in an interpreter of its own (`python -m tests.launcher run ...`)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.pid, self.args = proc, proc.pid, proc.args

    def wait(self, timeout: float | None = None) -> int:
        return self.proc.wait(timeout)


def _submit(
    path: str,
    module: str,
    args: list[str],
    env: dict,
    nproc: int | None,
    cwd: str | Path,
    stdout: str,
    stderr: str,
    every_rank_output: bool = False,
) -> _ServedJob:
    """Have the server at `path` fork the job (`serve`), output appended to the two files."""
    request = dict(
        module=module,
        args=list(args),
        env=dict(env),
        cwd=str(cwd),
        nproc=nproc,
        stdout=stdout,
        stderr=stderr,
        every_rank_output=every_rank_output,
    )
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        conn.sendall(json.dumps(request).encode() + b"\n")
        return _ServedJob(conn, job_command(module, args, nproc))
    except BaseException:
        conn.close()
        raise


def _captured(begin: Callable[[str, str], Job], timeout: float) -> subprocess.CompletedProcess:
    """The job `begin(stdout_file, stderr_file)` starts, run to its end as
    subprocess.run(capture_output=True, text=True, timeout=timeout) would: its output read back
    from the files (in a temporary folder, removed), and on a timeout every process of the job
    killed and subprocess.TimeoutExpired raised with the output so far."""
    folder = tempfile.mkdtemp(prefix="grt-job-")
    out, err = os.path.join(folder, "out"), os.path.join(folder, "err")
    try:
        job = begin(out, err)
        try:
            code = job.wait(timeout)
        except subprocess.TimeoutExpired:
            job.kill()
            job.wait()
            raise subprocess.TimeoutExpired(job.args, timeout, output=_read(out), stderr=_read(err)) from None
        return subprocess.CompletedProcess(job.args, code, _read(out), _read(err))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


SOCKET_ENV = "GRT_TEST_LAUNCH_SOCKET"


def call(module: str, args: list[str], nproc: int | None = None, every_rank_output: bool = False) -> int:
    """`python -m tests.launcher call MODULE ARGS`: `python -m MODULE ARGS` (or `nproc` ranks
    of it) run by the server at $GRT_TEST_LAUNCH_SOCKET in this working directory and
    environment; its output printed when it ends, its exit code returned. The docs'
    `grt-titan` and `torchrun` commands go through it (tests/docs: a console command is
    otherwise an interpreter start that imports torchtitan, a torchrun command three), and so
    do the ranks that torchrun's own agent starts for a restart (grt_test_helpers.torchrun).

    For that agent it stands in for the rank's process: a job killed by a signal ends this
    process by the same signal, and SIGTERM (how the agent stops the survivors of a failed
    rank) kills the job, prints its output so far, and ends this process by SIGTERM. A caller
    that dies before it knows its job (a SIGTERM before the server's reply) or without a handler
    (SIGKILL) takes the job with it all the same: the server kills a job whose client is gone."""
    env, cwd = dict(os.environ), os.getcwd()
    started: list[tuple[Job, str, str]] = []

    def begin(out: str, err: str) -> Job:
        job = _submit(env[SOCKET_ENV], module, args, env, nproc, cwd, out, err, every_rank_output)
        started.append((job, out, err))
        return job

    def stop(signum: int, frame) -> None:
        for job, out, err in started:
            job.kill()
            sys.stdout.write(_read(out))
            sys.stderr.write(_read(err))
            shutil.rmtree(os.path.dirname(out), ignore_errors=True)  # _captured's folder
        _end_by_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    proc = _captured(begin, 3600)
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    if proc.returncode < 0:  # killed by a signal: so is this process, as the job's would be
        _end_by_signal(-proc.returncode)
    return proc.returncode


def _end_by_signal(signum: int) -> None:
    """End this process by signal `signum` (its default action), output flushed."""
    sys.stdout.flush()
    sys.stderr.flush()
    with contextlib.suppress(OSError):  # SIGKILL and SIGSTOP have no handler to reset
        signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def served_torchrun(argv: list[str]) -> tuple[int, str, list[str], bool] | None:
    """What `torchrun ARGV` runs when it is `torchrun --nproc_per_node=N
    [--local-ranks-filter=0] -m MODULE ARGS` (one node, no restarts), as (N, MODULE, ARGS,
    every rank's output shown); None for any other option, which the real torchrun runs."""
    nproc, every_rank_output, i = None, True, 0
    while i < len(argv):
        key, has_value, value = argv[i].partition("=")
        if key in ("--nproc_per_node", "--nproc-per-node", "--local-ranks-filter", "--local_ranks_filter"):
            if not has_value:
                i += 1
                value = argv[i] if i < len(argv) else ""
            if key.startswith("--nproc") and value.isdigit() and int(value) >= 1:
                nproc = int(value)
            elif key.startswith("--local") and value == "0":
                every_rank_output = False
            else:
                return None
        elif argv[i] == "-m" and i + 1 < len(argv) and nproc:
            return nproc, argv[i + 1], argv[i + 2 :], every_rank_output
        else:
            return None
        i += 1
    return None


def torchrun(argv: list[str]) -> int:
    """`python -m tests.launcher torchrun ARGS`: a `torchrun` of one node run by the server
    (`call`, torchrun's rank environment, tests/docs' shim), any other by the real torchrun
    beside this interpreter."""
    served = served_torchrun(argv)
    if served is None:
        real = os.path.join(os.path.dirname(sys.executable), "torchrun")
        os.execv(real, [real, *argv])
    nproc, module, args, every_rank_output = served
    return call(module, args, nproc, every_rank_output)


def _read(path: str) -> str:
    if not os.path.exists(path):
        return ""
    with open(path, errors="replace") as f:
        return f.read()


_SERVER = _Server()


def served(module: str, args: list[str], env: dict[str, str]) -> bool:
    """Whether the server runs this job: not where GRT_TEST_LAUNCH_SERVER=0, nor for an
    environment it cannot fork for (`_Server.can_run`)."""
    return os.environ.get("GRT_TEST_LAUNCH_SERVER", "1") != "0" and _SERVER.can_run(module, args, env)


def start(
    module: str,
    args: list[str],
    stdout: str | Path,
    stderr: str | Path | None = None,
    env: dict[str, str] | None = None,
    nproc: int | None = None,
    cwd: Path = REPO,
) -> Job:
    """Start a job (module docstring) and return at once: for a test that follows a job's
    output while it runs, kills and restarts it (tests/reliability/ft_helpers.py). Its output
    is appended to the file `stdout`, stderr too unless `stderr` names another file.
    Forked by the server, or in a fresh interpreter where the server cannot run it
    (needs_fresh_interpreter) or GRT_TEST_LAUNCH_SERVER=0."""
    env = job_env() if env is None else env
    stderr = stderr or stdout
    if served(module, args, env):
        return _submit(_SERVER.socket_path(), module, args, env, nproc, cwd, str(stdout), str(stderr))
    with open(stdout, "a") as out, open(stderr, "a") as err:  # O_APPEND, as the server opens them
        return _FreshJob(
            subprocess.Popen(
                job_command(module, args, nproc),
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        )


def launch(
    module: str,
    args: list[str],
    env: dict[str, str] | None = None,
    timeout: float = 600,
    nproc: int | None = None,
    cwd: Path = REPO,
) -> subprocess.CompletedProcess:
    """Run a job (module docstring) with environment `env` (default: job_env()), output
    captured; raises subprocess.TimeoutExpired after `timeout` s, its processes killed."""
    return _captured(lambda out, err: start(module, args, out, err, env, nproc, cwd), timeout)


def fake_backend_env(world_size: int) -> dict[str, str]:
    """Rank 0 of `world_size` on torchtitan's fake backend (`--comm.mode fake_backend`)."""
    return job_env({"NGPU": str(world_size), "LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": str(world_size)})


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"] and len(argv) == 2:
        serve(argv[1])
        return 0
    if argv[:1] == ["call"] and len(argv) >= 2:
        return call(argv[1], argv[2:])
    if argv[:1] == ["torchrun"]:
        return torchrun(argv[1:])
    if argv[:1] == ["run"] and len(argv) >= 3 and argv[1].isdigit():
        _die_with_parent()
        for name in PRELOADED:
            importlib.import_module(name)
        return _run_job(argv[2], argv[3:], int(argv[1]))
    print(
        "usage: python -m tests.launcher serve SOCKET | run NPROC MODULE [ARGS...] (NPROC 0: no ranks) | call MODULE [ARGS...] | torchrun [ARGS...]",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
