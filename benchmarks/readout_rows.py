"""Per-step supervision's training step with the readout at the scored positions against the
readout at every position, on the quickstart's model (docs/results/readout_rows.md).

    python benchmarks/readout_rows.py
    python benchmarks/readout_rows.py --depths --profile 8   # where the scored-rows step's time goes

The model is `train_configs/grt_task_loops.toml`'s (flavor task_debug_words, llama blocks, R = 8)
and the batch its shape (32 records of 80 tokens, one rank's), laid out as its records are: a
table of 10 one-token lines, then 16 queries of 3 tokens, each followed by its one-token
answer, the answers the only scored positions (16 of 80). Each step is forward + backward +
AdamW at fixed depth r. "rows" hands the model the per-step targets, so it reads out the
scored rows alone; "every" hands it none, so every step is read out at every position and
trained toward the labels (the same cross-entropies over the same rows, the cost of the readout
before it was restricted). The two are interleaved and the median of each reported, so the
ratio is robust to a shared machine's load. One thread, as each of the preset's 2 ranks has.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import tomllib
import torch

from grt_titan.components.loss import grt_loss
from grt_titan.model import GRTModel, grt_flavors
from grt_titan.model.part import IGNORE_INDEX

PRESET = Path(__file__).resolve().parents[1] / "train_configs" / "grt_task_loops.toml"
TABLE_LINES, QUERIES, QUERY_TOKENS = 10, 16, 3


def quickstart_model() -> GRTModel:
    toml = tomllib.loads(PRESET.read_text())
    grt = toml["grt"]
    args = grt_flavors[toml["model"]["flavor"]].replace(
        block_style=grt["block_style"], step_supervision=True, state_noise_std=0.0, gate_noise_std=0.0
    )
    with torch.device("meta"):
        model = GRTModel(args)
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        model.init_weights()
    return model.train()


def batch(batch_size: int, seq_len: int, vocab: int, steps: int):
    """Tokens, labels scored at each query's answer, and per-step targets there."""
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (batch_size, seq_len), generator=g)
    answers = TABLE_LINES + QUERY_TOKENS + (QUERY_TOKENS + 1) * torch.arange(QUERIES)
    labels = torch.full((batch_size, seq_len), IGNORE_INDEX)
    labels[:, answers] = torch.randint(0, vocab, (batch_size, QUERIES), generator=g)
    step_labels = torch.randint(0, vocab, (batch_size, seq_len, steps), generator=g)
    return tokens, labels, step_labels.masked_fill((labels == IGNORE_INDEX)[..., None], IGNORE_INDEX)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depths", type=int, nargs="*", default=[4, 8])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=80)
    parser.add_argument("--steps", type=int, default=6, help="timed steps of each, after 2 of warm-up")
    parser.add_argument("--profile", type=int, metavar="R", help="then profile 3 scored-rows steps at depth R")
    opts = parser.parse_args()
    torch.set_num_threads(1)
    model = quickstart_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    R = model.model_args.num_recurrences
    tokens, labels, step_labels = batch(opts.batch, opts.seq_len, model.model_args.vocab_size, R)
    scored = int((labels != IGNORE_INDEX).sum())
    print(f"batch {opts.batch} x {opts.seq_len}, {scored} scored positions, 1 thread, median of {opts.steps} steps")
    print("| r | every position, s/step | scored rows, s/step | rows / every |")
    print("|---|---|---|---|")
    for depth in opts.depths:

        def step(targets):
            train_step(model, optimizer, tokens, labels, targets, depth)

        sides = {"every": None, "rows": step_labels}
        for targets in sides.values():
            step(targets)
            step(targets)
        times = {name: [] for name in sides}
        for _ in range(opts.steps):
            for name, targets in sides.items():
                start = time.perf_counter()
                step(targets)
                times[name].append(time.perf_counter() - start)
        every, rows = statistics.median(times["every"]), statistics.median(times["rows"])
        print(f"| {depth} | {every:.3f} | {rows:.3f} | {rows / every:.3f} |", flush=True)
    if opts.profile:
        profile(model, optimizer, tokens, labels, step_labels, opts.profile)


def train_step(model, optimizer, tokens, labels, step_labels, depth: int) -> None:
    """Forward at depth r, backward and AdamW; `step_labels` None: the readout at every position."""
    optimizer.zero_grad(set_to_none=True)
    grt_loss(model(tokens, num_recurrences=depth, step_labels=step_labels), labels).backward()
    optimizer.step()


def profile(model, optimizer, tokens, labels, step_labels, depth: int) -> None:
    """The scored-rows step's self CPU time by operator and input shapes, over 3 steps after 2."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    for _ in range(2):
        train_step(model, optimizer, tokens, labels, step_labels, depth)
    with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(3):
            train_step(model, optimizer, tokens, labels, step_labels, depth)
    events = prof.key_averages(group_by_input_shape=True)
    total = sum(e.self_cpu_time_total for e in events)
    print(f"\nr = {depth}: {total / 3e6:.3f} s of self CPU time a step; the operators over 1% of it")
    print("| operator | input shapes | calls a step | share |")
    print("|---|---|---|---|")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total):
        if e.self_cpu_time_total < 0.01 * total:
            break
        shapes = ", ".join(str(s) for s in e.input_shapes if s)
        print(f"| {e.key} | {shapes} | {e.count // 3} | {e.self_cpu_time_total / total:.1%} |")


if __name__ == "__main__":
    main()
