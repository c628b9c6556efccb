"""Start-up checks of the parallelism and the sequence shapes it splits (docs/reliability.md).

The rules `parallelize_grt` asserts (TP dividing the heads and the MLP width, seq_len
divisible by 2 x TP x CP, no DDP with TP, no PP / CP / EP) and the batch arithmetic of data
parallelism, checked before the model is built so that a bad degree is named by its TOML key
instead of failing deep inside a plan. grt_titan/config_checks.py runs them in its order.
"""

from __future__ import annotations

import math
import os

import torch.distributed as dist

from grt_titan.sections import UNSUPPORTED_DEGREES, unsupported_degree


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def _world_size(job_config) -> int | None:
    """The trainer's world size (its process group exists already), else the launcher's."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    value = os.environ.get("NGPU" if job_config.comm.mode != "default" else "WORLD_SIZE")
    return int(value) if value and value.isdigit() else None


def data_parallel_shard(job_config) -> int | None:
    """The data-parallel shard degree (-1 resolved as torchtitan does: the ranks the other
    degrees leave); None when the world size is unknown or a degree is invalid (named elsewhere)."""
    p, world = job_config.parallelism, _world_size(job_config)
    if not world or p.data_parallel_replicate_degree < 1 or p.tensor_parallel_degree < 1:
        return None
    if p.data_parallel_shard_degree >= 1:
        return p.data_parallel_shard_degree
    others = p.data_parallel_replicate_degree * p.tensor_parallel_degree
    return world // (others * max(p.context_parallel_degree, 1) * max(p.pipeline_parallel_degree, 1))


def degree_problems(job_config) -> list[str]:
    """Parallelisms the GRT has on neither host (torchtitan 0.3 refuses them in refusals.py)."""
    p = job_config.parallelism
    return [unsupported_degree(key, getattr(p, key)) for key in UNSUPPORTED_DEGREES if getattr(p, key) != 1]


def _sequence_shapes(job_config) -> list[tuple[str, object]]:
    """(`name`, section) of the sequence shapes the job runs: `[training]`, and `[validation]`
    when it validates at another shape (at training's, training's line says it all)."""
    t, v = job_config.training, job_config.validation
    shapes = [("training", t)]
    if v.enable and (v.seq_len, v.local_batch_size) != (t.seq_len, t.local_batch_size):
        shapes.append(("validation", v))
    return shapes


def sequence_problems(job_config, args) -> list[str]:
    """Each shape's seq_len and local batch: positive, and within a gpt2 flavor's learned
    positions (beyond them its position embedding has no row)."""
    problems = []
    for name, cfg in _sequence_shapes(job_config):
        if cfg.seq_len < 1:
            problems.append(f"[{name}] seq_len = {cfg.seq_len} is invalid; allowed: >= 1")
        elif args.block_style == "gpt2" and cfg.seq_len > args.max_seq_len:
            problems.append(
                f"[{name}] seq_len = {cfg.seq_len} exceeds the learned positions of flavor "
                f"{job_config.model.flavor!r} (max_seq_len = {args.max_seq_len}); "
                f"allowed: 1 .. {args.max_seq_len}"
            )
        if cfg.local_batch_size < 1:
            problems.append(f"[{name}] local_batch_size = {cfg.local_batch_size} is invalid; allowed: >= 1")
    return problems


def tensor_parallel_problems(job_config, args) -> list[str]:
    """The TP plan's splits: the degree divides the heads (and kv heads) and the MLP width, and
    the sequences divide as sequence parallelism cuts them."""
    p, problems = job_config.parallelism, []
    tp = p.tensor_parallel_degree
    if tp < 1:
        return [f"[parallelism] tensor_parallel_degree = {tp} is invalid; allowed: >= 1"]
    if tp > 1:
        heads = args.n_heads if args.n_kv_heads is None else math.gcd(args.n_heads, args.n_kv_heads)
        if args.n_heads % tp or (args.n_kv_heads is not None and args.n_kv_heads % tp):
            kv = "" if args.n_kv_heads is None else f" and n_kv_heads = {args.n_kv_heads}"
            problems.append(
                f"[parallelism] tensor_parallel_degree = {tp} must divide the flavor's "
                f"n_heads = {args.n_heads}{kv}; allowed: {_divisors(heads)}"
            )
        hidden = args.ffn_hidden_dim
        if hidden % tp:
            problems.append(
                f"[parallelism] tensor_parallel_degree = {tp} must divide the MLP hidden size "
                f"{hidden}; allowed: {_divisors(math.gcd(hidden, heads))}"
            )
    # parallelize_grt's rule (torchtitan's seq_len_divisor: tp x 2 x cp), checked here first.
    divisor = tp * 2 * max(p.context_parallel_degree, 1)
    seq_len = job_config.training.seq_len
    if seq_len >= 1 and seq_len % divisor:
        problems.append(
            f"[training] seq_len = {seq_len} must be divisible by {divisor} "
            "(2 x tensor_parallel_degree x context_parallel_degree); allowed: a multiple of it"
        )
    v = dict(_sequence_shapes(job_config)).get("validation")
    if tp > 1 and v is not None and v.seq_len >= 1 and v.seq_len % tp:
        problems.append(
            f"[validation] seq_len = {v.seq_len} must be divisible by tensor_parallel_degree = {tp} "
            "(sequence parallel); allowed: a multiple of it"
        )
    return problems


def data_parallel_problems(job_config) -> list[str]:
    """The data-parallel degrees, and a global batch that splits into whole microbatches on
    every data-parallel rank (torchtitan's Trainer asserts it without naming the key)."""
    p, t, problems = job_config.parallelism, job_config.training, []
    dp_replicate, dp_shard = p.data_parallel_replicate_degree, p.data_parallel_shard_degree
    if dp_replicate < 1:
        problems.append(f"[parallelism] data_parallel_replicate_degree = {dp_replicate} is invalid; allowed: >= 1")
    if dp_shard != -1 and dp_shard < 1:
        problems.append(f"[parallelism] data_parallel_shard_degree = {dp_shard} is invalid; allowed: -1 or >= 1")
    shard = data_parallel_shard(job_config)
    if shard is None or dp_replicate < 1:
        return problems
    if t.local_batch_size >= 1 and t.global_batch_size > 0:
        dp = dp_replicate * shard
        if dp >= 1 and t.global_batch_size % (t.local_batch_size * dp):
            problems.append(
                f"[training] global_batch_size = {t.global_batch_size} must be a multiple of "
                f"local_batch_size x data-parallel degree = {t.local_batch_size} x {dp}; "
                "allowed: -1 (no gradient accumulation) or a multiple of that"
            )
    return problems


def ddp_problems(job_config) -> list[str]:
    """0.2.2 applies DDP to replicas without sharding (torchtitan 0.3 shards them as HSDP)."""
    p = job_config.parallelism
    dp_replicate, tp = p.data_parallel_replicate_degree, p.tensor_parallel_degree
    if dp_replicate > 1 and tp > 1 and data_parallel_shard(job_config) == 1:
        return [
            f"[parallelism] data_parallel_replicate_degree = {dp_replicate} without sharding is DDP, "
            f"which cannot be combined with tensor_parallel_degree = {tp}; allowed: HSDP "
            "(data_parallel_shard_degree > 1) or tensor_parallel_degree = 1"
        ]
    return []
