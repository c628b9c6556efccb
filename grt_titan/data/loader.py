"""The train spec's dataloaders: memory-mapped token shards, sharded over data-parallel ranks.

A split is one token stream of N tokens. Sequence ``g`` is the window
``tokens[g * S : g * S + S + 1]`` (S = seq_len): input = its first S tokens, labels = its
last S, so every token after the first is a label exactly once per epoch. With
``n = (N - 1) // S`` sequences and W data-parallel ranks, rank r reads, in epoch e,

    perm_e[j * W + r]   for j = 0 .. n // W - 1      (perm_e = permutation from (seed, e))

so the ranks' sequences are disjoint and together cover the split (the last ``n mod W`` of
each epoch's permutation are left out so that every rank takes the same number of steps).
The order is fixed by (seed, epoch, rank, step) alone: the main process hands sequence
numbers to the workers, so batches do not depend on ``num_workers``, and resuming needs
only the number of sequences consumed, which torchdata's StatefulDataLoader saves in the
torchtitan checkpoint (per dp rank, via ParallelAwareDataloader).
"""

import itertools
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler
from torchtitan.components.dataloader import BaseDataLoader, ParallelAwareDataloader
from torchtitan.tools.logging import logger

from grt_titan.data import default_corpus
from grt_titan.data import shards as sh
from grt_titan.data.config import DataConfig


class TokenSequenceDataset(Dataset):
    """Map-style: index k (this rank's k-th sequence, counting across epochs) -> sample.

    Args:
        stream: The split's token stream.
        seq_len: S; samples are ``({"input": LongTensor[S]}, LongTensor[S])``.
        dp_rank, dp_world_size: This rank and the data-parallel degree.
        seed: Shuffle seed (``[data] seed``), the same on every rank.
        shuffle: Reshuffle every epoch; False reads sequences in stream order.
    """

    def __init__(self, stream: sh.SplitStream, seq_len: int, dp_rank: int, dp_world_size: int,
                 seed: int, shuffle: bool):
        if seq_len < 1:
            raise ValueError(f"seq_len = {seq_len}: must be >= 1")
        if not 0 <= dp_rank < dp_world_size:
            raise ValueError(f"dp_rank {dp_rank} not in [0, dp_world_size={dp_world_size})")
        self.stream, self.seq_len = stream, seq_len
        self.dp_rank, self.dp_world_size = dp_rank, dp_world_size
        self.seed, self.shuffle = seed, shuffle
        self.num_sequences = max(0, (stream.num_tokens - 1) // seq_len)
        self.per_rank = self.num_sequences // dp_world_size
        if self.per_rank == 0:
            raise ValueError(
                f"{stream.dataset_dir}: split {stream.split!r} has {stream.num_tokens} tokens, "
                f"{self.num_sequences} sequences of seq_len {seq_len} (+1 label token); "
                f"{dp_world_size} data-parallel rank(s) need at least {dp_world_size}. "
                "Use a shorter seq_len, fewer ranks, or more data (a larger --val-fraction "
                "for the val split)"
            )
        self._perm_epoch, self._perm = -1, None

    def __len__(self) -> int:
        """Sequences per rank per epoch."""
        return self.per_rank

    def __getstate__(self):  # the permutation is recomputed in each worker
        return {**self.__dict__, "_perm_epoch": -1, "_perm": None}

    def sequence_index(self, k: int) -> int:
        """The split's sequence number read as this rank's k-th sample."""
        epoch, j = divmod(k, self.per_rank)
        g = j * self.dp_world_size + self.dp_rank
        if not self.shuffle:
            return g
        if self._perm_epoch != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            perm = rng.permutation(self.num_sequences)
            self._perm = perm.astype(np.int32) if self.num_sequences < 2**31 else perm
            self._perm_epoch = epoch
        return int(self._perm[g])

    def __getitem__(self, k: int):
        g = self.sequence_index(k)
        window = torch.from_numpy(self.stream.read(g * self.seq_len, self.seq_len + 1))
        return {"input": window[:-1]}, window[1:]


class ResumableSampler(Sampler[int]):
    """Yields 0, 1, 2, ... (``num_samples`` of them, or forever); state = how many.

    Same contract as torchdata's StatefulDistributedSampler: ``load_state_dict`` makes the
    next ``iter()`` start where the saved one stopped; a fresh ``iter()`` starts at 0.
    """

    def __init__(self, num_samples: int | None):
        self.num_samples = num_samples
        self.yielded = 0
        self._resume_at: int | None = None

    def __iter__(self):
        start = self._resume_at or 0
        self._resume_at = None
        self.yielded = start
        ks = itertools.count(start) if self.num_samples is None else range(start, self.num_samples)
        for k in ks:
            self.yielded = k + 1
            yield k

    def __len__(self) -> int:
        if self.num_samples is None:
            raise TypeError("an infinite sampler has no length")
        return self.num_samples

    def state_dict(self) -> dict:
        return {"yielded": self.yielded}

    def load_state_dict(self, state_dict: dict) -> None:
        self._resume_at = self.yielded = int(state_dict["yielded"])


def data_config(job_config) -> DataConfig:
    cfg = getattr(job_config, "data", None)
    return cfg if cfg is not None else DataConfig()


def resolve_dataset(dataset: str, dataset_path: str | None, tokenizer, data_cfg: DataConfig,
                    section: str) -> Path:
    """The prepared dataset folder selected by ``[<section>] dataset`` / ``dataset_path``."""
    if dataset == default_corpus.NAME:
        return default_corpus.ensure_prepared(tokenizer, data_cfg, dataset_path)
    key, value = (f"[{section}] dataset_path", dataset_path) if dataset_path else (
        f"[{section}] dataset", dataset)
    if not value:
        raise ValueError(f"[{section}] dataset is empty; set it to {default_corpus.NAME!r} "
                         "or to a folder made by `grt-titan prepare`")
    try:
        return sh.find_manifest(value, key).parent
    except FileNotFoundError as e:
        raise FileNotFoundError(
            f"{e}. [{section}] dataset must be {default_corpus.NAME!r} (the embedded corpus) "
            "or a prepared dataset folder"
        ) from None


def open_dataset_split(dataset: str, dataset_path: str | None, split: str, tokenizer,
                       data_cfg: DataConfig, section: str) -> sh.SplitStream:
    root = resolve_dataset(dataset, dataset_path, tokenizer, data_cfg, section)
    manifest = sh.read_manifest(root / sh.MANIFEST_NAME)
    sha = getattr(tokenizer, "sha256", None)
    if sha is None:
        logger.warning(f"{type(tokenizer).__name__} has no sha256; cannot check that "
                       f"{root} was prepared with it (vocabulary size checked only)")
    return sh.open_split(root, manifest, split, sha, tokenizer.get_vocab_size())


def _build(stream: sh.SplitStream, dp_world_size: int, dp_rank: int, seq_len: int,
           batch_size: int, dataloader_cfg, seed: int, shuffle: bool,
           infinite: bool) -> ParallelAwareDataloader:
    ds = TokenSequenceDataset(stream, seq_len, dp_rank, dp_world_size, seed, shuffle)
    logger.info(
        f"Data {stream.dataset_dir} [{stream.split}]: {stream.num_tokens:,} tokens, "
        f"{ds.num_sequences:,} sequences of {seq_len}, {ds.per_rank:,} per dp rank "
        f"({dp_world_size} ranks), shuffle={shuffle} seed={seed}"
    )
    kwargs = {**asdict(dataloader_cfg), "batch_size": batch_size}
    return ParallelAwareDataloader(
        ds, dp_rank=dp_rank, dp_world_size=dp_world_size,
        sampler=ResumableSampler(None if infinite else ds.per_rank), **kwargs,
    )


def build_dataloader(dp_world_size: int, dp_rank: int, tokenizer, job_config,
                     infinite: bool = True) -> BaseDataLoader:
    """The train spec's ``build_dataloader_fn``: the ``train`` split of ``[training] dataset``.

    Yields ``({"input": LongTensor[B, S]}, labels LongTensor[B, S])`` with
    B = ``training.local_batch_size``, S = ``training.seq_len``; shuffled per epoch from
    ``[data] seed``; ``infinite`` loops over epochs (False: one epoch, last batch partial).
    """
    t, cfg = job_config.training, data_config(job_config)
    stream = open_dataset_split(t.dataset, t.dataset_path, "train", tokenizer, cfg, "training")
    return _build(stream, dp_world_size, dp_rank, t.seq_len, t.local_batch_size, t.dataloader,
                  cfg.seed, cfg.shuffle, infinite)


def build_validation_dataloader(dp_world_size: int, dp_rank: int, tokenizer, job_config,
                                infinite: bool = False) -> BaseDataLoader:
    """The ``val`` split of ``[validation] dataset``, in stream order (the same every run).

    Each ``iter()`` starts again at the split's first sequence, so every validation pass
    scores the same sequences; ``infinite`` wraps around at the end of the split.
    """
    v, cfg = job_config.validation, data_config(job_config)
    stream = open_dataset_split(v.dataset, v.dataset_path, "val", tokenizer, cfg, "validation")
    return _build(stream, dp_world_size, dp_rank, v.seq_len, v.local_batch_size, v.dataloader,
                  cfg.seed, False, infinite)
