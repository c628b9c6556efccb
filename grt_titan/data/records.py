"""Prompt/completion records for `grt-titan prepare`: supervised fine-tuning data whose loss
counts the completion only (docs/data.md, "Prompt/completion data").

A JSONL input whose first record has string fields ``prompt`` and ``completion`` is read as
records instead of documents. Each record becomes ``prefix + prompt + completion + suffix``
(the tokenizer's document specials: GPT-2 ``[] ... [eos]``, Llama 3 ``[bos] ... [eos]``) and
a loss mask, 1 on the completion and the end token, 0 on the prefix and the prompt. Optional
fields ``depth`` (an int >= 1) and ``steps`` (``depth`` strings: the intermediate targets of
a multi-step task) are kept as metadata, one JSON line per record in ``{split}_meta.jsonl``,
with the record's source (``where``: file:line). Records are validated before anything is
written: the first bad one stops `prepare` with its file, line and field.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from grt_titan.data.sources import _open_bytes

PROMPT, COMPLETION = "prompt", "completion"
META_FIELDS = ("depth", "steps")
KIND = "prompt_completion"


@dataclass
class Record:
    prompt: str
    completion: str
    where: str
    meta: dict = field(default_factory=dict)


def is_record_file(kind: str, path: Path) -> bool:
    """A JSONL input whose first non-blank line is an object with ``prompt`` and ``completion``."""
    if kind != "jsonl":
        return False
    with _open_bytes(path) as f:
        for line in f:
            if line.strip():
                try:
                    obj = json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    return False
                return isinstance(obj, dict) and PROMPT in obj and COMPLETION in obj
    return False


def check_record(obj, where: str) -> Record:
    """The record of one JSONL line, or ValueError naming the line and the field."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: a record must be a JSON object, got {type(obj).__name__}")
    for name in (PROMPT, COMPLETION):
        if name not in obj:
            raise ValueError(f"{where}: field {name!r} is missing (found {sorted(obj)})")
        value = obj[name]
        if not isinstance(value, str):
            raise ValueError(f"{where}: field {name!r} is {type(value).__name__}; allowed: a non-empty string")
        if not value:
            raise ValueError(f"{where}: field {name!r} is empty; allowed: a non-empty string")
    meta = {}
    if "depth" in obj:
        depth = obj["depth"]
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"{where}: field 'depth' is {depth!r}; allowed: an integer >= 1")
        meta["depth"] = depth
    if "steps" in obj:
        steps = obj["steps"]
        if not isinstance(steps, list) or not all(isinstance(s, str) and s for s in steps):
            raise ValueError(f"{where}: field 'steps' must be a list of non-empty strings")
        if "depth" in meta and len(steps) != meta["depth"]:
            raise ValueError(
                f"{where}: field 'steps' has {len(steps)} targets but 'depth' is {meta['depth']}; "
                "allowed: one target per step"
            )
        meta["steps"] = steps
    return Record(obj[PROMPT], obj[COMPLETION], where, meta)


def read_records(paths: list[Path]) -> Iterator[Record]:
    """Every record of the JSONL files, in order; blank lines skipped."""
    for path in paths:
        with _open_bytes(path) as f:
            for lineno, line in enumerate(f, start=1):
                where = f"{path}:{lineno}"
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line.decode("utf-8"))
                except UnicodeDecodeError as e:
                    raise ValueError(f"{where}: invalid UTF-8 (byte offset {e.start})") from None
                except json.JSONDecodeError as e:
                    raise ValueError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
                yield check_record(obj, where)


def ordinary_batch(tokenizer, texts: list[str]) -> list[list[int]]:
    """The ids of each text alone (no special token added, none recognised in it): tiktoken's
    encoder text by text (its batch encoder's thread per text costs more than short records),
    the `tokenizers` library's batch encoder."""
    if hasattr(tokenizer, "encoding"):  # GPT2Tokenizer (tiktoken)
        encode = tokenizer.encoding.encode_ordinary
        return [encode(text) for text in texts]
    if hasattr(tokenizer, "encode_ordinary") and hasattr(tokenizer, "tokenizer"):  # HFTokenizer
        return [e.ids for e in tokenizer.tokenizer.encode_batch(texts, add_special_tokens=False)]
    return [tokenizer.encode(text) for text in texts]


def encode_records(
    tokenizer, batch: list[Record], prefix: list[int], suffix: list[int]
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """(token ids, loss mask, tokens per record) of records laid end to end: each is prefix +
    prompt + completion + suffix, the mask 1 on the completion and the suffix. Prompt and
    completion are encoded apart, so the boundary is where the record puts it."""
    prompts = ordinary_batch(tokenizer, [r.prompt for r in batch])
    completions = ordinary_batch(tokenizer, [r.completion for r in batch])
    ids, mask, lengths = [], [], []
    for prompt, completion in zip(prompts, completions):
        head, tail = len(prefix) + len(prompt), len(completion) + len(suffix)
        ids += [*prefix, *prompt, *completion, *suffix]
        mask += [0] * head + [1] * tail
        lengths.append(head + tail)
    return np.array(ids, dtype=np.int64), np.array(mask, dtype=np.uint8), lengths


class RecordIndex:
    """One split's record starts (token offsets) and metadata lines, written at close."""

    def __init__(self, out_dir: Path, split: str):
        self.out_dir, self.split = out_dir, split
        self.starts = [0]
        self.meta = open(out_dir / f"{split}_meta.jsonl", "w", encoding="utf-8")

    def add(self, batch: list[Record], lengths: list[int]) -> None:
        for record, tokens in zip(batch, lengths):
            self.starts.append(self.starts[-1] + tokens)
        self.meta.write("".join(json.dumps({"where": r.where, **r.meta}, sort_keys=True) + "\n" for r in batch))

    def close(self) -> dict:
        self.meta.close()
        name = f"{self.split}_records.bin"
        np.asarray(self.starts, dtype="<i8").tofile(self.out_dir / name)
        return {"records": len(self.starts) - 1, "records_file": name, "meta_file": self.meta.name.split("/")[-1]}


def pack(starts: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Greedy in-order packing of whole records into sequences of at most ``capacity``
    tokens: (sequence start, sequence end) token offsets, and the records that did not fit
    in any (longer than ``capacity``), which are left out."""
    lengths = np.diff(starts)
    seq_starts, seq_ends, too_long = [], [], []
    open_at, used = None, 0
    for i, length in enumerate(lengths.tolist()):
        if length > capacity:
            too_long.append(i)
            continue
        if open_at is not None and used + length > capacity:
            seq_starts.append(open_at)
            seq_ends.append(open_at + used)
            open_at = None
        if open_at is None:
            open_at, used = int(starts[i]), 0
        elif int(starts[i]) != open_at + used:  # a dropped record in between: start afresh
            seq_starts.append(open_at)
            seq_ends.append(open_at + used)
            open_at, used = int(starts[i]), 0
        used += length
    if open_at is not None:
        seq_starts.append(open_at)
        seq_ends.append(open_at + used)
    return np.array(seq_starts, np.int64), np.array(seq_ends, np.int64), np.array(too_long, np.int64)


def record_source(dataset_dir: Path, meta_file: str, index: int) -> str:
    """The ``where`` (file:line) of record ``index`` of a split, for error messages."""
    with open(dataset_dir / meta_file, encoding="utf-8") as f:
        for k, line in enumerate(f):
            if k == index:
                return json.loads(line).get("where", f"record {index}")
    return f"record {index}"
