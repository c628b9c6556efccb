"""Training-step time, eager vs compiled, GRT vs its dense isoFLOP twin (CPU or GPU).

    python benchmarks/step_time.py                   # debug scale and a larger CPU size
    python benchmarks/step_time.py --device cuda     # same, on a GPU

Each step is forward + backward + AdamW at fixed depth r = R (so the twins do the same
FLOPs); compile follows the spec's plan (blocks per block, the recurrence step once).
GRT and dense steps are interleaved and the median of each is reported, so the ratio is
robust to a shared machine's load.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torchtitan.config.job_config import Compile

from grt_titan.infra.parallelize import apply_recurrence_compile
from grt_titan.model import GRTModel, grt_flavors

SIZES = {
    "debug": grt_flavors["debug"],  # 1 + 2x4 + 1, d = 128, GPT-2 vocabulary
    "d384": grt_flavors["debug"].replace(dim=384, n_heads=6),
}


def build(args, device, compiled: bool):
    with torch.device("meta"):
        model = GRTModel(args)
    model.to_empty(device=device)
    torch.manual_seed(0)
    with torch.no_grad():
        model.init_weights()
    if compiled:
        apply_recurrence_compile(model, Compile(enable=True, backend="inductor"))
    return model.train()


def make_step(model, tokens, depth):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        optimizer.zero_grad(set_to_none=True)
        logits = model(tokens[:, :-1], num_recurrences=depth)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        if tokens.is_cuda:
            torch.cuda.synchronize()

    return step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sizes", nargs="*", default=list(SIZES))
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=6)
    opts = parser.parse_args()
    print(f"device {opts.device}, batch {opts.batch} x {opts.seq_len}, fixed r = R, median of {opts.steps} steps")
    print("| size | mode | GRT ms/step | dense ms/step | GRT / dense |")
    print("|---|---|---|---|---|")
    for size in opts.sizes:
        grt = SIZES[size]
        dense = grt.replace(n_prelude_layers=grt.unrolled_layers, n_core_layers=0, n_coda_layers=0)
        tokens = torch.randint(0, grt.vocab_size, (opts.batch, opts.seq_len + 1), device=opts.device)
        for mode in ("eager", "compiled"):
            steps = {
                "grt": make_step(build(grt, opts.device, mode == "compiled"), tokens, grt.num_recurrences),
                "dense": make_step(build(dense, opts.device, mode == "compiled"), tokens, None),
            }
            for step in steps.values():  # warm-up (and compilation)
                step()
                step()
            times = {name: [] for name in steps}
            for _ in range(opts.steps):
                for name, step in steps.items():
                    start = time.perf_counter()
                    step()
                    times[name].append(1000 * (time.perf_counter() - start))
            g, d = statistics.median(times["grt"]), statistics.median(times["dense"])
            print(f"| {size} | {mode} | {g:.0f} | {d:.0f} | {g / d:.3f} |", flush=True)


if __name__ == "__main__":
    main()
