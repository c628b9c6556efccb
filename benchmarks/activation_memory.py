"""Saved-for-backward bytes per token vs R under each checkpointing mode, GRT vs dense twin.

    python benchmarks/activation_memory.py [--dim 128] [--seq-len 64]

The GRT is the debug layout (1 + 2 x R + 1) at depth r = R; its isoFLOP dense twin has
p + n R + c layers. Counted with saved_tensors_hooks (grt_titan/infra/memory_stats.py),
fp32, distinct storages; a checkpointed region saves only its inputs.
"""

from __future__ import annotations

import argparse

import torch
from torchtitan.config.job_config import ActivationCheckpoint

from grt_titan.infra.memory_stats import saved_activation_bytes
from grt_titan.infra.parallelize import apply_recurrence_ac
from grt_titan.model import GRTModel, grt_flavors

MODES = {"none": None, "per_block": "block", "per_step": "step"}


def build(args):
    with torch.device("meta"):
        model = GRTModel(args)
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights()
    return model.train()


def measure(args, mode: str, depth: int | None, tokens) -> float:
    model = build(args)
    if MODES[mode] is not None:
        apply_recurrence_ac(model, ActivationCheckpoint(mode="full"), MODES[mode], compile_enabled=False)
    kwargs = {"num_recurrences": depth} if depth is not None else {}
    return saved_activation_bytes(model, tokens, **kwargs) / tokens.numel()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=512, help="small vocab: the head is not what is measured")
    opts = parser.parse_args()
    tokens = torch.randint(0, opts.vocab, (2, opts.seq_len))
    base = grt_flavors["debug"].replace(dim=opts.dim, vocab_size=opts.vocab)
    print(f"saved-for-backward KiB per token, d = {opts.dim}, S = {opts.seq_len}, fp32")
    print("| R | model | none | per_block | per_step |")
    print("|---|---|---|---|---|")
    for depth in (2, 4, 8):
        grt = base.replace(num_recurrences=depth)
        dense = base.replace(n_prelude_layers=grt.unrolled_layers, n_core_layers=0, n_coda_layers=0)
        for name, args, r in ((f"GRT 1+2x{depth}+1", grt, depth), (f"dense {grt.unrolled_layers} layers", dense, None)):
            # the dense twin has no steps: its per_step column equals per_block
            row = [measure(args, mode, r, tokens) / 1024 for mode in MODES]
            print(f"| {depth} | {name} | " + " | ".join(f"{v:.2f}" for v in row) + " |", flush=True)


if __name__ == "__main__":
    main()
