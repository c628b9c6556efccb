"""The train spec's dataloaders: memory-mapped token shards, sharded over data-parallel ranks.

A split is one token stream of N tokens. Sequence ``g`` is the window
``tokens[g * S : g * S + S + 1]`` (S = seq_len): input = its first S tokens, labels = its
last S, so every token after the first is a label exactly once per epoch. With
``n = (N - 1) // S`` sequences, the job reads one global stream of data positions
d = 0, 1, 2, ...: position d is sequence ``perm_e[d mod n]`` of epoch ``e = d // n``
(perm_e = permutation from (seed, e)). With W data-parallel ranks, the k-th sample of rank
r is position ``start + k * W + r``: after every rank has taken k samples the job has read
exactly the positions ``[start, start + k W)``, whatever W is.

So the data position is one number, global, independent of the layout: the checkpoint
saves it once (`global_position`, with the epoch, seed, split size and global batch), and
a run saved at data-parallel degree A resumes at degree B reading exactly the sequences an
uninterrupted run at degree B would read from there (docs/reliability.md). Windows of
positions can be skipped (`set_skip_windows`, the loss-spike rewind). Checkpoints written
with torchtitan's per-rank keys (``dp_rank_<r>``) still load at their own degree.
"""

import itertools
import json
import pickle
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler
from torchtitan.components.dataloader import BaseDataLoader, ParallelAwareDataloader
from torchtitan.components.loss import IGNORE_INDEX
from torchtitan.tools.logging import logger

from grt_titan.data import default_corpus, records
from grt_titan.data import shards as sh
from grt_titan.data.config import DataConfig


class TokenSequenceDataset(Dataset):
    """Map-style: index k (this rank's k-th sample since `start`) -> sample.

    Args:
        stream: The split's token stream.
        seq_len: S; samples are ``({"input": LongTensor[S]}, LongTensor[S])``.
        dp_rank, dp_world_size: This rank and the data-parallel degree.
        seed: Shuffle seed (``[data] seed``), the same on every rank.
        shuffle: Reshuffle every epoch; False reads sequences in stream order.

    ``start`` (the global data position of sample 0, set on resume) and ``skips`` (sorted,
    disjoint windows ``[a, b)`` of positions never read) are the same on every rank.
    """

    def __init__(
        self,
        stream: sh.SplitStream,
        seq_len: int,
        dp_rank: int,
        dp_world_size: int,
        seed: int,
        shuffle: bool,
        long_records: str = "error",
        step_targets: bool = False,
        pack_records: bool = True,
    ):
        if seq_len < 1:
            raise ValueError(f"seq_len = {seq_len}: must be >= 1")
        if not 0 <= dp_rank < dp_world_size:
            raise ValueError(f"dp_rank {dp_rank} not in [0, dp_world_size={dp_world_size})")
        self.stream, self.seq_len = stream, seq_len
        self.dp_rank, self.dp_world_size = dp_rank, dp_world_size
        self.seed, self.shuffle = seed, shuffle
        self.dropped_records = 0
        self.step_targets = step_targets
        if step_targets and not stream.steps:
            why = stream.no_steps or f"{stream.dataset_dir}: documents, not prompt/completion records with 'steps'"
            raise ValueError(
                f"[grt] step_supervision = true needs per-step targets; {why}. Allowed: a folder "
                "prepared from records with 'steps' (`grt-titan task`), or step_supervision = false"
            )
        if stream.record_starts is None:
            self.num_sequences = max(0, (stream.num_tokens - 1) // seq_len)
        else:
            self._pack_records(long_records, pack_records)
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
        self.start = 0
        self.skips: list[tuple[int, int]] = []

    def _pack_records(self, long_records: str, pack_records: bool) -> None:
        """Prompt/completion data: sequences are whole records packed in order (records.pack)
        into seq_len + 1 tokens, never one split across two; one record each unless `pack_records`."""
        if long_records not in ("error", "drop"):
            raise ValueError(f"[data] long_records = {long_records!r}; allowed: 'error', 'drop'")
        starts, ends, too_long = records.pack(self.stream.record_starts, self.seq_len + 1, pack_records)
        if too_long.size and long_records == "error":
            first = int(too_long[0])
            length = int(self.stream.record_starts[first + 1] - self.stream.record_starts[first])
            where = records.record_source(self.stream.dataset_dir, self.stream.meta_file, first)
            raise ValueError(
                f"{where}: a prompt/completion record of {length} tokens does not fit seq_len "
                f"{self.seq_len} (+1 label token); {too_long.size} record(s) of split {self.stream.split!r} "
                "are that long. Allowed: a longer seq_len, or [data] long_records = 'drop' to leave them out"
            )
        self.dropped_records = int(too_long.size)
        self.pack_starts, self.pack_ends = starts, ends
        self.num_sequences = int(starts.size)

    def __len__(self) -> int:
        """Sequences per rank per epoch."""
        return self.per_rank

    def __getstate__(self):  # the permutation is recomputed in each worker
        return {**self.__dict__, "_perm_epoch": -1, "_perm": None}

    def position(self, k: int) -> int:
        """The global data position after every rank has taken k samples from `start`
        (the next position to read), jumping over the skip windows."""
        d, left = self.start, k * self.dp_world_size
        for a, b in self.skips:
            if b <= d:
                continue
            if a <= d:  # inside a window: jump to its end
                d = b
                continue
            if d + left < a:
                break
            left -= a - d
            d = b
        return d + left

    def sequence_number(self, d: int) -> int:
        """The split's sequence number at global data position d."""
        epoch, g = divmod(d, self.num_sequences)
        if not self.shuffle:
            return g
        if self._perm_epoch != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            perm = rng.permutation(self.num_sequences)
            self._perm = perm.astype(np.int32) if self.num_sequences < 2**31 else perm
            self._perm_epoch = epoch
        return int(self._perm[g])

    def sequence_index(self, k: int) -> int:
        """The split's sequence number read as this rank's k-th sample."""
        return self.sequence_number(self.position(k) + self.dp_rank)

    def __getitem__(self, k: int):
        g = self.sequence_index(k)
        if self.stream.record_starts is None:
            window = torch.from_numpy(self.stream.read(g * self.seq_len, self.seq_len + 1))
            return {"input": window[:-1]}, window[1:]
        # Packed records: labels outside the completions (prompts, padding) are ignored.
        a, b = int(self.pack_starts[g]), int(self.pack_ends[g])
        window = torch.zeros(self.seq_len + 1, dtype=torch.long)
        window[: b - a] = torch.from_numpy(self.stream.read(a, b - a))
        counted = torch.zeros(self.seq_len + 1, dtype=torch.bool)
        counted[: b - a] = torch.from_numpy(self.stream.mask.read(a, b - a)).bool()
        labels = window[1:].masked_fill(~counted[1:], IGNORE_INDEX)
        sample = {"input": window[:-1]}
        if self.step_targets:  # [S, K]: step t's version of the labels in column t - 1
            steps = torch.zeros(self.seq_len + 1, len(self.stream.steps), dtype=torch.long)
            for t, stream in enumerate(self.stream.steps):
                steps[: b - a, t] = torch.from_numpy(stream.read(a, b - a))
            sample["step_labels"] = steps[1:].masked_fill(~counted[1:, None], IGNORE_INDEX)
        return sample, labels


class SampleCounter(Sampler[int]):
    """Yields 0, 1, 2, ... (``num_samples`` of them, or forever), from 0 at every ``iter()``:
    this rank's sample numbers since the dataset's global ``start``, which is what resumes."""

    def __init__(self, num_samples: int | None):
        self.num_samples = num_samples

    def __iter__(self):
        return iter(itertools.count() if self.num_samples is None else range(self.num_samples))

    def __len__(self) -> int:
        if self.num_samples is None:
            raise TypeError("an infinite sampler has no length")
        return self.num_samples


STATE_KEY = "global_position"


class GlobalPositionDataloader(ParallelAwareDataloader):
    """torchtitan's ParallelAwareDataloader whose checkpoint state is the job's global data
    position (one `global_position` entry, the same on every rank, saved once by DCP)
    instead of torchdata's per-rank state (`dp_rank_<r>`), so it reloads at any layout.

    Args:
        global_batch: Sequences per optimizer step over the whole job; a resume with another
            one is refused unless ``allow_global_batch_change``.
    """

    def __init__(
        self,
        dataset: TokenSequenceDataset,
        dp_rank: int,
        dp_world_size: int,
        global_batch: int,
        allow_global_batch_change: bool = False,
        **kwargs,
    ):
        super().__init__(dataset, dp_rank=dp_rank, dp_world_size=dp_world_size, **kwargs)
        self.global_batch = global_batch
        self.allow_global_batch_change = allow_global_batch_change
        self.delivered = 0  # samples this rank has handed out since `dataset.start`
        self._legacy_keys = False

    def __iter__(self):
        self.delivered = 0
        for batch in super().__iter__():
            self.delivered += len(batch[1])
            yield batch

    def position(self, delivered: int | None = None) -> int:
        """The next global data position once every rank has handed out `delivered` samples
        (default: as many as this rank)."""
        return self.dataset.position(self.delivered if delivered is None else delivered)

    def set_skip_windows(self, windows: list[tuple[int, int]]) -> None:
        """Never read the global positions in these ``[a, b)`` windows (the same on every rank)."""
        self.dataset.skips = sorted((int(a), int(b)) for a, b in windows if b > a)

    def record(self) -> dict:
        ds = self.dataset
        d = self.position()
        return {
            "version": 1,
            "position": d,
            "epoch": d // ds.num_sequences,
            "num_sequences": ds.num_sequences,
            "seq_len": ds.seq_len,
            "seed": ds.seed,
            "shuffle": ds.shuffle,
            "global_batch": self.global_batch,
            "dp_degree": self.dp_world_size,
        }

    def state_dict(self) -> dict:
        if self._legacy_keys:  # the template of a load from a per-rank checkpoint
            return {self._rank_id: b"", "world_size": self.dp_world_size}
        return {STATE_KEY: json.dumps(self.record(), sort_keys=True)}

    def select_saved_state(self, keys: set[str]) -> None:
        """Called by grt_titan's checkpointer before a load with the checkpoint's dataloader keys."""
        degree = len([k for k in keys if k.startswith("dp_rank_")])
        self._legacy_keys = STATE_KEY not in keys and degree > 0
        if self._legacy_keys and degree != self.dp_world_size:
            self._legacy_keys = False
            raise ValueError(
                f"[parallelism] data-parallel degree {self.dp_world_size}: the checkpoint holds the "
                f"data position per data-parallel rank (torchtitan's format, {degree} ranks), which "
                f"loads only at that degree; allowed: data-parallel degree {degree}, or "
                "--checkpoint.exclude_from_loading dataloader (the data then starts over)"
            )

    def load_state_dict(self, state_dict: dict) -> None:
        if not state_dict:
            return
        if self._legacy_keys:
            self._legacy_keys = False
            assert state_dict["world_size"] == self.dp_world_size, "checked in select_saved_state"
            state = pickle.loads(state_dict[self._rank_id])  # torchdata's: samples this rank drew
            main = state.get("_snapshot", {}).get("_main_snapshot", state)  # num_workers > 0 / 0
            self.dataset.start = int(main["_sampler_iter_state"]["samples_yielded"]) * self.dp_world_size
            return
        saved = json.loads(state_dict[STATE_KEY])
        ds, problems = self.dataset, []
        for key, now, where in (
            ("num_sequences", ds.num_sequences, "[training] dataset"),
            ("seq_len", ds.seq_len, "[training] seq_len"),
            ("seed", ds.seed, "[data] seed"),
            ("shuffle", ds.shuffle, "[data] shuffle"),
        ):
            if saved[key] != now:
                problems.append(f"{where}: {key} = {now!r}, saved {saved[key]!r}")
        if problems:
            raise ValueError(
                "the checkpoint's data position belongs to another data order ("
                + "; ".join(problems)
                + "); allowed: the saved dataset, seq_len and [data] seed/shuffle, "
                "or --checkpoint.exclude_from_loading dataloader (the data then starts over)"
            )
        if saved["global_batch"] != self.global_batch and not self.allow_global_batch_change:
            raise ValueError(
                f"[training] global_batch_size: the checkpoint was saved with {saved['global_batch']} "
                f"sequences per step, this run takes {self.global_batch}; the step counter, LR schedule "
                "and depth sequence are counted in steps, so another global batch changes what they "
                "mean; allowed: the same global batch (local_batch_size x data-parallel degree x "
                "gradient accumulation), or [data] allow_global_batch_change = true (the data "
                f"continues at sequence position {saved['position']}, the schedule continues by step "
                "with the new number of sequences per step)"
            )
        ds.start = int(saved["position"])
        self.delivered = 0


def data_config(job_config) -> DataConfig:
    cfg = getattr(job_config, "data", None)
    return cfg if cfg is not None else DataConfig()


def resolve_dataset(dataset: str, dataset_path: str | None, tokenizer, data_cfg: DataConfig, section: str) -> Path:
    """The prepared dataset folder selected by ``[<section>] dataset`` / ``dataset_path``."""
    if dataset == default_corpus.NAME:
        return default_corpus.ensure_prepared(tokenizer, data_cfg, dataset_path)
    key, value = (f"[{section}] dataset_path", dataset_path) if dataset_path else (f"[{section}] dataset", dataset)
    if not value:
        raise ValueError(
            f"[{section}] dataset is empty; set it to {default_corpus.NAME!r} "
            "or to a folder made by `grt-titan prepare`"
        )
    try:
        return sh.find_manifest(value, key).parent
    except FileNotFoundError as e:
        raise FileNotFoundError(
            f"{e}. [{section}] dataset must be {default_corpus.NAME!r} (the embedded corpus) "
            "or a prepared dataset folder"
        ) from None


def open_dataset_split(
    dataset: str, dataset_path: str | None, split: str, tokenizer, data_cfg: DataConfig, section: str
) -> sh.SplitStream:
    root = resolve_dataset(dataset, dataset_path, tokenizer, data_cfg, section)
    manifest = sh.read_manifest(root / sh.MANIFEST_NAME)
    sha = getattr(tokenizer, "sha256", None)
    if sha is None:
        logger.warning(
            f"{type(tokenizer).__name__} has no sha256; cannot check that "
            f"{root} was prepared with it (vocabulary size checked only)"
        )
    return sh.open_split(root, manifest, split, sha, tokenizer.get_vocab_size(), getattr(tokenizer, "name", None))


def _build(
    stream: sh.SplitStream,
    dp_world_size: int,
    dp_rank: int,
    seq_len: int,
    batch_size: int,
    dataloader_cfg,
    seed: int,
    shuffle: bool,
    infinite: bool,
    global_batch: int,
    allow_global_batch_change: bool = False,
    long_records: str = "error",
    step_targets: bool = False,
    pack_records: bool = True,
) -> GlobalPositionDataloader:
    ds = TokenSequenceDataset(
        stream, seq_len, dp_rank, dp_world_size, seed, shuffle, long_records, step_targets, pack_records
    )
    packed = ""
    if stream.record_starts is not None:
        how = "packed whole" if pack_records else "one per sequence"
        packed = f" (prompt/completion records {how}, loss on completions; {ds.dropped_records} dropped as longer than seq_len)"
        if step_targets:
            packed += f", per-step targets of {len(stream.steps)} steps ([grt] step_supervision)"
    logger.info(
        f"Data {stream.dataset_dir} [{stream.split}]: {stream.num_tokens:,} tokens, "
        f"{ds.num_sequences:,} sequences of {seq_len}{packed}, {ds.per_rank:,} per dp rank "
        f"({dp_world_size} ranks), shuffle={shuffle} seed={seed}"
    )
    kwargs = {**asdict(dataloader_cfg), "batch_size": batch_size}
    return GlobalPositionDataloader(
        ds,
        dp_rank=dp_rank,
        dp_world_size=dp_world_size,
        global_batch=global_batch,
        allow_global_batch_change=allow_global_batch_change,
        sampler=SampleCounter(None if infinite else ds.per_rank),
        **kwargs,
    )


def build_dataloader(dp_world_size: int, dp_rank: int, tokenizer, job_config, infinite: bool = True) -> BaseDataLoader:
    """The train spec's ``build_dataloader_fn``: the ``train`` split of ``[training] dataset``.

    Yields ``({"input": LongTensor[B, S]}, labels LongTensor[B, S])`` (with ``[grt]
    step_supervision``, also ``"step_labels": LongTensor[B, S, K]``, the model's
    ``step_labels``) with
    B = ``training.local_batch_size``, S = ``training.seq_len``; shuffled per epoch from
    ``[data] seed``; ``infinite`` loops over epochs (False: one epoch, last batch partial).
    """
    t, cfg = job_config.training, data_config(job_config)
    stream = open_dataset_split(t.dataset, t.dataset_path, "train", tokenizer, cfg, "training")
    global_batch = t.global_batch_size if t.global_batch_size > 0 else t.local_batch_size * dp_world_size
    return _build(
        stream,
        dp_world_size,
        dp_rank,
        t.seq_len,
        t.local_batch_size,
        t.dataloader,
        cfg.seed,
        cfg.shuffle,
        infinite,
        global_batch,
        cfg.allow_global_batch_change,
        cfg.long_records,
        step_targets=getattr(getattr(job_config, "grt", None), "step_supervision", None) is True,
        pack_records=cfg.pack_records,
    )


def build_validation_dataloader(
    dp_world_size: int, dp_rank: int, tokenizer, job_config, infinite: bool = False
) -> BaseDataLoader:
    """The ``val`` split of ``[validation] dataset``, in stream order (the same every run).

    Each ``iter()`` starts again at the split's first sequence, so every validation pass
    scores the same sequences; ``infinite`` wraps around at the end of the split.
    """
    v, cfg = job_config.validation, data_config(job_config)
    stream = open_dataset_split(v.dataset, v.dataset_path, "val", tokenizer, cfg, "validation")
    return _build(
        stream,
        dp_world_size,
        dp_rank,
        v.seq_len,
        v.local_batch_size,
        v.dataloader,
        cfg.seed,
        False,
        infinite,
        v.local_batch_size * dp_world_size,
        long_records=cfg.long_records,
        pack_records=cfg.pack_records,
    )
