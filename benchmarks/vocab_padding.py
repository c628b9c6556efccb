"""LM head forward + backward with the GPT-2 vocabulary (50257) vs padded to 50304.

    python benchmarks/vocab_padding.py [--dims 768,1024,1280] [--batch B] [--seq-len S]
        [--repeats 5] [--tp 1] [--device cpu|cuda] [--dtype float32|bfloat16] [--threads N]

What `[grt] vocab_multiple_of = 128` changes in a training step: the head matmul
`logits = h @ W^T` ([B*S, d] x [d, V]) and the cross entropy over V columns, forward and
backward (grads of h and W). Both vocabularies run in one process, interleaved (the order
alternates every repeat) after one warm-up each; prints the median time per configuration
and padded / unpadded. With `--tp N` the head is one tensor-parallel shard: ceil(V / N) rows
(50257 over 2 ranks: 25129, an odd size; 50304: 25152, a multiple of 64).

Defaults: cuda 8 x 1024 tokens in bfloat16; cpu 1 x 256 tokens in float32 (about a
minute on 2 shared cores). Results: docs/results/cpu_speed.md.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

VOCABS = (50257, 50304)


def time_head(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, sync) -> float:
    """Seconds for one forward + backward of cross_entropy(h @ weight^T, targets)."""
    h.grad = weight.grad = None
    sync()
    t0 = time.perf_counter()
    logits = h @ weight.t()
    loss = F.cross_entropy(logits.float(), targets)
    loss.backward()
    sync()
    return time.perf_counter() - t0


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dims", default="768,1024,1280")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--tp", type=int, default=1, help="time one vocabulary shard of this TP degree")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args(argv)
    cuda = a.device.startswith("cuda")
    batch = a.batch or (8 if cuda else 1)
    seq_len = a.seq_len or (1024 if cuda else 256)
    dtype = getattr(torch, a.dtype or ("bfloat16" if cuda else "float32"))
    if a.threads:
        torch.set_num_threads(a.threads)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    dims = [int(d) for d in a.dims.split(",")]
    tokens = batch * seq_len
    rows = {v: -(-v // a.tp) for v in VOCABS}

    gen = torch.Generator().manual_seed(0)
    cases = {}
    for d in dims:
        h = (torch.randn(tokens, d, generator=gen) * 0.02).to(a.device, dtype).requires_grad_()
        for v in VOCABS:
            w = (torch.randn(rows[v], d, generator=gen) * 0.02).to(a.device, dtype).requires_grad_()
            # Targets are real token ids (< 50257), inside the shard's rows.
            t = torch.randint(0, min(rows[v], VOCABS[0]), (tokens,), generator=gen).to(a.device)
            cases[(d, v)] = (h, w, t)
            time_head(h, w, t, sync)  # warm-up (allocator, kernels, autotuning)

    times: dict[tuple[int, int], list[float]] = {k: [] for k in cases}
    for rep in range(a.repeats):
        for d in dims:
            order = VOCABS if rep % 2 == 0 else VOCABS[::-1]
            for v in order:
                times[(d, v)].append(time_head(*cases[(d, v)], sync))

    device_name = torch.cuda.get_device_name() if cuda else f"cpu, {torch.get_num_threads()} threads"
    print(
        f"# LM head fwd+bwd + cross entropy: {batch} x {seq_len} = {tokens} tokens, {dtype}, "
        f"{device_name}, torch {torch.__version__}, tp {a.tp} (rows {rows[VOCABS[0]]} vs "
        f"{rows[VOCABS[1]]}), median of {a.repeats} interleaved repeats"
    )
    print(f"{'d':>6} {'V=' + str(VOCABS[0]) + ' ms':>14} {'V=' + str(VOCABS[1]) + ' ms':>14} {'padded/unpadded':>16}")
    for d in dims:
        base, padded = (statistics.median(times[(d, v)]) * 1e3 for v in VOCABS)
        # The padded head does 0.09% more FLOPs (47 columns): a ratio below 1 is a speed-up.
        print(f"{d:>6} {base:>14.2f} {padded:>14.2f} {padded / base:>16.3f}")


if __name__ == "__main__":
    main()
