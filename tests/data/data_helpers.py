"""Helpers of the data tests: small corpora, synthetic shard sets, job configs."""

import json
from pathlib import Path

import numpy as np

from grt_titan.data.config import DataConfig

from grt_test_helpers import write_token_dataset

DOCS = [
    "It is a truth universally acknowledged, that a single man in possession\n"
    "of a good fortune, must be in want of a wife.",
    "Emma Woodhouse, handsome, clever, and rich, with a comfortable home\n\n"
    "and happy disposition.   Extra  spaces,\ttabs, and 123 numbers.",
    "Unicode: café, naïve, 東京, emoji 🙂, and a literal <|endoftext|> in the text.",
    "Short one.",
    "The family of Dashwood had long been settled in Sussex. " * 20,
    "Last document\n",
]


def write_jsonl(path: Path, docs, field: str = "text") -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({field: d, "id": len(d)}) + "\n")
    return path


def make_synthetic_dataset(
    root: Path, tokenizer, train_tokens: int, val_tokens: int = 0, shard_tokens: int = 1000
) -> Path:
    """A prepared dataset whose token at stream position i is i (ids < 50,000): a window's
    first token tells which sequence it is."""
    assert train_tokens < 50_000 and val_tokens < 50_000
    root.mkdir(parents=True)
    splits = {"train": np.arange(train_tokens, dtype=np.int64), "val": np.arange(val_tokens, dtype=np.int64)}
    return write_token_dataset(root, tokenizer, splits, shard_tokens, val_fraction=0.0)


def job_config(
    dataset: str,
    seq_len: int = 16,
    batch_size: int = 4,
    num_workers: int = 0,
    seed: int = 0,
    cache_dir: str | None = None,
    val_dataset: str | None = None,
):
    from torchtitan.config import JobConfig

    jc = JobConfig()
    jc.training.dataset = dataset
    jc.training.seq_len = seq_len
    jc.training.local_batch_size = batch_size
    jc.training.dataloader.num_workers = num_workers
    jc.validation.dataset = val_dataset or dataset
    jc.validation.seq_len = seq_len
    jc.validation.local_batch_size = batch_size
    jc.validation.dataloader.num_workers = num_workers
    jc.data = DataConfig(seed=seed, cache_dir=cache_dir)
    return jc
