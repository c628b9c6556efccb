"""A job config's parse with torchtitan's ConfigManager next to grt_titan's GRTConfigManager.

    python benchmarks/config_parse_bench.py [--config train_configs/grt_debug.toml] [--repeats 20]

Both parse the same TOML (every rank of a job parses once at start-up), alternated `--repeats`
times after one warm-up each; prints the median CPU seconds of a parse with each, their ratio,
and how many times each asked inspect for a source file it could not find (tyro's per-field
lookups on torchtitan's merged config classes: grt_titan/job_config.py, GRTConfigManager).
Results: docs/results/cpu_speed.md ("Config parse at start-up").
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@contextmanager
def failed_lookups(counts: list[int]):
    """Counts inspect.findsource's failures while the block runs (restored after)."""
    find = inspect.findsource

    def counting(obj):
        try:
            return find(obj)
        except OSError:
            counts[0] += 1
            raise

    inspect.findsource = counting
    try:
        yield
    finally:
        inspect.findsource = find


def parse_seconds(manager, args: list[str]) -> tuple[float, int]:
    """CPU seconds of one parse and the failed source lookups it made."""
    counts = [0]
    with failed_lookups(counts):
        start = time.process_time()
        manager().parse_args(args)
        return time.process_time() - start, counts[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="train_configs/grt_debug.toml", help="relative to the repository")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()

    from torchtitan.config import ConfigManager

    import grt_titan.spec  # noqa: F401  registers the `grt` train spec, as a job does
    from grt_titan.job_config import GRTConfigManager

    managers = {"torchtitan ConfigManager": ConfigManager, "GRTConfigManager": GRTConfigManager}
    job_args = ["--job.config_file", str(REPO / args.config)]
    seconds: dict[str, list[float]] = {name: [] for name in managers}
    lookups: dict[str, int] = {}
    for manager in managers.values():
        parse_seconds(manager, job_args)  # warm-up: first imports and caches
    for _ in range(args.repeats):
        for name, manager in managers.items():
            spent, lookups[name] = parse_seconds(manager, job_args)
            seconds[name].append(spent)
    print(f"{args.config}, {args.repeats} parses each (median CPU seconds):")
    for name in managers:
        print(f"  {name:26s} {statistics.median(seconds[name]):.3f} s, {lookups[name]} failed source lookups")
    slow, fast = (statistics.median(seconds[name]) for name in managers)
    print(f"  ratio: {slow / fast:.2f}x")


if __name__ == "__main__":
    main()
