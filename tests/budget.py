"""The suite's time budget by area, and what a run spent: `python tests/budget.py LOG`.

LOG is the output of a full run with every duration listed, as CI runs it plus
`--durations=0` (tests/README.md, "Budget"). Each area (a folder of tests/; "top" for the
modules directly in tests/) is charged the setup, call and teardown seconds of its tests on
the pytest worker that ran them. On CI's 2 workers the suite's wall time is about half the
total, so SUITE_BUDGET_S keeps the torch 2.13 lane near 11 minutes and the whole of `.ci/run`
(set-up and the torch 2.11 lane included) under 15.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

# Worker seconds per area: each area's spend in a fresh-clone CI run on a quiet 2-core machine
# with this round's tests in (multi-step tasks, SCSE as a method with TP, training a named
# subset), rounded up, plus a little room (benchmarks: 2026-12-05's depth_pays rows in two spawned
# workers, its loops and cached-decoding tests); the total stays under SUITE_BUDGET_S, so a new slow
# test fits its area's room or pays for itself by dropping a run that proves less.
BUDGET_S = {
    "infra": 490,
    "reliability": 320,  # 2026-12-06: 311 and 257 with its restarted ranks forked by the launcher
    "docs": 158,
    "hf": 110,
    "components": 62,
    "benchmarks": 76,
    "top": 92,
    "data": 20,
    "model": 25,
    "analysis": 30,
    "torchtitan_0_3": 5,  # the 0.3 adapter: only its host checks run on 0.2.2 (its lane: .ci/run)
}
SUITE_BUDGET_S = 1420

DURATION = re.compile(r"^\s*([\d.]+)s (?:setup|call|teardown)\s+tests/(\S+?)::")


def area_of(module: str) -> str:
    """A test module's area: its folder under tests/, or "top"."""
    folder, _, rest = module.partition("/")
    return folder if rest else "top"


def spent(log: str) -> Counter:
    """Worker seconds per area in a pytest `--durations=0` report."""
    seconds: Counter = Counter()
    for line in log.splitlines():
        if match := DURATION.match(line):
            seconds[area_of(match.group(2))] += float(match.group(1))
    return seconds


def report(seconds: Counter) -> list[str]:
    lines = [f"{'area':12} {'spent s':>8} {'budget s':>9}"]
    for area, budget in BUDGET_S.items():
        flag = "  over" if seconds[area] > budget else ""
        lines.append(f"{area:12} {seconds[area]:8.0f} {budget:9d}{flag}")
    unknown = sorted(set(seconds) - set(BUDGET_S))
    lines += [f"{area:12} {seconds[area]:8.0f} {'none':>9}  (no budget: add it to BUDGET_S)" for area in unknown]
    total = sum(seconds.values())
    lines.append(f"{'suite':12} {total:8.0f} {SUITE_BUDGET_S:9d}{'  over' if total > SUITE_BUDGET_S else ''}")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    seconds = spent(Path(argv[0]).read_text(errors="replace"))
    if not seconds:
        print(f"{argv[0]}: no durations found (run pytest with --durations=0)", file=sys.stderr)
        return 1
    print("\n".join(report(seconds)))
    over = [area for area in BUDGET_S if seconds[area] > BUDGET_S[area]]
    return 1 if over or set(seconds) - set(BUDGET_S) or sum(seconds.values()) > SUITE_BUDGET_S else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
