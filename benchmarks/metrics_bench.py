"""Step time with the GRT recurrence metrics off vs on, in one process, interleaved.

    python benchmarks/metrics_bench.py [--flavor debug] [--batch 4] [--seq-len 128]
        [--log-freq 10] [--steps 20] [--rounds 5] [--device cpu] [--threads N]

A training step is torchtitan's order: forward, backward, optimizer step, then
`metrics_processor.log(...)` on log steps. Three configurations run in blocks of `--steps`
steps, rotated each round so that drift of a shared machine hits all of them alike:

- `baseline`: torchtitan's own MetricsProcessor (no GRT code at all);
- `off`:      GRTMetricsProcessor with `[grt_metrics] enable = false`;
- `on`:       GRTMetricsProcessor with `enable = true` (observes the log steps only).

Prints the mean step time of each and the ratios to `baseline`; with `on`, also the mean
time of the observed (logged) steps vs the others. Results: docs/results/observability_metrics_overhead.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch


def build(flavor: str, device: str):
    from grt_titan.model import GRTModel, grt_flavors

    torch.manual_seed(0)
    model = GRTModel(dataclasses.replace(grt_flavors[flavor]))
    with torch.no_grad():
        model.init_weights()
    return model.to(device).train()


def make_processor(kind: str, job_config, dims, model, optimizers):
    from torchtitan.components.metrics import MetricsProcessor

    from grt_titan.components.metrics import GRTMetricsProcessor
    from grt_titan.job_config import GRTMetricsConfig

    job_config.grt_metrics = GRTMetricsConfig(enable=(kind == "on"))
    if kind == "baseline":
        proc = MetricsProcessor(job_config, dims)
    else:
        proc = GRTMetricsProcessor(job_config, dims, model.model_args)
    proc.num_flops_per_token = int(model.model_args.expected_train_flops_per_token(job_config.training.seq_len))
    proc.model_parts = [model]
    proc.optimizers = optimizers
    return proc


def run_block(proc, model, optimizers, batches, first_step: int, sync) -> tuple[list[float], list[bool]]:
    times, logged = [], []
    for k, tokens in enumerate(batches):
        step = first_step + k
        sync()
        t0 = time.perf_counter()
        optimizers.zero_grad()
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        optimizers.step()
        proc.ntokens_since_last_log += tokens.numel()
        proc.data_loading_times.append(0.0)
        if proc.should_log(step):
            proc.log(step, loss.item(), loss.item(), 1.0)
        sync()
        times.append(time.perf_counter() - t0)
        logged.append(proc.should_log(step))
    return times, logged


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--flavor", default="debug")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--log-freq", type=int, default=10)
    p.add_argument("--steps", type=int, default=20, help="steps per block")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)

    from torchtitan.components.optimizer import build_optimizers
    from torchtitan.config import JobConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.tools.logging import init_logger

    from grt_titan.runtime.cpu_support import enable_cpu_training

    enable_cpu_training()
    init_logger()
    import logging

    logging.getLogger().setLevel(logging.WARNING)  # no per-log console lines in the timing
    jc = JobConfig()
    jc.training.seq_len = a.seq_len
    jc.metrics.log_freq = a.log_freq
    jc.metrics.enable_tensorboard = False
    dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=1)
    model = build(a.flavor, a.device)
    optimizers = build_optimizers([model], jc.optimizer, dims)
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    vocab = model.model_args.vocab_size
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, vocab, (a.batch, a.seq_len + 1), generator=gen).to(a.device) for _ in range(a.steps)]

    kinds = ["baseline", "off", "on"]
    times = {k: [] for k in kinds}
    observed = {True: [], False: []}
    run_block(
        make_processor("baseline", jc, dims, model, optimizers), model, optimizers, batches[:3], 2, sync
    )  # warm-up
    step = 1
    for rnd in range(a.rounds):
        for kind in kinds[rnd % 3 :] + kinds[: rnd % 3]:
            proc = make_processor(kind, jc, dims, model, optimizers)
            t, logged = run_block(proc, model, optimizers, batches, step, sync)
            getattr(proc, "remove_hooks", lambda: None)()  # the next block's processor hooks itself
            times[kind] += t
            if kind == "on":
                for ti, li in zip(t, logged):
                    observed[li].append(ti)
            step += a.steps  # blocks continue the step count, so log steps rotate
    base = statistics.mean(times["baseline"])
    base_median = statistics.median(times["baseline"])
    print(
        f"flavor {a.flavor}, batch {a.batch} x seq {a.seq_len}, device {a.device}, log_freq {a.log_freq}, "
        f"{a.rounds} rounds x {a.steps} steps per configuration, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )
    for kind in kinds:
        m, med = statistics.mean(times[kind]), statistics.median(times[kind])
        print(
            f"  {kind:8s} mean step {1000 * m:8.2f} ms  median {1000 * med:8.2f} ms"
            f"  ratio to baseline: mean {m / base:.3f}, median {med / base_median:.3f}"
        )
    if observed[True] and observed[False]:
        print(
            f"  on: observed (logged) steps {1000 * statistics.mean(observed[True]):.2f} ms vs other steps "
            f"{1000 * statistics.mean(observed[False]):.2f} ms "
            f"(ratio {statistics.mean(observed[True]) / statistics.mean(observed[False]):.3f}, "
            f"includes the log call)"
        )


if __name__ == "__main__":
    main()
