"""The tests' launcher (tests/launcher.py) runs a served job as `python -m MODULE ARGS` or its
fresh-interpreter form would: same arguments, working directory, environment, closed stdin,
exit code and output; ranks as torchrun's; a timeout kills the job; an import-time variable
sends the job to a fresh interpreter."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.launcher import _SERVER, REPO, job_env, needs_fresh_interpreter, rank_environment, start


class Client:
    """The server's side of `launch`: `run` returns None where launch would start a fresh interpreter."""

    @staticmethod
    def run(module, args, env, timeout, nproc=None, cwd=REPO):
        return _SERVER.run(module, args, env, timeout, nproc, cwd)


@pytest.fixture(scope="module")
def client():
    return Client()


def json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def probe_lines(proc):
    return json_lines(proc.stdout)


def test_a_job_sees_what_python_dash_m_would(client, tmp_path):
    env = {**job_env(), "GRT_PROBE": "one", "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path / "extra")])}
    served = client.run("tests.launch_probe", ["--exit", "7", "a", "b"], env, timeout=60, cwd=str(tmp_path))
    fresh = subprocess.run(
        [sys.executable, "-m", "tests.launch_probe", "--exit", "7", "a", "b"],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert served.returncode == fresh.returncode == 7
    (got,), (expected,) = probe_lines(served), probe_lines(fresh)
    got["argv"][0] = expected["argv"][0] = "(module path)"
    first_seed = got.pop("torch_seed")
    assert first_seed != expected.pop("torch_seed")  # random per interpreter
    assert got.pop("pid") != expected.pop("pid")
    # What differs by design: the server loaded torchtitan.train, without its closing sleep.
    assert (got.pop("sleeps"), got.pop("clock")) == (False, True) and "sleeps" not in expected
    assert got == expected
    assert got["argv"][1:] == ["--exit", "7", "a", "b"] and got["probe"] == "one"
    # The next job gets its own arguments and environment, not the last one's.
    again = client.run("tests.launch_probe", ["c"], {**env, "GRT_PROBE": "two"}, timeout=60)
    (second,) = probe_lines(again)
    assert again.returncode == 0 and second["argv"][1:] == ["c"] and second["probe"] == "two"
    assert second["cwd"] == str(REPO)
    # Each job's generators are seeded afresh, not inherited from the server.
    assert second["torch_seed"] != first_seed


def test_forked_ranks_through_the_server(client):
    # Rank 1 fails a second after its line, so that rank 0 has printed its own before the
    # launcher stops it (on a loaded machine rank 0 could otherwise be stopped first).
    args = ["--sleep", "1", "--fail-rank", "1", "x"]
    proc = client.run("tests.launch_probe", args, job_env(), timeout=60, nproc=2)
    assert proc.returncode == 1
    (rank0,) = probe_lines(proc)  # rank 0's output only, as --local-ranks-filter=0
    assert rank0["rank"] == 0 and rank0["world_size"] == "2" and rank0["argv"][1:] == args
    assert "[launcher] rank 1 failed: exit code 3" in proc.stderr and "rank 1 fails" in proc.stderr


def test_a_timeout_kills_the_job(client, tmp_path):
    start = time.monotonic()
    env = {**job_env(), "GRT_PROBE_PIDS": str(tmp_path)}
    with pytest.raises(subprocess.TimeoutExpired) as error:
        client.run("tests.launch_probe", ["--sleep", "600"], env, timeout=3, nproc=2)
    assert time.monotonic() - start < 30
    assert '"rank": 0' in error.value.output
    ranks = {int(f.name): int(f.read_text()) for f in tmp_path.iterdir() if f.name.isdigit()}
    assert 0 in ranks, ranks  # rank 0 wrote its pid before its line
    pids = list(ranks.values())
    deadline = time.monotonic() + 10
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(map(_alive, pids)), pids
    # The server goes on serving.
    assert client.run("tests.launch_probe", [], job_env(), timeout=60).returncode == 0


def _state_and_group(pid: int | str) -> tuple[str, int] | None:
    """Process `pid`'s state letter and process group (/proc/PID/stat); None once it is gone."""
    try:
        state, _, group = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:3]
    except OSError:
        return None
    return state, int(group)


def live_processes_of_group(pgid: int) -> list[int]:
    """The processes of process group `pgid` that are not zombies (/proc)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        stat = _state_and_group(entry.name)
        if stat is not None and stat[0] != "Z" and stat[1] == pgid:
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize("fresh", [False, True], ids=["served", "fresh_interpreter"])
def test_a_started_job_runs_while_its_log_is_read_and_a_kill_takes_every_rank(fresh, tmp_path):
    """`start` (tests/reliability/ft_helpers.Group): it returns while the job runs, whose output
    a test reads from its log; `kill` takes the job and all its ranks; `wait` gives the exit
    code; a restart's output, stderr included, is appended to the same log. Served, and in a
    fresh interpreter (an import-time variable here; GRT_TEST_LAUNCH_SERVER=0 likewise). Either
    way the job runs torchtitan.train without its closing 2 s sleep
    (launcher._skip_end_of_training_wait), and with the rest of its `time`."""
    log = tmp_path / "job.log"
    env = {**job_env(), "TORCHINDUCTOR_COMPILE_THREADS": "1"} if fresh else job_env()
    job = start("tests.launch_probe", ["--sleep", "600", "first"], log, env=env, nproc=2)
    try:
        deadline = time.monotonic() + 120
        # Rank 0's line in the log, and the job (or its interpreter) with its 2 ranks alive.
        while not (log.exists() and json_lines(log.read_text())) or len(live_processes_of_group(job.pid)) < 3:
            assert job.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        (line,) = [line for line in json_lines(log.read_text()) if line["rank"] == 0]
        assert (line["sleeps"], line["clock"]) == (False, True), line
        job.kill()
        assert job.wait(timeout=30) == -signal.SIGKILL
        deadline = time.monotonic() + 10
        while live_processes_of_group(job.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert live_processes_of_group(job.pid) == []
    finally:
        job.kill()
    again = start("tests.launch_probe", ["--fail-rank", "0", "second"], log)
    assert again.wait(timeout=60) == 3
    text = log.read_text()
    assert [line["argv"][-1] for line in json_lines(text)] == ["first", "second"] and "rank 0 fails" in text, text


def test_a_job_killed_as_soon_as_it_starts_dies(tmp_path):
    """The server puts a job in its own process group before it answers with the pid (the job
    does too, but may not have run yet): a kill right after `start` reaches the job."""
    for _ in range(3):
        job = start("tests.launch_probe", ["--sleep", "600"], tmp_path / "job.log")
        try:
            job.kill()
            assert job.wait(timeout=10) == -signal.SIGKILL
        finally:
            job.kill()


def test_import_time_variables_need_a_fresh_interpreter(client):
    base = {"PATH": "/usr/bin", "OMP_NUM_THREADS": "1"}
    assert needs_fresh_interpreter({**base, "GRT_PROBE": "x", "RANK": "1"}, base) == []
    assert needs_fresh_interpreter({**base, "TORCHINDUCTOR_FX_GRAPH_CACHE": "0"}, base) == [
        "TORCHINDUCTOR_FX_GRAPH_CACHE"
    ]
    assert needs_fresh_interpreter({"PATH": "/usr/bin"}, base) == ["OMP_NUM_THREADS"]
    # Read per job: cache folders, log settings.
    assert needs_fresh_interpreter({**base, "TORCHINDUCTOR_CACHE_DIR": "/tmp/c", "TORCH_LOGS": "+dynamo"}, base) == []
    # torchrun's variables of a one-process job (grt_test_helpers.one_process) are read at run time.
    assert needs_fresh_interpreter({**base, **rank_environment(0, 1, 29500)}, base) == []
    env = {**job_env(), "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    # The server refuses such a job; `start` and `launch` run it in a fresh interpreter instead
    # (test_a_started_job_runs_while_its_log_is_read_and_a_kill_takes_every_rank[fresh_interpreter]).
    assert client.run("tests.launch_probe", [], env, timeout=60) is None


def test_a_job_sets_torch_logs(client):
    """TORCH_LOGS is read when torch is imported; a served job re-reads it."""
    env = {**job_env(), "TORCH_LOGS": "recompiles"}
    proc = client.run("tests.launch_probe", ["--torch-logs"], env, timeout=60)
    (line,) = probe_lines(proc)
    assert line["recompiles_log_level"] == 10  # logging.DEBUG: the recompiles artifact is on
    proc = client.run("tests.launch_probe", ["--torch-logs"], job_env(), timeout=60)
    assert probe_lines(proc)[0]["recompiles_log_level"] != 10


def test_call_runs_a_job_in_the_callers_folder_and_environment(tmp_path):
    """`python -m tests.launcher call MODULE ARGS` (the docs' `grt-titan` shim): the server runs
    the job where the caller is, with its environment; output and exit code come back."""
    from tests.launcher import SOCKET_ENV

    env = {**job_env(), "GRT_PROBE": "called", "PYTHONPATH": str(REPO), SOCKET_ENV: _SERVER.socket_path()}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.launcher", "call", "tests.launch_probe", "--exit", "3", "x"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    (line,) = probe_lines(proc)
    assert proc.returncode == 3 and line["argv"][1:] == ["--exit", "3", "x"]
    assert line["probe"] == "called" and line["cwd"] == str(tmp_path)


def test_call_stands_in_for_a_rank_that_torchruns_agent_starts(tmp_path):
    """A rank started by torchrun's own agent as `call` (grt_test_helpers.restart_command): a
    job killed by a signal ends the caller by that signal; the agent's SIGTERM kills the job,
    and ends the caller by SIGTERM with the job's output so far printed; a caller killed
    outright (SIGKILL: no handler runs) takes its job with it."""
    from tests.launcher import SOCKET_ENV

    env = {**job_env(), "PYTHONPATH": str(REPO), SOCKET_ENV: _SERVER.socket_path()}
    command = [sys.executable, "-m", "tests.launcher", "call", "tests.launch_probe"]
    killed = subprocess.run(
        [*command, "--kill-self", str(int(signal.SIGKILL))], env=env, capture_output=True, timeout=60
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    for signum in (signal.SIGTERM, signal.SIGKILL):
        started = tmp_path / f"started-{signum}"
        proc = subprocess.Popen(
            [*command, "--sleep", "300"],
            env={**env, "GRT_PROBE_STARTED": str(started)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert started.exists(), proc.communicate(timeout=10)
        job_pid = int(started.read_text())
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == -signum, err
        if signum == signal.SIGTERM:
            (line,) = [json.loads(text) for text in out.splitlines() if text.startswith("{")]
            assert line["pid"] == job_pid
        deadline = time.monotonic() + 10
        while _alive(job_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(job_pid), f"the job outlived its caller's {signal.Signals(signum).name}"


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, killed and not yet reaped, does not)."""
    stat = _state_and_group(pid)
    return stat is not None and stat[0] != "Z"


def test_the_torchrun_shim_runs_one_node_through_the_server_and_every_other_torchrun_itself(tmp_path):
    """`python -m tests.launcher torchrun ARGS` (the docs' `torchrun` shim): a one-node torchrun
    of a module runs its ranks through the server, every rank's output shown unless
    --local-ranks-filter=0 keeps rank 0's; any other option goes to the real torchrun."""
    from tests.launcher import SOCKET_ENV, served_torchrun

    assert served_torchrun(["--nproc_per_node=2", "-m", "m", "--a", "1"]) == (2, "m", ["--a", "1"], True)
    assert served_torchrun(["--nproc-per-node", "4", "--local-ranks-filter=0", "-m", "m"]) == (4, "m", [], False)
    for other in (
        ["--nproc_per_node=2", "--max-restarts", "1", "-m", "m"],
        ["--nnodes=2", "--nproc_per_node=2", "-m", "m"],
        ["--nproc_per_node=2", "--local-ranks-filter=1", "-m", "m"],
        ["--nproc_per_node=gpu", "-m", "m"],
        ["--nproc_per_node=2", "train.py"],
        ["-m", "m"],
    ):
        assert served_torchrun(other) is None, other
    env = {**job_env(), "PYTHONPATH": str(REPO), SOCKET_ENV: _SERVER.socket_path()}
    for ranks_filter, shown in (([], [0, 1]), (["--local-ranks-filter=0"], [0])):
        proc = subprocess.run(
            [sys.executable, "-m", "tests.launcher", "torchrun", "--nproc_per_node=2", *ranks_filter]
            + ["-m", "tests.launch_probe", "x"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        lines = json_lines(proc.stdout + proc.stderr)
        assert proc.returncode == 0 and [line["rank"] for line in lines] == shown
        assert all(line["world_size"] == "2" and line["argv"][1:] == ["x"] for line in lines)


def test_a_forked_ranks_teardown_abort_is_recognised():
    """grt_test_helpers.is_teardown_abort reads the launcher's failure line as it reads torchrun's,
    so a forked run that hit the gloo teardown abort is repeated once (grt_test_helpers.torchrun)."""
    from grt_test_helpers import THREAD_TERMINATE, is_teardown_abort
    from tests.launcher import _describe

    _, text = _describe(signal.SIGABRT)  # a wait status: killed by SIGABRT
    assert is_teardown_abort(f"[launcher] rank 1 failed: {text}\n{THREAD_TERMINATE}\n")
    assert not is_teardown_abort(f"[launcher] rank 1 failed: {text}\n")  # no teardown signature
    _, text = _describe(signal.SIGTERM)
    assert not is_teardown_abort(f"[launcher] rank 0 failed: {text}\n{THREAD_TERMINATE}\n")
