"""FSDP bytes per training step on paper (docs/parallelism.md), GRT vs dense twin.

    python benchmarks/traffic_model.py [--pairs large:dense_large llama_1b:dense_llama_1b]

bf16 all-gathers, fp32 reduce-scatters, torchtitan's default resharding (prelude/coda
blocks gathered in forward and again in backward, the root once), the recurrence gathered
g = 1 time (core_reshard_after_forward = false) or 2. Parameter counts come from the
flavors built on the meta device.
"""

from __future__ import annotations

import argparse

import torch

from grt_titan.model import GRTModel, grt_flavors


def parts(flavor: str) -> dict[str, int]:
    with torch.device("meta"):
        model = GRTModel(grt_flavors[flavor])
    count = lambda m: sum(p.numel() for p in m.parameters()) if m is not None else 0  # noqa: E731
    total = count(model)
    blocks = count(model.prelude) + count(model.coda)
    recurrence = count(model.recurrence)
    return {"total": total, "blocks": blocks, "recurrence": recurrence, "root": total - blocks - recurrence}


def fsdp_bytes(p: dict[str, int], core_gathers: int = 1) -> int:
    return 2 * (2 * p["blocks"] + core_gathers * p["recurrence"] + p["root"]) + 4 * p["total"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--pairs",
        nargs="*",
        default=["large:dense_large", "medium:dense_medium", "small:dense_small", "llama_1b:dense_llama_1b"],
    )
    opts = parser.parse_args()
    print("| GRT | dense twin | GRT GB/step | dense GB/step | ratio per step | ratio per FLOP at r = R |")
    print("|---|---|---|---|---|---|")
    for pair in opts.pairs:
        grt, dense = pair.split(":")
        g, d = fsdp_bytes(parts(grt)), fsdp_bytes(parts(dense))
        a, b = grt_flavors[grt], grt_flavors[dense]
        flops_ratio = a.forward_flops_per_token(1024, a.num_recurrences) / b.forward_flops_per_token(1024)
        print(f"| {grt} | {dense} | {g / 1e9:.3f} | {d / 1e9:.3f} | {g / d:.3f} | {g / d / flops_ratio:.3f} |")


if __name__ == "__main__":
    main()
