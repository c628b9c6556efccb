"""The suite's time budget by area, and what a run spent: `python tests/budget.py LOG`.

LOG is the output of a full run with every duration listed, as CI runs it plus
`--durations=0` (tests/README.md, "Budget"). Each area (a folder of tests/; "top" for the
modules directly in tests/) is charged the setup, call and teardown seconds of its tests on
the pytest worker that ran them. On CI's 2 workers the suite's wall time is about half the
total, so SUITE_BUDGET_S keeps the torch 2.13 lane near 10 minutes and the whole of `.ci/run`
(set-up, the torch 2.11 lane and the torchtitan 0.3 lane included) under 15.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

# Worker seconds per area: each area's spend in a fresh-clone CI run on a quiet 2-core machine
# (2026-12-06, after the debug presets' vocabulary shrank to gpt2_4k's 4,097 ids; two runs:
# infra 430/441, reliability 211/268, docs 109/106, hf 74/88, components 36/43, benchmarks
# 85/93, top 92/90, data 10/13, model 16/16, analysis 39/37; 1,100/1,196 in all, the suite
# 595/636 s), the larger rounded up with a little room; the total stays
# under SUITE_BUDGET_S, so a new slow test fits its area's room or pays for itself by dropping a
# run that proves less.
BUDGET_S = {
    "infra": 470,
    "reliability": 280,
    "docs": 125,
    "hf": 95,
    "components": 45,
    "benchmarks": 35,  # the GPU suite's CPU smoke (about 80) runs in benchmarks/gpu/bundle.sh
    "top": 100,
    "data": 15,
    "model": 20,
    "analysis": 45,
    "torchtitan_0_3": 5,  # the 0.3 adapter: only its host checks run on 0.2.2 (its lane: .ci/run)
}
SUITE_BUDGET_S = 1300

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
