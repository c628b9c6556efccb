"""One interpreter per pytest process that imports torch, torchtitan and grt_titan once and forks
every training job the tests launch (`grt_test_helpers.torchrun`, `one_process`, the presets'
fake-backend runs).

    python -m tests.launch_server SOCKET

Why: on CI's 2 cores an interpreter start that imports torch, torchtitan and grt_titan costs
about 9 s of CPU (12-15 s of wall time when both cores are busy), as much as a small test run,
and the suite launches a few hundred jobs. Forking a job from a process that has only imported
gives it the state a fresh `python -m MODULE` would have: no model, process group or thread
pool exists before the fork (tests/forked_torchrun.py forks the ranks of one job the same way),
and each job seeds its random generators from the OS, as a new interpreter does (the ranks of
one job inherit that job's state; torchtitan broadcasts rank 0's seed anyway). What a
fork cannot give is an environment read at import time (inductor's TORCHINDUCTOR_* settings,
OMP threads): a job whose environment differs from the server's in such a variable runs as a
real subprocess (`needs_fresh_interpreter`); TORCH_LOGS is re-read per job.

A job is one connection: the client sends {"module", "args", "env", "cwd", "nproc", "stdout",
"stderr"} as one JSON line; the server forks the job (its own process group, killed with the
server), answers {"pid": ...} at once and {"code": ...} when the job ends. nproc null runs the
module in the job process itself (`python -m MODULE ARGS`); nproc N forks N gloo ranks from it
(`python -m tests.forked_torchrun N MODULE ARGS`). The server is single-threaded, so nothing
holds a lock when it forks.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import sys
from typing import NoReturn

from tests import forked_torchrun

# Environment variables that torch, inductor, OpenMP or MKL read when they are imported or
# first used in a process: a job that changes one of them needs an interpreter of its own.
IMPORT_TIME_ENV = re.compile(r"^(TORCH|PYTORCH|OMP_|MKL_|KMP_|TRITON|CUDA|GOMP_)")
# ... except these: the cache folders are read when inductor first compiles, and a job re-reads
# torch's log settings (`_init_logs`, what `import torch` runs) when it sets them.
PER_JOB_ENV = {"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCH_LOGS", "TORCH_LOGS_OUT"}


def needs_fresh_interpreter(env: dict[str, str], server_env: dict[str, str]) -> list[str]:
    """The import-time variables in which `env` differs from the server's (empty: the server can
    run the job)."""
    keys = {k for k in (*env, *server_env) if IMPORT_TIME_ENV.match(k) and k not in PER_JOB_ENV}
    return sorted(k for k in keys if env.get(k) != server_env.get(k))


def _job(request: dict) -> NoReturn:
    """The body of one forked job."""
    def body() -> int:
        os.setpgid(0, 0)  # the client kills the job's process group on a timeout
        forked_torchrun.die_with_parent()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
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
        forked_torchrun.set_job_arguments(request["module"], request["args"])
        if request["nproc"] is None:
            return forked_torchrun.run_module_as_main(request["module"])
        return forked_torchrun.run_ranks(int(request["nproc"]), request["module"])

    forked_torchrun.exit_forked_child(body)


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
    forked_torchrun.die_with_parent()
    forked_torchrun.preload()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    print("ready", flush=True)
    jobs: dict[int, socket.socket] = {}
    while True:
        readable, _, _ = select.select([server], [], [], 0.05)
        if readable:
            conn, _ = server.accept()
            try:
                request = json.loads(_read_line(conn))
            except (ConnectionError, ValueError):
                conn.close()
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                server.close()
                _job(request)
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            jobs[pid] = conn
        while jobs:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = jobs.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(json.dumps({"code": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
                except OSError:  # the client gave up (timeout) and closed its end
                    pass
                conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])


class LaunchClient:
    """The test process's side: starts the server on first use and runs jobs through it."""

    def __init__(self, repo: str):
        import threading

        self.repo = repo
        self.lock = threading.Lock()  # tests may launch from several threads (test_presets)
        self.process = None
        self.env: dict[str, str] = {}
        self.folder = None

    def _start(self) -> None:
        import atexit
        import shutil
        import subprocess
        import tempfile

        self.folder = tempfile.mkdtemp(prefix="grt-launch-")
        atexit.register(shutil.rmtree, self.folder, ignore_errors=True)  # socket and server log
        self.path = os.path.join(self.folder, "socket")
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen([sys.executable, "-m", "tests.launch_server", self.path], cwd=self.repo,
                                        env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=open(os.path.join(self.folder, "server.log"), "w"), text=True)
        line = self.process.stdout.readline()
        if line.strip() != "ready":
            with open(os.path.join(self.folder, "server.log")) as f:
                raise RuntimeError(f"tests.launch_server did not start:\n{f.read()[-4000:]}")

    def run(self, module: str, args: list[str], env: dict[str, str], timeout: float,
            nproc: int | None = None, cwd: str | None = None):
        """Like subprocess.run(capture_output=True, text=True) of `python -m module args`
        (nproc None) or `python -m tests.forked_torchrun nproc module args`; None when the job
        needs an interpreter of its own (needs_fresh_interpreter)."""
        import subprocess

        import uuid

        with self.lock:
            if self.process is None or self.process.poll() is not None:
                self._start()
        if needs_fresh_interpreter(env, self.env):
            return None
        command = forked_torchrun.job_command(module, args, nproc)
        out, err = (os.path.join(self.folder, f"job-{uuid.uuid4().hex}.{n}") for n in ("out", "err"))
        request = dict(module=module, args=list(args), env=dict(env), cwd=cwd or self.repo, nproc=nproc,
                       stdout=out, stderr=err)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self.path)
            conn.sendall(json.dumps(request).encode() + b"\n")
            conn.settimeout(timeout)
            reply = conn.makefile("rb")
            pid = json.loads(reply.readline())["pid"]
            try:
                line = reply.readline()
            except TimeoutError:
                line = b""
            if not line:  # timed out (or the server died): the job's whole process group goes
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                raise subprocess.TimeoutExpired(command, timeout, output=_read(out), stderr=_read(err))
            code = json.loads(line)["code"]
            return subprocess.CompletedProcess(command, code, _read(out), _read(err))
        finally:
            conn.close()
            for path in (out, err):
                if os.path.exists(path):
                    os.unlink(path)


def _read(path: str) -> str:
    if not os.path.exists(path):
        return ""
    with open(path, errors="replace") as f:
        return f.read()
