"""The KD term's cost next to the cross-entropy's: forward + backward on one batch of logits.

    python benchmarks/kd_loss_bench.py [--batch 8] [--seq-len 64] [--vocab 50304]
        [--threads 1] [--repeats 5] [--temperature 2]

`kd_loss_sum` (grt_titan/components/distill_loss.py, full rows) and torch's
`cross_entropy(reduction="sum", ignore_index=-100)` (what torchtitan's loss calls) on the same
float32 student logits [batch, seq_len, vocab] (a tenth of the labels ignored), alternated
`--repeats` times after one warm-up each; prints the median seconds of each, their ratio, and
the bytes each keeps for its backward (autograd's saved tensors, counted once per storage).
Results: docs/results/distillation_kd_loss.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

from grt_titan.components.distill_loss import IGNORE_INDEX, kd_loss_sum


def make_inputs(batch: int, seq_len: int, vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    student = 3 * torch.randn(batch, seq_len, vocab, generator=g)
    teacher = 3 * torch.randn(batch, seq_len, vocab, generator=g)
    labels = torch.randint(0, vocab, (batch, seq_len), generator=g)
    labels[torch.rand(batch, seq_len, generator=g) < 0.1] = IGNORE_INDEX
    return student, teacher, labels


def cross_entropy_sum(student: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor, t: float):
    return F.cross_entropy(student.flatten(0, 1), labels.flatten(0, 1), reduction="sum", ignore_index=IGNORE_INDEX)


def kd_sum(student: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor, t: float):
    return kd_loss_sum(student, teacher, labels, t)


def step(loss_fn: Callable, student, teacher, labels, t: float) -> float:
    """Seconds of one forward + backward of `loss_fn` on fresh leaf logits."""
    x = student.detach().requires_grad_(True)
    start = time.perf_counter()
    loss_fn(x, teacher, labels, t).backward()
    return time.perf_counter() - start


def saved_bytes(loss_fn: Callable, student, teacher, labels, t: float) -> int:
    """Bytes of the tensors autograd keeps for the backward of `loss_fn`, each storage once."""
    seen: dict[int, int] = {}

    def pack(x: torch.Tensor):
        storage = x.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return x

    x = student.detach().requires_grad_(True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        loss = loss_fn(x, teacher, labels, t)
    del loss
    return sum(seen.values())


def measure(fns: dict[str, Callable], student, teacher, labels, t: float, repeats: int) -> dict[str, float]:
    """Median seconds of each of `fns`, alternated so that a shared machine's drift hits all."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for name, fn in fns.items():  # warm-up
        step(fn, student, teacher, labels, t)
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(step(fn, student, teacher, labels, t))
    return {name: statistics.median(ts) for name, ts in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--temperature", type=float, default=2.0)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    inputs = make_inputs(args.batch, args.seq_len, args.vocab)
    fns = {"cross_entropy": cross_entropy_sum, "kd_loss_sum": kd_sum}
    medians = measure(fns, *inputs, args.temperature, args.repeats)
    shape = f"{args.batch}x{args.seq_len}x{args.vocab}"
    print(f"forward + backward, float32 logits {shape}, {args.threads} thread(s), median of {args.repeats}:")
    for name, seconds in medians.items():
        saved = saved_bytes(fns[name], *inputs, args.temperature) / 2**20
        print(f"  {name:14s} {seconds:.3f} s   saved for backward {saved:.0f} MiB")
    print(f"  kd / cross_entropy: {medians['kd_loss_sum'] / medians['cross_entropy']:.2f}")


if __name__ == "__main__":
    main()
