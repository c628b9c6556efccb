"""Dry-run GRT layouts at cluster scale on one CPU process (torchtitan's fake backend).

Each layout runs in its own process: torchtitan's Trainer with `comm.mode = fake_backend`
and NGPU ranks simulated as rank 0, the grt parallelize function, one training step. It
prints what rank 0 holds (parameter, gradient and optimizer-state bytes) and the
collectives of that step (count and bytes, all-gather and reduce-scatter), so layouts
gloo cannot run (64, 512 ranks; TP 4) are checked for construction, sharding and a full
step. Collectives are no-ops: losses are meaningless, sizes are real.

    python benchmarks/scale_dryrun.py                       # the docs/results/parallelism_scale_dryrun.md table
    python benchmarks/scale_dryrun.py --layouts large:64:16:1:4 --seq-len 256
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

# config, flavor, world size, FSDP shard degree, replicate (HSDP) degree, TP degree
DEFAULT_LAYOUTS = [
    "grt_large:64:16:1:4",
    "dense_large:64:16:1:4",
    "grt_large:512:16:8:4",
    "dense_large:512:16:8:4",
    "grt_llama_1b:64:16:1:4",
    "dense_llama_1b:64:16:1:4",
    "grt_llama_1b:512:16:8:4",
    "dense_llama_1b:512:16:8:4",
]


def worker(config: str, world: int, shard: int, replicate: int, tp: int, seq_len: int) -> dict:
    os.environ.update(NGPU=str(world), LOCAL_RANK="0", RANK="0", WORLD_SIZE=str(world))
    from grt_titan.runtime.cpu_support import enable_cpu_training

    enable_cpu_training()
    import torch
    from torchtitan.config import ConfigManager
    from torchtitan.train import Trainer

    import grt_titan.spec  # noqa: F401  registers the `grt` train spec
    from grt_titan.infra.comm_stats import CollectiveCounter

    argv = [
        "--job.config_file",
        f"train_configs/{config}.toml",
        "--job.dump_folder",
        f"/tmp/grt_dryrun/{config}_{world}",
        "--comm.mode",
        "fake_backend",
        "--parallelism.data_parallel_shard_degree",
        str(shard),
        "--parallelism.data_parallel_replicate_degree",
        str(replicate),
        "--parallelism.tensor_parallel_degree",
        str(tp),
        "--training.local_batch_size",
        "1",
        "--training.global_batch_size",
        "-1",
        "--training.seq_len",
        str(seq_len),
        "--training.steps",
        "1",
        "--compile.no-enable",
        "--validation.no-enable",
        "--checkpoint.no-enable",
        "--metrics.no-enable-tensorboard",
    ]
    trainer = Trainer(ConfigManager().parse_args(argv))
    model = trainer.model_parts[0]

    def local_bytes(tensors) -> int:
        total = 0
        for t in tensors:
            t = t.to_local() if hasattr(t, "to_local") else t
            total += t.numel() * t.element_size()
        return total

    batches = trainer.batch_generator(trainer.dataloader)
    trainer.step = 1
    with CollectiveCounter() as counter:
        trainer.train_step(batches)
    optimizer_states = [
        v
        for opt in trainer.optimizers.optimizers
        for s in opt.state.values()
        for v in s.values()
        if isinstance(v, torch.Tensor) and v.dim() > 0
    ]
    return {
        "config": config,
        "world": world,
        "layout": f"HSDP {replicate} x FSDP {shard} x TP {tp}" if replicate > 1 else f"FSDP {shard} x TP {tp}",
        "flavor": trainer.job_config.model.flavor,
        "param_bytes": local_bytes(model.parameters()),
        "grad_bytes": local_bytes(p.grad for p in model.parameters() if p.grad is not None),
        "optimizer_bytes": local_bytes(optimizer_states),
        "all_gather": [counter.counts["all_gather"], counter.bytes["all_gather"]],
        "reduce_scatter": [counter.counts["reduce_scatter"], counter.bytes["reduce_scatter"]],
        "all_reduce": [counter.counts["all_reduce"], counter.bytes["all_reduce"]],
        "tp": [
            sum(v for k, v in counter.counts.items() if k.startswith("tp.")),
            sum(v for k, v in counter.bytes.items() if k.startswith("tp.")),
        ],
    }


def run_layout(spec: str, seq_len: int) -> dict:
    config, world, shard, replicate, tp = spec.split(":")
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", spec, "--seq-len", str(seq_len)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"layout {spec} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def mib(n: int) -> str:
    return f"{n / 2**20:,.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--layouts",
        nargs="*",
        default=DEFAULT_LAYOUTS,
        help="config:world:fsdp:replicate:tp entries (default: the docs table)",
    )
    parser.add_argument(
        "--seq-len", type=int, default=256, help="sequence length of the step (sizes of weights do not depend on it)"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        config, world, shard, replicate, tp = args.worker.split(":")
        result = worker(config, int(world), int(shard), int(replicate), int(tp), args.seq_len)
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    print(
        "| config | ranks | layout | params MiB/rank | grads MiB/rank | optimizer MiB/rank "
        "| FSDP all-gathers (MiB) | FSDP reduce-scatters (MiB) | TP collectives (MiB) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for spec in args.layouts:
        r = run_layout(spec, args.seq_len)
        print(
            f"| {r['config']} | {r['world']} | {r['layout']} | {mib(r['param_bytes'])} | {mib(r['grad_bytes'])} "
            f"| {mib(r['optimizer_bytes'])} | {r['all_gather'][0]} ({mib(r['all_gather'][1])}) "
            f"| {r['reduce_scatter'][0]} ({mib(r['reduce_scatter'][1])}) | {r['tp'][0]} ({mib(r['tp'][1])}) |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
