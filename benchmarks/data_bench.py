"""Data-path benchmark (docs/data.md "Benchmarks", docs/results/data_bench.md; not a timed test).

1. `prepare` throughput (tokens/s, reading + tokenizing + writing shards) vs tiktoken's own
   batch encoding (`encode_ordinary_batch`, texts already in memory) of the same text on
   the same cores, in one run. Target: ratio >= 0.8.
2. Loader time per batch at the paper's batch shape (8 x 1024, num_workers = 0, so all of
   it is on the training process) vs a forward + backward of the `debug` GRT flavor at that
   shape (at depth r = 1, the cheapest training step). Target: < 1 % of step time.

    PYTHONPATH=. python benchmarks/data_bench.py [--repeat 8] [--batches 200]
"""

import argparse
import gzip
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from grt_titan.data import default_corpus
from grt_titan.data.prepare import prepare
from grt_titan.tokenizer import GPT2Tokenizer


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def bench_prepare(tmp: Path, repeat: int, cores: int, tokenizer: GPT2Tokenizer) -> dict:
    with gzip.open(default_corpus.CORPUS_PATH, "rt", encoding="utf-8") as f:
        docs = [json.loads(line)["text"] for line in f] * repeat
    src = tmp / "corpus.jsonl"
    with open(src, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in docs)
    enc = tokenizer.encoding
    enc.encode_ordinary_batch(docs[:50], num_threads=cores)  # warm-up

    def tiktoken_run():
        t0 = time.perf_counter()
        n = sum(map(len, enc.encode_ordinary_batch(docs, num_threads=cores)))
        return n / (time.perf_counter() - t0)

    def prepare_run(k):
        t0 = time.perf_counter()
        m = prepare([src], tmp / f"out{k}", workers=cores, progress=False, val_fraction=0.005)
        n = m["splits"]["train"]["tokens"] + m["splits"]["val"]["tokens"] - m["documents"]
        return n / (time.perf_counter() - t0)  # EOT tokens excluded: same count as tiktoken

    # Interleaved, best of two each, so both see the same machine state.
    tk, pr = [tiktoken_run()], [prepare_run(0)]
    tk.append(tiktoken_run())
    pr.append(prepare_run(1))
    return {
        "text_mb": src.stat().st_size / 1e6,
        "tiktoken_tok_s": max(tk),
        "prepare_tok_s": max(pr),
        "ratio": max(pr) / max(tk),
    }


def bench_loader(tmp: Path, batches: int, tokenizer: GPT2Tokenizer) -> dict:
    from torchtitan.config import JobConfig

    from grt_titan.data.config import DataConfig
    from grt_titan.data.loader import build_dataloader

    jc = JobConfig()
    jc.training.dataset = "grt_default"
    jc.training.seq_len, jc.training.local_batch_size = 1024, 8
    jc.data = DataConfig(cache_dir=str(tmp / "cache"))
    it = iter(build_dataloader(1, 0, tokenizer, jc))
    next(it)  # prepares grt_default on first use; not timed
    times = []
    for _ in range(batches):  # > 1 epoch of grt_default: includes the reshuffle
        t0 = time.perf_counter()
        next(it)
        times.append(time.perf_counter() - t0)
    return {"mean_ms": 1e3 * statistics.mean(times), "max_ms": 1e3 * max(times)}


def bench_step() -> dict:
    from grt_titan.model import GRTModel, grt_flavors

    args = grt_flavors["debug"]
    model = GRTModel(args)
    with torch.no_grad():  # as torchtitan's trainer calls it
        model.init_weights()
    model.train()
    x = torch.randint(0, args.vocab_size, (8, 1024))
    y = torch.randint(0, args.vocab_size, (8, 1024))
    times = []
    for _ in range(3):  # first is warm-up
        t0 = time.perf_counter()
        logits = model(x, num_recurrences=1)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        loss.backward()
        times.append(time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
        del logits, loss
    return {
        "step_ms": 1e3 * min(times[1:]),
        "flavor": "debug",
        "layout": f"{args.n_prelude_layers}+{args.n_core_layers}x{args.num_recurrences}"
        f"+{args.n_coda_layers}, d={args.dim}",
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=8, help="copies of the 4 MB corpus to encode")
    p.add_argument("--batches", type=int, default=200)
    a = p.parse_args()
    cores = _cores()
    torch.set_num_threads(cores)
    tokenizer = GPT2Tokenizer()
    tmp = Path(tempfile.mkdtemp(prefix="grt_data_bench_"))
    try:
        pr = bench_prepare(tmp, a.repeat, cores, tokenizer)
        print(f"cores: {cores}")
        print(
            f"prepare: {pr['text_mb']:.1f} MB jsonl; tiktoken encode_ordinary_batch "
            f"{pr['tiktoken_tok_s'] / 1e6:.2f} M tok/s; prepare {pr['prepare_tok_s'] / 1e6:.2f}"
            f" M tok/s; ratio {pr['ratio']:.2f} (target >= 0.8)"
        )
        ld = bench_loader(tmp, a.batches, tokenizer)
        print(
            f"loader: 8 x 1024 batch, num_workers=0: mean {ld['mean_ms']:.3f} ms, "
            f"max {ld['max_ms']:.3f} ms over {a.batches} batches"
        )
        st = bench_step()
        print(
            f"step: forward+backward of {st['flavor']} ({st['layout']}) at 8 x 1024, r = 1: "
            f"{st['step_ms']:.0f} ms; loader/step = {100 * ld['mean_ms'] / st['step_ms']:.3f} %"
            " (target < 1 %)"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
