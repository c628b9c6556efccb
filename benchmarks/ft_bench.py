"""Fault tolerance through torchft on CPU (docs/fault_tolerance.md; docs/results/reliability_torchft.md): what
each fault costs, and DiLoCo's bytes and loss against fully synchronous training.

    python benchmarks/ft_bench.py --out /tmp/ftb                  # both parts
    python benchmarks/ft_bench.py --out /tmp/ftb --parts diloco --steps 60 --sync-steps 5

`faults`: a lighthouse and two replica groups of one CPU rank (the debug GRT, batch 2 x 64,
steps paced 0.3 s apart); group 1 is killed (SIGKILL) after its step 4 and restarted once
group 0 has committed 3 steps alone; then the lighthouse is killed and restarted. Printed:
seconds from the kill to group 0's first step alone, steps not committed, seconds from the
restart to group 1's first (healed) step, bytes group 1 received, and what the lighthouse
restart cost. `diloco`: for the debug GRT and dense_debug (10 block applications each, the
same FLOPs per token), two groups fully synchronous and two under DiLoCo at the same tokens;
printed: bytes all-reduced per sync (measured in torchft's Manager.allreduce), the mean
training loss of the last 10 steps (both groups), and the paper-scale bytes per sync from the parameter
counts (an fp32 pseudo-gradient per parameter, as measured at debug size).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "tests" / "reliability")]
# A group (re)starts in an interpreter of its own, as a user's does: what a restart costs
# includes it. (The tests fork their groups from tests/launcher.py's server instead.)
os.environ.setdefault("GRT_TEST_LAUNCH_SERVER", "0")

from ft_helpers import FT_RUN, Group, Lighthouse, no_process_left, run_to_the_end, wait_until  # noqa: E402

from tests.launcher import free_port  # noqa: E402


def faults(out: Path, steps: int) -> None:
    lighthouse = Lighthouse(free_port(), out / "lighthouse.log").start()
    args = [*FT_RUN, "--training.steps", str(steps)]
    groups = [Group(i, 2, out / f"group{i}", args, {"FT_STEP_SLEEP": "0.3"}) for i in range(2)]
    g0, g1 = groups
    with no_process_left(lighthouse, groups):
        for g in groups:
            g.start(lighthouse)
        wait_until(lambda: g1.last_step() >= 4, 300, "group 1's step 4", groups)
        g1.kill()
        killed_step = g0.last_step()
        alone = lambda: [s for s, _, live, _ in g0.steps() if s > killed_step and live == 1]  # noqa: E731
        to_alone = wait_until(lambda: alone(), 120, "group 0 alone", groups)
        wait_until(lambda: len(alone()) >= 3, 120, "3 steps alone", groups)
        before = len(g1.steps())
        g1.start(lighthouse)
        to_heal = wait_until(lambda: len(g1.steps()) > before, 300, "group 1 back", groups)
        wait_until(lambda: g1.last_step() >= g1.steps()[before][0] + 2, 120, "group 1's steps", groups)
        lighthouse.stop()
        down_step, down_at = g0.last_step(), time.monotonic()
        time.sleep(1.0)
        lighthouse.start()
        wait_until(lambda: g0.last_step() > down_step + 1, 300, "steps after the lighthouse restart", groups)
        back_after = time.monotonic() - down_at
        codes = [g.wait(timeout=300) for g in groups]
    uncommitted = [g.text().count("was not committed") for g in groups]
    print("| fault | measured |\n|---|---|")
    print(f"| none | identical weights after steps 1..{killed_step} (both groups) |")
    print(f"| group 1 SIGKILLed after step {killed_step} | group 0's first step alone {to_alone:.1f} s later |")
    print(
        f"| group 1 restarted | first step {to_heal:.1f} s after the restart, healed at step "
        f"{g1.steps()[before][0]}, received {max(g1.healed_bytes(), default=0) / 2**20:.1f} MiB |"
    )
    print(f"| lighthouse killed, restarted 1 s later | 2 steps later on group 0 {back_after:.1f} s after the kill |")
    print(f"steps not committed (group 0, group 1): {uncommitted}; exit codes {codes}")
    print(f"logs in {out}")


def run_pair(out: Path, config: str, steps: int, extra: list[str]) -> list[Group]:
    lighthouse = Lighthouse(free_port(), out / "lighthouse.log").start()
    args = [config if a == "train_configs/grt_debug.toml" else a for a in FT_RUN]
    args += ["--training.steps", str(steps), *extra]
    groups = [Group(i, 2, out / f"group{i}", args) for i in range(2)]
    codes = run_to_the_end(lighthouse, groups, timeout=1800)
    assert codes == [0, 0], f"exit codes {codes}; logs in {out}"
    return groups


LOSS_STEPS = 10  # the diloco part compares the mean loss of the last this many steps


def diloco(out: Path, steps: int, sync_steps: int) -> None:
    from grt_titan.model.flavors import grt_flavors
    from grt_titan.model.model import build_meta_model

    models = {  # name: (TOML, flavor)
        "GRT debug (1 + 2x4 + 1)": ("train_configs/grt_debug.toml", "debug"),
        "dense_debug (10 layers)": ("train_configs/dense_debug.toml", "dense_debug"),
    }
    semi = ["--fault_tolerance.semi_sync_method", "diloco", "--fault_tolerance.sync_steps", str(sync_steps)]
    print(
        f"| model | parameters | bytes per sync | loss, synchronous | loss, DiLoCo H={sync_steps} |\n|---|---|---|---|---|"
    )
    for i, (name, (config, flavor)) in enumerate(models.items()):
        sync = run_pair(out / f"sync{i}", config, steps, [])
        semi_groups = run_pair(out / f"diloco{i}", config, steps, semi)
        per_sync = [b for s, b in semi_groups[0].sent_bytes().items() if s % sync_steps == 0]
        last = range(steps - LOSS_STEPS + 1, steps + 1)

        def mean_loss(groups):
            return statistics.mean(losses[s] for losses in map(Group.losses, groups) for s in last)

        params = sum(p.numel() for p in build_meta_model(grt_flavors[flavor]).parameters())
        print(
            f"| {name} | {params:,} | {statistics.mean(per_sync):,.0f} | {mean_loss(sync):.4f} | "
            f"{mean_loss(semi_groups):.4f} |"
        )
    for name in ("large", "dense_large"):
        params = sum(p.numel() for p in build_meta_model(grt_flavors[name]).parameters())
        print(f"{name}: {params:,} parameters, {4 * params / 2**20:,.0f} MiB per DiLoCo sync (fp32)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for the runs (replaced)")
    p.add_argument("--parts", default="faults,diloco")
    p.add_argument("--steps", type=int, default=40, help="steps per run")
    p.add_argument("--sync-steps", type=int, default=5, help="DiLoCo's H")
    args = p.parse_args()
    if "diloco" in args.parts and args.steps < LOSS_STEPS:
        p.error(
            f"--steps {args.steps}: the diloco part averages the last {LOSS_STEPS} steps' losses; allowed >= {LOSS_STEPS}"
        )
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    if "faults" in args.parts:
        faults(out / "faults", args.steps)
    if "diloco" in args.parts:
        diloco(out / "diloco", args.steps, args.sync_steps)


if __name__ == "__main__":
    main()
