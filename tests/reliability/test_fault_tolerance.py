"""Fault tolerance through torchft (docs/fault_tolerance.md): a lighthouse and
two replica groups (gloo), killed, restarted, and semi-synchronous.

One scripted run of two one-rank groups gives the four fault cases their evidence (a module
fixture): both start; group 1 is killed (SIGKILL) after its step 4; group 0 commits steps
alone; the lighthouse is killed and restarted, and group 0 steps on; group 1 is restarted and
heals from group 0 through the new lighthouse; both finish. Its one-rank groups average their gradients through grt_titan's path (FSDP's
hook does it with several ranks). Each step line carries a digest of (rank 0's shard of) the
weights (tests/reliability/ft_worker.py), so "identical weights" is compared bit for bit.
Short runs cover FSDP inside each group (2 x 2 ranks), DiLoCo, local SGD and a loss spike in
one group.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import subprocess
import time

import pytest
from ft_helpers import (
    FT_RUN,
    Group,
    Lighthouse,
    digests_by_step,
    lighthouse_command,
    no_process_left,
    run_to_the_end,
    tails,
    uncommitted_steps,
    wait_until,
)

from grt_test_helpers import DEBUG_TOML, parse_config
from tests.launcher import free_port

# The jobs need torchft's lighthouse (the [ft] extra, in [test]); the config checks do not.
needs_torchft = pytest.mark.skipif(importlib.util.find_spec("torchft") is None, reason="needs the [ft] extra")


def ft_job(test):
    """A test that runs replica groups: slow, and needs torchft."""
    return pytest.mark.slow(needs_torchft(test))


STEPS = 36  # room for group 1's restart while group 0 steps
KILL_AFTER = 4  # group 1 is killed once it has logged this many steps
ALONE_STEPS = 3  # group 0 commits this many steps alone before group 1 restarts
PACE = {"FT_STEP_SLEEP": "0.3"}  # seconds between steps: room to kill and restart mid-run


@pytest.fixture(scope="module")
def faults(module_tmp):
    root = module_tmp("fault_tolerance")
    # The first quorum waits up to 10 s for both groups' start-ups; a survivor's first quorum
    # alone waits for the heartbeat timeout (5 s) either way.
    lighthouse = Lighthouse(free_port(), root / "lighthouse.log", join_timeout_ms=10_000).start()
    args = [*FT_RUN, "--training.steps", str(STEPS), "--checkpoint.enable", "--checkpoint.interval", "1000"]
    args += ["--metrics.enable-tensorboard"]  # the live groups, read back by `grt-titan table`
    groups = [Group(i, 2, root / f"group{i}", args, PACE) for i in range(2)]
    g0, g1 = groups
    events = {}
    with no_process_left(lighthouse, groups):
        for g in groups:
            g.start(lighthouse)
        # Steps group 1 logged, not its step number: a group that starts late heals into the run
        # at group 0's step (CI under load: at step 3), and needs its own steps before the kill.
        wait_until(lambda: len(g1.steps()) >= KILL_AFTER, 300, f"group 1's {KILL_AFTER} steps", groups)
        g1.kill()
        events["killed_at"], events["killed_step"] = time.monotonic(), g0.last_step()
        # Group 1's own steps, its log final once it is dead. Not steps up to killed_step: group 0
        # may not have logged the steps both just committed (a CI run, 2026-12-07: its log read step 4
        # where group 1, started at step 3, had logged four).
        events["steps_before_kill"] = [s for s, _, _, _ in g1.steps()]
        alone = lambda: [s for s, _, live, _ in g0.steps() if s > events["killed_step"] and live == 1]  # noqa: E731
        events["first_alone_after_s"] = wait_until(lambda: len(alone()) >= 1, 120, "group 0 alone", groups)
        wait_until(lambda: len(alone()) >= ALONE_STEPS, 120, "group 0's steps alone", groups)
        # The lighthouse killed and restarted while group 0 steps alone, then group 1 heals
        # through the new one. Restarted under two live groups, the groups could land in
        # different quorums, and a step whose peer had moved on waited out torchft's 60 s
        # timeout (the fixture took 35 s in some CI runs, 183 s in others).
        lighthouse.stop()
        events["lighthouse_down_step"] = g0.last_step()
        time.sleep(1.0)
        lighthouse.start()
        down = events["lighthouse_down_step"]
        wait_until(lambda: g0.last_step() > down + 1, 120, "group 0 past the lighthouse restart", groups)
        lines_before = len(g1.steps())
        g1.start(lighthouse)
        events["heal_s"] = wait_until(lambda: len(g1.steps()) > lines_before, 300, "group 1 back", groups)
        events["healed_step"] = g1.steps()[lines_before][0]
        wait_until(lambda: g1.last_step() >= events["healed_step"] + 2, 120, "group 1's steps", groups)
        events["returncodes"] = [g.wait(timeout=300) for g in groups]
    return groups, events, root


@ft_job
def test_groups_hold_identical_weights_after_every_committed_step(faults):
    """(a) Before any fault, each committed step leaves both groups with the same weights:
    the data is split across groups and the gradients averaged through torchft."""
    (g0, g1), events, _ = faults
    d0, d1 = digests_by_step(g0), digests_by_step(g1)
    # Steps both logged: a group that starts after the first quorum heals into it (its
    # first logged step is then the second).
    before = [s for s in events["steps_before_kill"] if s in d0]
    assert len(before) >= KILL_AFTER - 1
    assert all(d0[s] == d1[s] for s in before), (d0, d1)
    assert all(live == 2 for s, _, live, _ in g0.steps() if s in before[1:])
    assert len({d0[s] for s in before}) == len(before)  # the weights move every step


@ft_job
def test_the_live_group_keeps_committing_when_the_other_dies(faults):
    """(b) SIGKILL of group 1: group 0 commits its next steps alone within the quorum timeout;
    a step a dead group kept from committing is said in the log."""
    (g0, _), events, _ = faults
    assert events["first_alone_after_s"] < 60, events  # torchft's quorum timeout
    alone = [(s, c) for s, c, live, _ in g0.steps() if s > events["killed_step"] and live == 1]
    assert len(alone) >= ALONE_STEPS
    assert all(c >= 1 for _, c in alone)
    uncommitted = g0.text().count("was not committed")
    committed = [c for _, c, _, _ in g0.steps()]
    assert committed[-1] == STEPS - uncommitted, (committed[-1], uncommitted)


@ft_job
def test_a_restarted_group_heals_from_the_live_group(faults):
    """(c) The restarted group fetches group 0's weights, optimizer state and step (torchft's
    checkpoint transport) and holds group 0's weights from its first step on, at every step
    both groups committed."""
    (g0, g1), events, _ = faults
    healed = events["healed_step"]
    assert healed > events["killed_step"] + ALONE_STEPS - 1, events  # continues the numbering
    assert "healing required" in g1.text()
    d0, d1 = digests_by_step(g0), digests_by_step(g1)
    # A group that heals mid-step continues at its source's step: its own step is not logged.
    # A step one group could not commit (its quorum or a collective failed where the other
    # group's did not) leaves it a step behind until its next quorum heals it.
    skipped = uncommitted_steps(g0) | uncommitted_steps(g1)
    common = [s for s in d1 if s >= healed and s in d0 and s not in skipped]
    differ = {s: (d0[s], d1[s]) for s in common if d0[s] != d1[s]}
    assert len(common) >= 3 and not differ, (events, common, differ, tails([g0, g1], 1500))
    assert "healed from a live replica group" in g1.text()


@ft_job
def test_each_start_names_one_checkpointer_in_its_groups_folder(faults):
    """One "Checkpointing active" line per start of a group, naming its own replica_<id>
    folder (torchtitan's first manager, replaced by grt_titan's, says nothing)."""
    (g0, g1), _, _ = faults
    for group, starts in ((g0, 1), (g1, 2)):  # group 1 was restarted
        lines = [line for line in group.text().splitlines() if "Checkpointing active" in line]
        assert len(lines) == starts, lines
        assert all(f"replica_{group.replica_id}" in line for line in lines), lines


@ft_job
def test_the_groups_survive_a_lighthouse_restart(faults):
    """(d) The lighthouse killed and restarted: the live group retries its quorum and steps on,
    the restarted group joins it through the new lighthouse, and both finish as one."""
    (g0, g1), events, _ = faults
    assert events["returncodes"] == [0, 0], tails([g0, g1])
    down = events["lighthouse_down_step"]
    assert [s for s, _, _, _ in g0.steps() if s > down + 1], tails([g0, g1])
    assert events["healed_step"] > down + 1, events
    assert g0.last_step() == g1.last_step() == STEPS, tails([g0, g1])
    d0, d1 = digests_by_step(g0), digests_by_step(g1)
    assert d0[STEPS] == d1[STEPS]


@ft_job
def test_each_groups_last_checkpoint_exports_to_identical_weights(faults, tmp_path):
    """Every group checkpoints in its own folder; the last steps export to the same weights."""
    from grt_titan.cli import main as cli

    _, _, root = faults
    config = tmp_path / "grt_debug_seq64.toml"
    config.write_text(DEBUG_TOML.read_text().replace("seq_len = 128", "seq_len = 64"))
    weights = []
    for i in range(2):
        step = root / f"group{i}" / "dump" / "checkpoint" / f"replica_{i}" / f"step-{STEPS}"
        assert step.is_dir(), sorted(p.name for p in step.parent.glob("*"))
        out = tmp_path / f"export{i}"
        assert cli(["export-hf", "--checkpoint", str(step), "--config", str(config), "--out", str(out)]) == 0
        weights.append((out / "model.safetensors").read_bytes())
    assert weights[0] == weights[1]


@ft_job
def test_the_table_shows_live_groups_by_step(faults, capsys):
    """`grt-titan table` on both groups' runs: group 0 was alone after group 1's death;
    group 1's history breaks where it was down and resumes at its healed step; the steps
    not committed are the ones each group's log names."""
    from grt_titan.analysis import live_groups
    from grt_titan.cli import main as cli

    (g0, g1), events, root = faults
    assert cli(["table", str(root / "group0" / "dump"), str(root / "group1" / "dump")]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| dump |")]
    assert len(rows) == 2 and "Fault tolerance: replica groups live" in out, out
    # The log's live count per step (the last line of a step a restarted group repeats).
    live = [sorted({s: n for s, _, n, _ in g.steps()}.items()) for g in (g0, g1)]
    spans = [live_groups.live_spans(history, 1) for history in live]
    for g, row, span in zip((g0, g1), rows, spans):
        uncommitted = g.text().count("was not committed")
        assert row == f"| dump | {g.replica_id} | 2 | {span} | {uncommitted} |", (row, span)
    assert "1 at" in spans[0], spans  # group 0 alone
    # Group 1 steps with group 0 before its death (on a loaded machine the two may first step
    # apart: "1 at 1-2, 2 at 3-4, ...", the first quorum's join window missed), and again to the end.
    before_death = spans[1].split(", ")[:2]
    assert any(s.startswith("2 at ") for s in before_death), spans
    assert any(s.startswith("2 at ") and s.endswith(f"-{STEPS}") for s in spans[1].split(", ")[1:]), spans


@ft_job
def test_a_loss_spike_in_one_group_rewinds_it_while_the_other_steps_on(tmp_path):
    """[loss_spike] under fault tolerance: group 1's planted spike at step 5 stops it before
    its gradients are averaged (to group 0, a group that failed in the step: its step 5 is
    not committed, so no group steps on the spike). Restarted (as torchrun --max-restarts
    restarts it), group 1 reads the spike from its own checkpoint folder, skips the batches,
    heals from group 0, and both finish with the same weights."""
    lighthouse = Lighthouse(free_port(), tmp_path / "lighthouse.log", join_timeout_ms=10_000).start()
    steps = 12
    args = [*FT_RUN, "--training.steps", str(steps), "--checkpoint.enable", "--checkpoint.interval", "2"]
    args += ["--loss_spike.enable", "--loss_spike.window", "2", "--loss_spike.max_rewinds", "1"]
    groups = [Group(0, 2, tmp_path / "group0", args, PACE), Group(1, 2, tmp_path / "group1", args, PACE)]
    g0, g1 = groups
    with no_process_left(lighthouse, groups):
        g0.start(lighthouse)
        g1.env = {**PACE, "FT_SPIKE_STEP": "5"}
        g1.start(lighthouse)
        spiked = g1.wait(timeout=300)
        g1.env = PACE
        g1.start(lighthouse)
        returncodes = [g.wait(timeout=300) for g in groups]
    assert spiked != 0 and "step 5: training loss" in g1.text() and "is a spike" in g1.text(), tails(groups)
    log = json.loads((tmp_path / "group1" / "dump" / "checkpoint" / "replica_1" / "loss_spikes.json").read_text())
    assert [r["step"] for r in log["rewinds"]] == [5], log
    assert "Loss-spike rewinds recorded in" in g1.text()
    assert returncodes == [0, 0], tails(groups)
    committed = {s: c for s, c, _, _ in g0.steps()}
    assert committed[5] == committed[4], committed  # the spike's step committed nowhere
    d0, d1 = digests_by_step(g0), digests_by_step(g1)
    assert d0[steps] == d1[steps], (d0, d1)


@ft_job
@pytest.mark.parametrize("method", ["diloco", "local_sgd"])
def test_one_rank_groups_agree_at_every_sync(method, tmp_path):
    """Groups of one rank under DiLoCo and local SGD step on their own data between syncs
    (different weights) and agree after every sync (torchft's outer step, or its weight
    average). (Synchronous one-rank groups, grt_titan's gradient average: the scripted run.)"""
    # No fault here: every quorum has both groups, however far apart their start-ups are
    # (on a loaded CI machine, more than any join timeout).
    lighthouse = Lighthouse(free_port(), tmp_path / "lighthouse.log", min_replicas=2).start()
    args = [*FT_RUN, "--training.steps", "6"]
    args += ["--fault_tolerance.semi_sync_method", method, "--fault_tolerance.sync_steps", "3"]
    groups = [Group(i, 2, tmp_path / f"group{i}", args) for i in range(2)]
    assert run_to_the_end(lighthouse, groups) == [0, 0], tails(groups)
    d0, d1 = (digests_by_step(g) for g in groups)
    agreed = [s for s in d0 if d0[s] == d1[s]]
    assert agreed == [3, 6], (d0, d1)


@ft_job
def test_fsdp_inside_each_group(tmp_path):
    """The layout users run: FSDP over each group's ranks (here 2 x 2 gloo ranks), gradients
    averaged across groups by FSDP's all-reduce hook through torchft. Both groups' rank-0
    shards stay identical, and the logged loss is the mean over groups (torchtitan's FT
    trainer logs their sum), about ln(vocabulary) = 8.3 at the start, not twice that."""
    lighthouse = Lighthouse(free_port(), tmp_path / "lighthouse.log", min_replicas=2).start()
    args = [*FT_RUN, "--training.steps", "3"]
    groups = [Group(i, 2, tmp_path / f"group{i}", args, nproc=2) for i in range(2)]
    assert run_to_the_end(lighthouse, groups) == [0, 0], tails(groups)
    d0, d1 = (digests_by_step(g) for g in groups)
    assert sorted(d0) == [1, 2, 3] and d0 == d1, (d0, d1)
    assert "Applied FSDP to the GRT" in groups[0].text()
    losses = groups[0].losses()
    assert sorted(losses) == [1, 2, 3] and all(7.0 < loss < 9.0 for loss in losses.values()), (
        losses
    )  # ln(4097) = 8.3 at init


@needs_torchft
def test_no_lighthouse_stops_in_one_line_naming_it():
    """Fault tolerance on, nothing at the lighthouse's address: the trainer stops after the
    configured wait with one line naming the address, before it builds anything (its first
    call; grt_titan.train's main picks this trainer: test_a_trainer_class_...)."""
    from grt_titan.components.fault_tolerance import FaultToleranceError, GRTFaultTolerantTrainer

    address = f"http://127.0.0.1:{free_port()}"
    config = parse_config(
        "--fault_tolerance.enable",
        "--fault_tolerance.group_size",
        "2",
        "--fault_tolerance.lighthouse",
        address,
        "--fault_tolerance.lighthouse_timeout_seconds",
        "1",
    )
    start = time.monotonic()
    with pytest.raises(FaultToleranceError) as info:
        GRTFaultTolerantTrainer(config)
    assert 1.0 <= time.monotonic() - start < 10
    message = str(info.value)
    assert "\n" not in message and f"no torchft lighthouse answered at {address} within 1 s" in message
    assert "torchft_lighthouse --min_replicas 1" in message


@needs_torchft
def test_the_lighthouse_is_the_scripts_without_importing_torch(tmp_path):
    """The tests start `torchft_lighthouse`'s own entry point (tests/reliability/lighthouse.py)
    in a process that never imports torch; it serves and reads flags as the script does."""
    from importlib.metadata import entry_points

    from grt_titan.components.fault_tolerance import FaultToleranceError, wait_for_lighthouse

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "torchft_lighthouse"]
    assert script.value == "torchft._torchft:lighthouse_main"
    assert subprocess.run(lighthouse_command("--check-no-torch"), timeout=60).returncode == 0
    port = free_port()
    flags = ["--min_replicas", "1", "--bind", f"[::]:{port}", "--join_timeout_ms", "100"]
    with open(tmp_path / "lighthouse.log", "w") as log:
        proc = subprocess.Popen(lighthouse_command(*flags), stdout=log, stderr=subprocess.STDOUT)
    try:
        with contextlib.suppress(FaultToleranceError):  # the process's end says why, below
            wait_for_lighthouse(f"http://127.0.0.1:{port}", 30)
        assert proc.poll() is None, (tmp_path / "lighthouse.log").read_text()
        # It logs this line once it has bound the port, so the connection can come first.
        deadline = time.monotonic() + 10
        while "Lighthouse listening on: http://" not in (tmp_path / "lighthouse.log").read_text():
            assert time.monotonic() < deadline, (tmp_path / "lighthouse.log").read_text()
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    bad = subprocess.run(lighthouse_command("--no_such_flag"), capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "--no_such_flag" in bad.stderr, bad.stderr


def test_without_torchft_the_run_names_the_extra(monkeypatch):
    from grt_titan.components import fault_tolerance

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchft" else real(name, *a))
    config = parse_config("--fault_tolerance.enable", "--fault_tolerance.group_size", "2")
    with pytest.raises(fault_tolerance.FaultToleranceError, match=r'pip install -e "\.\[ft\]"'):
        fault_tolerance.check_can_run(config)


def test_bad_fault_tolerance_keys_are_named():
    from grt_titan.components.fault_tolerance import config_problems

    config = parse_config(
        "--fault_tolerance.enable",
        "--fault_tolerance.group_size",
        "2",
        "--fault_tolerance.replica_id",
        "2",
        "--fault_tolerance.semi_sync_method",
        "sgd",
        "--parallelism.data_parallel_replicate_degree",
        "2",
        "--fault_tolerance.num_fragments",
        "2",
    )
    problems = config_problems(config)
    assert any(p.startswith("[fault_tolerance] replica_id = 2: allowed 0..1") for p in problems), problems
    assert any(p.startswith("[fault_tolerance] semi_sync_method = 'sgd'") for p in problems), problems
    assert any(p.startswith("[parallelism] data_parallel_replicate_degree = 2") for p in problems), problems
    assert any(p.startswith("[fault_tolerance] num_fragments = 2") for p in problems), problems


def test_torchtitans_own_trainer_refuses_fault_tolerance(monkeypatch):
    """-m torchtitan.train ignores [fault_tolerance]: refused by name; grt_titan.train runs it."""
    import torch

    from grt_titan.components.plain_trainer import plain_trainer_fault_tolerance_problems
    from grt_titan.components.trainer import starting_grt_trainer

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    config = parse_config("--fault_tolerance.enable", "--fault_tolerance.group_size", "2")
    (problem,) = plain_trainer_fault_tolerance_problems(config)
    assert problem.startswith("[fault_tolerance] enable = true is ignored by torchtitan's own -m torchtitan.train")
    with starting_grt_trainer():  # as GRTTrainer.__init__ runs torchtitan's
        assert plain_trainer_fault_tolerance_problems(config) == []


def test_a_trainer_class_that_does_not_join_the_quorum_is_refused():
    from grt_titan.components.trainer import GRTTrainer
    from grt_titan.train import trainer_for

    config = parse_config("--fault_tolerance.enable", "--fault_tolerance.group_size", "2")
    with pytest.raises(ValueError, match="does not join torchft's quorum"):
        trainer_for(config, GRTTrainer)
    assert trainer_for(config).__name__ == "GRTFaultTolerantTrainer"
    assert trainer_for(parse_config()) is GRTTrainer
