"""Token shard files and their manifest: writing (prepare) and checked reading (loader).

A prepared dataset is a folder::

    manifest.json
    train_000000.bin  train_000001.bin ...   raw little-endian uint16 (uint32 above 65,536 ids)
    val_000000.bin ...
    (prompt/completion records also: *.mask.bin, {split}_records.bin, {split}_meta.jsonl,
    and *.step{t}.bin, one stream per step target; docs/data.md)

Each split is one token stream cut into shards of ``shard_tokens`` tokens (the last one
shorter); every document is followed by the end-of-text token, and documents run across
shard boundaries. The manifest (format below, docs/data.md) records per shard its token
count, sha256 and largest id, so a truncated or foreign shard is caught before training.
"""

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MANIFEST_NAME = "manifest.json"
FORMAT_NAME = "grt_titan.token_shards"
FORMAT_VERSION = 1
SPLITS = ("train", "val")
RECORDS_KIND = "prompt_completion"  # manifest "kind" of prompt/completion records (records.py)
MASK_DTYPE = np.dtype("<u1")  # prompt/completion data's loss mask: 1 = the token is a label


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (GPT-2: 50,257 tokens), else uint32."""
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


class ShardWriter:
    """Appends one split's token stream to ``{split}_{k:06d}.bin`` files in ``out_dir``."""

    def __init__(self, out_dir: Path, split: str, shard_tokens: int, dtype: np.dtype, suffix: str = ".bin"):
        self.out_dir, self.split, self.suffix = out_dir, split, suffix
        self.shard_tokens, self.dtype = shard_tokens, dtype
        self.shards: list[dict[str, Any]] = []
        self.documents = 0
        self.tokens = 0
        self._f = None

    def _open_next(self) -> None:
        name = f"{self.split}_{len(self.shards):06d}{self.suffix}"
        self._f = open(self.out_dir / name, "wb")
        self._hash = hashlib.sha256()
        self.shards.append({"file": name, "tokens": 0, "max_token_id": 0})

    def write(self, tokens: np.ndarray) -> None:
        tokens = tokens.astype(self.dtype, copy=False)
        while tokens.size:
            if self._f is None or self.shards[-1]["tokens"] == self.shard_tokens:
                self._close_current()
                self._open_next()
            shard = self.shards[-1]
            part = tokens[: self.shard_tokens - shard["tokens"]]
            data = part.tobytes()
            self._f.write(data)
            self._hash.update(data)
            shard["tokens"] += int(part.size)
            shard["max_token_id"] = max(shard["max_token_id"], int(part.max()))
            self.tokens += int(part.size)
            tokens = tokens[part.size :]

    def _close_current(self) -> None:
        if self._f is not None:
            self._f.close()
            self.shards[-1]["sha256"] = self._hash.hexdigest()
            self._f = None

    def close(self) -> dict[str, Any]:
        self._close_current()
        return {"documents": self.documents, "tokens": self.tokens, "shards": self.shards}


def write_manifest(out_dir: Path, manifest: dict[str, Any]) -> None:
    with open(out_dir / MANIFEST_NAME, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.write("\n")


def find_manifest(path: str | os.PathLike, what: str) -> Path:
    """The manifest.json of a prepared dataset folder (or the manifest file itself)."""
    p = Path(path)
    if p.is_file() and p.name == MANIFEST_NAME:
        return p
    if not p.exists():
        raise FileNotFoundError(f"{what} = {str(p)!r}: no such file or directory")
    if not (p / MANIFEST_NAME).is_file():
        raise FileNotFoundError(
            f"{what} = {str(p)!r}: not a prepared dataset ({MANIFEST_NAME} missing); "
            "make one with `grt-titan prepare INPUT... --out DIR` (docs/data.md)"
        )
    return p / MANIFEST_NAME


def read_manifest(manifest_path: Path) -> dict[str, Any]:
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{manifest_path}: not valid JSON ({e})") from e
    if manifest.get("format") != FORMAT_NAME or manifest.get("version") != FORMAT_VERSION:
        raise ValueError(
            f"{manifest_path}: format {manifest.get('format')!r} version "
            f"{manifest.get('version')!r}; expected {FORMAT_NAME!r} version {FORMAT_VERSION}"
        )
    return manifest


@dataclass
class SplitStream:
    """One split of a prepared dataset, memory-mapped lazily, as one token stream."""

    dataset_dir: Path
    split: str
    files: list[str]
    shard_tokens: list[int]
    dtype: np.dtype
    vocab_size: int
    # Prompt/completion data (records.py): the loss mask as a stream of its own, each
    # record's first token offset (and the end), and the records' metadata file.
    mask: "SplitStream | None" = None
    record_starts: np.ndarray | None = None
    meta_file: str | None = None
    # Per-step targets (records with `steps`): stream t is the tokens with each completion
    # replaced by its step t + 1 target; `no_steps` says why a records split has none.
    steps: "list[SplitStream] | None" = None
    no_steps: str | None = None

    def __post_init__(self):
        self.offsets = np.concatenate([[0], np.cumsum(self.shard_tokens, dtype=np.int64)])
        self.num_tokens = int(self.offsets[-1])
        self._maps: list[np.memmap] | None = None

    def __getstate__(self):  # memmaps are reopened in each dataloader worker
        return {**self.__dict__, "_maps": None}

    def _mmaps(self) -> list[np.memmap]:
        if self._maps is None:
            self._maps = [
                np.memmap(self.dataset_dir / f, dtype=self.dtype, mode="r", shape=(n,))
                if n
                else np.zeros(0, self.dtype)
                for f, n in zip(self.files, self.shard_tokens)
            ]
        return self._maps

    def read(self, start: int, length: int) -> np.ndarray:
        """Tokens [start, start + length) as int64; ids >= vocab size raise ValueError."""
        assert 0 <= start and start + length <= self.num_tokens, (start, length)
        maps = self._mmaps()
        k = int(np.searchsorted(self.offsets, start, side="right")) - 1
        parts, pos, end = [], start, start + length
        while pos < end:
            lo = pos - int(self.offsets[k])
            hi = min(end, int(self.offsets[k + 1])) - int(self.offsets[k])
            part = maps[k][lo:hi]
            if part.size and int(part.max()) >= self.vocab_size:
                bad = int(np.argmax(part >= self.vocab_size))
                raise ValueError(
                    f"{self.dataset_dir / self.files[k]}: token id {int(part[bad])} at "
                    f"position {lo + bad} is >= the vocabulary size {self.vocab_size}"
                )
            parts.append(part)
            pos += hi - lo
            k += 1
        return np.concatenate(parts).astype(np.int64)


def open_split(
    dataset_dir: Path,
    manifest: dict[str, Any],
    split: str,
    tokenizer_sha256: str | None,
    vocab_size: int,
    tokenizer_name: str | None = None,
) -> SplitStream:
    """Checks a split against the manifest and the tokenizer in use (its sha256 and name),
    then opens it.

    Raises:
        ValueError: other tokenizer, ids beyond the vocabulary, unknown split.
        FileNotFoundError: a shard file is missing.
        ValueError: a shard file's size disagrees with the manifest (truncated).
    """
    manifest_path = dataset_dir / MANIFEST_NAME
    tok = manifest["tokenizer"]
    if tokenizer_sha256 is not None and tok["sha256"] != tokenizer_sha256:
        sha = f"sha256 {tokenizer_sha256[:12]}..."
        in_use = f"is {tokenizer_name!r} ({sha})" if tokenizer_name else f"has {sha}"
        raise ValueError(
            f"{manifest_path}: prepared with tokenizer {tok['name']!r} (sha256 "
            f"{tok['sha256'][:12]}...), but the tokenizer in use {in_use}; prepare the data "
            "again with this tokenizer or select the matching one with [model] hf_assets_path"
        )
    if tok["vocab_size"] > vocab_size:
        raise ValueError(
            f"{manifest_path}: vocabulary of {tok['vocab_size']} tokens exceeds the tokenizer's {vocab_size}"
        )
    if split not in manifest["splits"]:
        raise ValueError(f"{manifest_path}: no split {split!r}; it has {sorted(manifest['splits'])}")
    dtype = np.dtype(manifest["dtype"]).newbyteorder("<")
    info = manifest["splits"][split]
    files, counts = _checked_shards(dataset_dir, manifest_path, info["shards"], dtype, vocab_size)
    stream = SplitStream(dataset_dir, split, files, counts, dtype, vocab_size)
    if manifest.get("kind") == RECORDS_KIND:
        _attach_records(stream, manifest_path, info, manifest.get("step_targets_unaligned"))
    return stream


def _checked_shards(
    dataset_dir: Path, manifest_path: Path, shards: list[dict], dtype: np.dtype, vocab_size: int
) -> tuple[list[str], list[int]]:
    files, counts = [], []
    for shard in shards:
        path = dataset_dir / shard["file"]
        if shard["max_token_id"] >= vocab_size:
            raise ValueError(
                f"{path}: holds token id {shard['max_token_id']} >= the vocabulary size "
                f"{vocab_size} (manifest max_token_id)"
            )
        if not path.is_file():
            raise FileNotFoundError(f"{path}: shard listed in {manifest_path} is missing")
        size, expected = path.stat().st_size, shard["tokens"] * dtype.itemsize
        if size != expected:
            raise ValueError(
                f"{path}: {size} bytes, but {manifest_path} lists {shard['tokens']} "
                f"{dtype.name} tokens ({expected} bytes); the shard is truncated or was "
                "rewritten, prepare the dataset again"
            )
        files.append(shard["file"])
        counts.append(shard["tokens"])
    return files, counts


def _attach_records(stream: SplitStream, manifest_path: Path, info: dict, unaligned: str | None) -> None:
    """The loss-mask shards and the record index of a prompt/completion split, checked
    against the token stream."""
    files, counts = _checked_shards(stream.dataset_dir, manifest_path, info["mask_shards"], MASK_DTYPE, 2)
    stream.mask = SplitStream(stream.dataset_dir, stream.split, files, counts, MASK_DTYPE, 2)
    path = stream.dataset_dir / info["records_file"]
    if not path.is_file():
        raise FileNotFoundError(f"{path}: record index listed in {manifest_path} is missing")
    starts = np.fromfile(path, dtype="<i8")
    if starts.size != info["records"] + 1 or starts[0] != 0 or starts[-1] != stream.num_tokens:
        raise ValueError(
            f"{path}: {starts.size - 1} records ending at token {int(starts[-1]) if starts.size else 0}, but "
            f"{manifest_path} lists {info['records']} records over {stream.num_tokens} tokens; prepare the dataset again"
        )
    if stream.mask.num_tokens != stream.num_tokens:
        raise ValueError(f"{manifest_path}: split {stream.split!r} has a loss mask of another length than its tokens")
    stream.record_starts = starts
    stream.meta_file = info["meta_file"]
    stream.steps = []
    for step_shards in info.get("step_shards", []):
        files, counts = _checked_shards(stream.dataset_dir, manifest_path, step_shards, stream.dtype, stream.vocab_size)
        stream.steps.append(
            SplitStream(stream.dataset_dir, stream.split, files, counts, stream.dtype, stream.vocab_size)
        )
        if stream.steps[-1].num_tokens != stream.num_tokens:
            raise ValueError(
                f"{manifest_path}: split {stream.split!r} has step targets of another length than its tokens"
            )
    if unaligned:
        stream.no_steps = f"{manifest_path}: its records' steps do not align with their completions ({unaligned})"
    elif not stream.steps:
        stream.no_steps = f"{manifest_path}: its records have no 'steps' (or it was prepared before step targets were)"
