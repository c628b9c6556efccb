"""Cost of checkpoint checksums (docs/reliability.md, `[checkpoint] checksums`; not a timed test).

One process saves the same state dict (fp32 tensors of `--mib` MiB in all, like a model and
its AdamW moments) with DCP's FileSystemWriter and with grt_titan's ChecksumFileSystemWriter,
interleaved `--repeat` times into fresh folders, then times the load-side verification
(`verify_checkpoint`: one read and CRC32 of every shard file). Reports medians, the extra
seconds per GB of checkpoint, and the checksummed / plain save ratio.

    PYTHONPATH=. python benchmarks/checkpoint_checksums.py [--mib 512] [--repeat 3]
"""

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from grt_titan.components.checksums import ChecksumFileSystemWriter, verify_checkpoint


def state_dict(mib: int) -> dict:
    g = torch.Generator().manual_seed(0)
    n = mib * 2**20 // 4 // 16
    return {f"layer{i}.weight": torch.randn(n, generator=g) for i in range(16)}


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=512)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    state = state_dict(args.mib)
    root = Path(tempfile.mkdtemp(prefix="grt-ckpt-bench-"))
    plain, summed, verify = [], [], []
    try:
        for i in range(args.repeat):
            a, b = root / f"plain-{i}", root / f"summed-{i}"
            plain.append(timed(lambda: dcp.save(state, storage_writer=dcp.FileSystemWriter(str(a)))))
            summed.append(timed(lambda: dcp.save(state, storage_writer=ChecksumFileSystemWriter(str(b)))))
            verify.append(timed(lambda: verify_checkpoint(str(b))))
            shutil.rmtree(a)
            shutil.rmtree(b)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    gb = sum(t.numel() * t.element_size() for t in state.values()) / 1e9
    m_plain, m_summed, m_verify = (statistics.median(x) for x in (plain, summed, verify))
    print(f"checkpoint {gb:.3f} GB, {args.repeat} saves each, medians:")
    print(f"  save, DCP FileSystemWriter:      {m_plain:.3f} s ({m_plain / gb:.3f} s/GB)")
    print(f"  save, ChecksumFileSystemWriter:  {m_summed:.3f} s ({m_summed / gb:.3f} s/GB)")
    print(f"  extra at save: {(m_summed - m_plain) / gb:.3f} s/GB; checksummed / plain save = {m_summed / m_plain:.2f}")
    print(f"  verify before load (read + CRC32): {m_verify:.3f} s ({m_verify / gb:.3f} s/GB)")


if __name__ == "__main__":
    main()
