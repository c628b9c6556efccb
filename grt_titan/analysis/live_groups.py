"""`grt-titan table`'s fault-tolerance section: the replica groups live at each logged step of
runs trained with `[fault_tolerance]` (docs/fault_tolerance.md).

torchtitan writes each replica group's TensorBoard events under `<tb>/<timestamp>/replica_<id>/`;
grt_titan's fault-tolerant trainer logs `fault_tolerance/live_groups` (the groups in the step's
quorum) and `fault_tolerance/uncommitted_steps` (a count since the group's process started)
there at every log step.

    | run | replica group | groups | live groups by step | steps not committed |
    | ft_large | 1 | 2 | 2 at 1-40, 2 at 57-200 | 0 |

A span ends where the count changes or where steps went unlogged (longer than the log
frequency: the group was down, and a healed group continues at its peers' step).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from grt_titan.analysis.runs import Run, scalar_events

LIVE_TAG = "fault_tolerance/live_groups"
UNCOMMITTED_TAG = "fault_tolerance/uncommitted_steps"
REPLICA_FOLDER = re.compile(r"replica_(\d+)")


@dataclass
class GroupHistory:
    run: Run
    replica_id: int
    group_size: int | None  # the run's [fault_tolerance] group_size, None without its job config
    live: list[tuple[int, int]]  # (step, live groups) at each logged step, ascending
    uncommitted: int  # steps not committed, over every start of the group

    @property
    def spans(self) -> str:
        return live_spans(self.live, log_freq(self.run))


def config_section(run: Run, name: str) -> dict | None:
    """A section of the run's job config (`fault_tolerance`), None without it in the record."""
    return (run.record.get("job_config") or {}).get(name)


def log_freq(run: Run) -> int | None:
    return (config_section(run, "metrics") or {}).get("log_freq")


def replica_id(folder: Path, tb_root: Path) -> int | None:
    """The `replica_<id>` component of an event folder's path below the TensorBoard root."""
    for part in folder.relative_to(tb_root).parts:
        if match := REPLICA_FOLDER.fullmatch(part):
            return int(match.group(1))
    return None


def latest_by_step(events_by_folder: dict[Path, list], tb_root: Path) -> dict[int, list[tuple[int, float]]]:
    """Per replica group: (step, value) ascending, the latest written value of a step logged
    twice (a group restarted from a checkpoint steps again)."""
    merged: dict[int, dict[int, tuple[float, float]]] = {}
    for folder, events in events_by_folder.items():
        replica = replica_id(folder, tb_root)
        if replica is None:
            continue
        steps = merged.setdefault(replica, {})
        for step, wall_time, value in events:
            if step not in steps or wall_time >= steps[step][0]:
                steps[step] = (wall_time, value)
    return {replica: [(s, v) for s, (_, v) in sorted(steps.items())] for replica, steps in merged.items()}


def total_uncommitted(counts: list[tuple[int, float]]) -> int:
    """Steps not committed over every start: the counter restarts at 0 with a group's process."""
    total, previous = 0, 0
    for _, value in counts:
        total += int(value) - previous if value >= previous else int(value)
        previous = int(value)
    return total


def live_spans(live: list[tuple[int, int]], freq: int | None) -> str:
    """`2 at 1-4, 1 at 5-8, 2 at 12-36`: one span per run of equal counts at logged steps."""
    spans: list[list[int]] = []  # [count, first step, last step]
    for step, count in live:
        contiguous = spans and (freq is None or step - spans[-1][2] <= freq)
        if contiguous and spans[-1][0] == count:
            spans[-1][2] = step
        else:
            spans.append([count, step, step])
    return ", ".join(f"{count} at {first}" + (f"-{last}" if last != first else "") for count, first, last in spans)


def group_histories(run: Run) -> list[GroupHistory]:
    """One history per replica group whose events are in the run's TensorBoard folder."""
    tb = run.path / run.record.get("tb_folder", "tb")
    fault_tolerance = config_section(run, "fault_tolerance")
    if not tb.is_dir() or (fault_tolerance is not None and not fault_tolerance.get("enable")):
        return []
    events = scalar_events(tb, LIVE_TAG, UNCOMMITTED_TAG)
    live, uncommitted = (latest_by_step(events[tag], tb) for tag in (LIVE_TAG, UNCOMMITTED_TAG))
    group_size = (fault_tolerance or {}).get("group_size")
    return [
        GroupHistory(
            run,
            replica,
            group_size,
            [(step, int(count)) for step, count in live[replica]],
            total_uncommitted(uncommitted.get(replica, [])),
        )
        for replica in sorted(live)
    ]


def markdown(histories: list[GroupHistory]) -> str:
    head = ["run", "replica group", "groups", "live groups by step", "steps not committed"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for h in histories:
        cells = [h.run.name, str(h.replica_id), str(h.group_size or "?"), h.spans, str(h.uncommitted)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
