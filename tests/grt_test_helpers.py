"""Shared test helpers: torchrun on CPU (gloo), torchtitan's step lines, a small model."""

import os
import re
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
STEP_LINE = re.compile(r"step:\s*(\d+)\s+loss:\s*([0-9.naninf]+)\s+grad_norm:\s*([0-9.naninf]+)")


def torchrun(nproc: int, args: list[str], tmp_path: Path, timeout: int = 600, module: str = "grt_titan.train",
             env: dict | None = None) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node=nproc -m module args` from the repo root; output kept in tmp_path."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
        "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "--local-ranks-filter=0",
        "-m", module, *args,
    ]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.run(cmd, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout)
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "torchrun.log").write_text(proc.stdout + proc.stderr)
    return proc


def step_losses(output: str) -> dict[int, float]:
    output = ANSI.sub("", output)
    return {int(m.group(1)): float(m.group(2)) for m in STEP_LINE.finditer(output)}


def build_model(flavor: str = "debug", seed: int = 0, **changes):
    """A GRT flavor built on meta, materialised on CPU and initialised from `seed`, in train mode."""
    from grt_titan.model import GRTModel, grt_flavors

    args = grt_flavors[flavor].replace(**changes)
    with torch.device("meta"):
        model = GRTModel(args)
    model.to_empty(device="cpu")
    torch.manual_seed(seed)
    with torch.no_grad():
        model.init_weights()
    return model.train()


def write_token_dataset(root: Path, tokenizer, splits: dict, shard_tokens: int, val_fraction: float) -> Path:
    """A prepared dataset (shards + manifest, as `grt-titan prepare` writes) holding the given
    token arrays per split, for tests that need exact control of the tokens."""
    from grt_titan.data import shards as sh

    root.mkdir(parents=True, exist_ok=True)
    dtype = sh.dtype_for_vocab(tokenizer.get_vocab_size())
    written = {}
    for split, tokens in splits.items():
        writer = sh.ShardWriter(root, split, shard_tokens, dtype)
        writer.write(tokens)
        written[split] = writer.close()
    sh.write_manifest(root, {
        "format": sh.FORMAT_NAME, "version": sh.FORMAT_VERSION,
        "tokenizer": {"name": tokenizer.name, "sha256": tokenizer.sha256,
                      "vocab_size": tokenizer.get_vocab_size(), "eot_id": tokenizer.eos_id},
        "dtype": dtype.name, "document_separator": "eot_after_each_document",
        "inputs": ["synthetic"], "text_field": "text", "val_fraction": val_fraction,
        "shard_tokens": shard_tokens, "documents": 1,
        "skipped_documents": {"invalid_utf8": 0, "empty": 0}, "splits": written,
    })
    return root
