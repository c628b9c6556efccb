"""`grt-titan prepare INPUT... --out DIR`: tokenize local text into token shards.

Reads documents (see ``sources.py``), encodes them with the tokenizer (GPT-2 by default, or
``--tokenizer``: a ``.tiktoken`` file or a Hugging Face tokenizer folder) on all cores, and
writes one token stream per split (every document followed by EOS, and preceded by BOS for
a tokenizer that adds one, such as Llama 3's) as shard files plus ``manifest.json``
(``shards.py``). Everything is written into a temporary folder next to ``--out`` and
renamed at the end, so an error leaves nothing behind.

Deterministic: the same inputs and options give byte-identical shards whatever
``--workers`` is. Long documents are cut into pieces at a boundary where tokenization
cannot change, so that a single huge document still uses every core: for GPT-2's tiktoken
ranks a non-space character followed by a space or newline (no GPT-2 pre-tokenizer piece
spans it); for a Hugging Face tokenizer an ASCII letter or digit followed by a space or
newline, and only for the pre-tokenizers where that is proven (``HFTokenizer.cut_problem``:
GPT-2's, Llama 3's, Qwen's); other tokenizers encode each document whole.
"""

import argparse
import itertools
import multiprocessing as mp
import os
import re
import sys
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from grt_titan.data import records
from grt_titan.data import shards as sh
from grt_titan.data.sources import collect_inputs, iter_documents
from grt_titan.runtime.atomic_dir import atomic_directory

PIECE_CHARS = 1 << 20
"""Documents longer than this many characters are cut into pieces of about this size."""
TASK_CHARS = 1 << 20
"""Characters of text sent to a worker per task."""
DEFAULT_SHARD_TOKENS = 100_000_000
RECORDS_PER_BATCH = 4096
"""Prompt/completion records encoded and written per batch (one array and one write each)."""
DEFAULT_VAL_FRACTION = 0.005

# Unicode White_Space (what the tokenizer's regex \s means); Python's str \s differs.
_WS = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_CUT = re.compile(f"[^{_WS}][ \n]")
_HF_CUT = re.compile("[A-Za-z0-9][ \n]")
"""Where an HFTokenizer without a ``cut_problem`` may cut: ASCII letters and digits are
\\p{L} / \\p{N} in every Unicode version and never compose (NFC) with what follows."""

_ENC = None  # the worker's tokenizer


def split_long_text(text: str, piece_chars: int = PIECE_CHARS, cut: re.Pattern | None = _CUT) -> list[str]:
    """Cuts ``text`` into pieces whose separate encodings concatenate to its encoding, at
    matches of ``cut`` (after its first character); None: never cut."""
    if len(text) <= piece_chars or cut is None:
        return [text]
    pieces, pos = [], 0
    while len(text) - pos > piece_chars:
        m = cut.search(text, pos + piece_chars)
        if m is None:
            break
        pieces.append(text[pos : m.start() + 1])
        pos = m.start() + 1
    pieces.append(text[pos:])
    return pieces


def is_val_document(index: int, val_fraction: float) -> bool:
    """Document ``index`` goes to the validation split: an evenly spread, exact fraction."""
    return int((index + 1) * val_fraction + 0.5) > int(index * val_fraction + 0.5)


def _init_worker(tokenizer_path: str) -> None:
    global _ENC
    from grt_titan.tokenizer import load_tokenizer

    _ENC = load_tokenizer(tokenizer_path)


def document_specials(tokenizer) -> tuple[list[int], list[int]]:
    """The ids written before and after every document's text: ``([], [eos])`` for GPT-2;
    a Hugging Face tokenizer's ``document_prefix`` / ``document_suffix`` (what its
    ``encode(doc, add_eos=True)`` adds: Llama 3 ``([bos], [eos])``)."""
    return list(getattr(tokenizer, "document_prefix", [])), list(
        getattr(tokenizer, "document_suffix", [tokenizer.eos_id])
    )


def document_cut(tokenizer) -> re.Pattern | None:
    """Where long documents may be cut for ``tokenizer`` (None: nowhere)."""
    if not hasattr(tokenizer, "cut_problem"):  # GPT2Tokenizer
        return _CUT
    return _HF_CUT if tokenizer.cut_problem is None else None


def _encode_task(task: list[tuple[str, int, bool, bool]]) -> list[np.ndarray]:
    """Encodes ``(piece, split, starts_document, ends_document)`` items to one token array
    per split."""
    dtype = sh.dtype_for_vocab(_ENC.get_vocab_size())
    prefix, suffix = (np.array(ids, dtype) for ids in document_specials(_ENC))
    tiktoken_encoding = getattr(_ENC, "encoding", None)
    out: list[list[np.ndarray]] = [[] for _ in sh.SPLITS]
    for piece, split, starts_doc, ends_doc in task:
        if starts_doc and prefix.size:
            out[split].append(prefix)
        if tiktoken_encoding is not None:
            # == encode_ordinary (no special tokens allowed, none rejected), but straight
            # into a numpy buffer: no Python int per token.
            ids = tiktoken_encoding.encode_to_numpy(piece, allowed_special=set(), disallowed_special=())
            out[split].append(ids.astype(dtype))
        else:
            out[split].append(np.array(_ENC.encode_ordinary(piece), dtype))
        if ends_doc:
            out[split].append(suffix)
    return [np.concatenate(arrays) if arrays else np.zeros(0, dtype) for arrays in out]


class _Stats:
    def __init__(self):
        self.documents = 0
        self.invalid_utf8 = 0
        self.empty = 0
        self.first_invalid: list[str] = []


def _tasks(docs, val_fraction: float, invalid_utf8: str, stats: _Stats, writers, cut: re.Pattern | None):
    """Groups documents into tasks of about TASK_CHARS characters, in input order."""
    task, chars = [], 0
    for text, where in docs:
        if text is None:
            if invalid_utf8 == "error":
                raise ValueError(f"{where}; pass --invalid-utf8 skip to count and skip it")
            stats.invalid_utf8 += 1
            if len(stats.first_invalid) < 5:
                stats.first_invalid.append(where)
            continue
        if not text:
            stats.empty += 1
            continue
        split = int(is_val_document(stats.documents, val_fraction))
        stats.documents += 1
        writers[split].documents += 1
        pieces = split_long_text(text, cut=cut)
        for k, piece in enumerate(pieces):
            task.append((piece, split, k == 0, k == len(pieces) - 1))
            chars += len(piece)
            if chars >= TASK_CHARS:
                yield task
                task, chars = [], 0
    if task:
        yield task


def prepare(
    inputs: list[str | os.PathLike],
    out: str | os.PathLike,
    *,
    tokenizer_path: str | os.PathLike | None = None,
    text_field: str = "text",
    val_fraction: float = DEFAULT_VAL_FRACTION,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    workers: int | None = None,
    invalid_utf8: str = "error",
    overwrite: bool = False,
    progress: bool = True,
    input_labels: list[str] | None = None,
) -> dict[str, Any]:
    """Tokenizes ``inputs`` into a prepared dataset folder ``out``; returns its manifest.

    Args:
        inputs: Files or folders (.txt, .jsonl, .parquet, .gz of the first two, HF
            ``save_to_disk`` folders).
        out: Output folder; created atomically (temporary sibling, then rename).
        tokenizer_path: A ``.tiktoken`` file or a Hugging Face tokenizer folder (holding
            ``tokenizer.json``); None = the shipped GPT-2 ranks (``load_tokenizer``).
        text_field: JSON field / column holding the text.
        val_fraction: Share of documents (evenly spread) put in the ``val`` split.
        shard_tokens: Tokens per shard file (the last one of a split is shorter).
        workers: Tokenizer processes; None = all cores, 1 = in this process.
        invalid_utf8: ``"error"`` fails on the first invalid document, ``"skip"`` counts
            and skips such documents.
        overwrite: Replace an existing ``out``.
        progress: Show a tqdm bar with tokens/s on stderr.
        input_labels: Names recorded in the manifest instead of the input paths.

    Raises:
        FileNotFoundError: missing input.
        FileExistsError: ``out`` exists and ``overwrite`` is False.
        ValueError: unsupported/empty/invalid input or bad option values.
    """
    from grt_titan.tokenizer import load_tokenizer

    workers = _checked_options(val_fraction, shard_tokens, invalid_utf8, workers)
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"--out {str(out)!r} exists; pass --overwrite to replace it")
    sources = collect_inputs(inputs)
    tokenizer = load_tokenizer(tokenizer_path)
    dtype = sh.dtype_for_vocab(tokenizer.get_vocab_size())
    record_files = _record_files(sources)

    out.parent.mkdir(parents=True, exist_ok=True)
    if record_files:
        return _prepare_records(
            record_files, out, tokenizer, dtype, val_fraction, shard_tokens, overwrite, input_labels
        )
    with atomic_directory(out, overwrite) as tmp:
        writers = [sh.ShardWriter(tmp, s, shard_tokens, dtype) for s in sh.SPLITS]
        stats = _Stats()
        tasks = _tasks(
            iter_documents(sources, text_field), val_fraction, invalid_utf8, stats, writers, document_cut(tokenizer)
        )
        _run(tasks, writers, tokenizer, workers, progress)
        split_info = {w.split: w.close() for w in writers}
        if stats.documents == 0:
            raise ValueError(
                f"empty input: no text in {', '.join(map(str, inputs))} "
                f"({stats.empty} empty, {stats.invalid_utf8} invalid UTF-8 documents)"
            )
        if split_info["train"]["tokens"] == 0:
            raise ValueError(
                f"all {stats.documents} documents went to the val split; lower "
                f"--val-fraction ({val_fraction}) or add documents"
            )
        if stats.invalid_utf8:
            print(
                f"warning: skipped {stats.invalid_utf8} documents with invalid UTF-8, e.g. "
                + "; ".join(stats.first_invalid),
                file=sys.stderr,
            )
        manifest = _manifest(
            tokenizer,
            dtype,
            input_labels or [str(p) for p in inputs],
            val_fraction,
            shard_tokens,
            split_info,
            text_field=text_field,
            documents=stats.documents,
            skipped_documents={"invalid_utf8": stats.invalid_utf8, "empty": stats.empty},
        )
        sh.write_manifest(tmp, manifest)
    return manifest


def _checked_options(val_fraction: float, shard_tokens: int, invalid_utf8: str, workers: int | None) -> int:
    """ValueError naming a bad option; the number of workers (None: every core)."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"--val-fraction {val_fraction}: must be in [0, 1)")
    if shard_tokens < 1:
        raise ValueError(f"--shard-tokens {shard_tokens}: must be >= 1")
    if invalid_utf8 not in ("error", "skip"):
        raise ValueError(f"--invalid-utf8 {invalid_utf8!r}: allowed 'error', 'skip'")
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if workers < 1:
        raise ValueError(f"--workers {workers}: must be >= 1")
    return workers


def _record_files(sources: list[tuple[str, Path]]) -> list[Path]:
    """The inputs when they are all prompt/completion (or chat) records, [] when none is."""
    found = [path for kind, path in sources if records.is_record_file(kind, path)]
    if found and len(found) != len(sources):
        other = next(str(path) for _, path in sources if path not in found)
        raise ValueError(
            f"{other}: not prompt/completion records, but {found[0]} is; "
            "allowed: all inputs documents, or all inputs JSONL records with 'prompt' and 'completion'"
        )
    return found


def _prepare_records(
    paths, out, tokenizer, dtype, val_fraction, shard_tokens, overwrite, input_labels
) -> dict[str, Any]:
    """Prompt/completion records (records.py): tokens, a loss mask per token, the record
    index and metadata per split, and the per-step target streams of records with `steps`.
    Encoded in this process (records are short); a first pass checks every record and
    finds the most steps."""
    prefix, suffix = document_specials(tokenizer)
    max_steps = max((records.max_steps_of(r) for r in records.read_records(paths)), default=0)
    with atomic_directory(out, overwrite) as tmp:
        splits = [_RecordSplit(tmp, s, shard_tokens, dtype, max_steps) for s in sh.SPLITS]
        count = 0
        source = records.read_records(paths)
        while chunk := list(itertools.islice(source, RECORDS_PER_BATCH)):
            by_split: list[list] = [[], []]
            for record in chunk:
                by_split[int(is_val_document(count, val_fraction))].append(record)
                count += 1
            for split, batch in zip(splits, by_split):
                if batch:
                    split.add(records.encode_records(tokenizer, batch, prefix, suffix, max_steps), batch)
        unaligned = next((s.unaligned for s in splits if s.unaligned), None)
        split_info = {split.split: split.close(unaligned is None) for split in splits}
        if count == 0:
            raise ValueError(f"empty input: no record in {', '.join(map(str, paths))}")
        if split_info["train"]["records"] == 0:
            raise ValueError(f"all {count} records went to the val split; lower --val-fraction ({val_fraction})")
        steps = {"step_targets": max_steps} if max_steps and unaligned is None else {}
        if unaligned:
            steps = {"step_targets_unaligned": unaligned}
            print(f"warning: no per-step targets ([grt] step_supervision): {unaligned}", file=sys.stderr)
        manifest = _manifest(
            tokenizer,
            dtype,
            input_labels or [str(p) for p in paths],
            val_fraction,
            shard_tokens,
            split_info,
            kind=records.KIND,
            loss_mask="completion",
            documents=count,
            skipped_documents={"invalid_utf8": 0, "empty": 0},
            **steps,
        )
        sh.write_manifest(tmp, manifest)
    return manifest


class _RecordSplit:
    """One split's writers of prompt/completion data: tokens, loss mask, record index and
    one stream per step target (`{split}_{k}.step{t}.bin`, t = 1..max_steps)."""

    def __init__(self, out: Path, split: str, shard_tokens: int, dtype: np.dtype, max_steps: int):
        self.split, self.out = split, out
        self.tokens = sh.ShardWriter(out, split, shard_tokens, dtype)
        self.mask = sh.ShardWriter(out, split, shard_tokens, sh.MASK_DTYPE, suffix=".mask.bin")
        self.index = records.RecordIndex(out, split)
        self.steps = [
            sh.ShardWriter(out, split, shard_tokens, dtype, suffix=f".step{t}.bin") for t in range(1, max_steps + 1)
        ]
        self.unaligned: str | None = None

    def add(self, encoded: records.Encoded, batch: list) -> None:
        self.tokens.write(encoded.ids)
        self.tokens.documents += len(batch)
        self.mask.write(encoded.mask)
        self.index.add(batch, encoded.lengths)
        self.unaligned = self.unaligned or encoded.unaligned
        if self.unaligned is None:
            for t, writer in enumerate(self.steps):
                writer.write(encoded.steps[:, t])

    def close(self, keep_steps: bool) -> dict[str, Any]:
        info = self.tokens.close()
        info.update(self.index.close(), mask_shards=self.mask.close()["shards"])
        step_shards = [writer.close()["shards"] for writer in self.steps]
        if keep_steps and step_shards:
            info["step_shards"] = step_shards
        else:  # one record's steps did not align: no split keeps any
            for shard in (shard for shards in step_shards for shard in shards):
                (self.out / shard["file"]).unlink()
        return info


def _manifest(tokenizer, dtype, inputs, val_fraction, shard_tokens, splits, **fields) -> dict[str, Any]:
    """manifest.json (docs/data.md): what every prepared dataset records, then `fields`."""
    return {
        "format": sh.FORMAT_NAME,
        "version": sh.FORMAT_VERSION,
        "tokenizer": _tokenizer_record(tokenizer),
        "dtype": dtype.name,
        "document_separator": _document_separator(tokenizer),
        "inputs": inputs,
        "val_fraction": val_fraction,
        "shard_tokens": shard_tokens,
        "splits": splits,
        **fields,
    }


def _tokenizer_record(tokenizer) -> dict[str, Any]:
    record = {
        "name": tokenizer.name,
        "sha256": tokenizer.sha256,
        "vocab_size": tokenizer.get_vocab_size(),
        "eot_id": tokenizer.eos_id,
    }
    if hasattr(tokenizer, "document_prefix"):  # a Hugging Face tokenizer folder
        prefix, suffix = document_specials(tokenizer)
        record.update(kind="huggingface", bos_id=tokenizer.bos_id, document_prefix=prefix, document_suffix=suffix)
    return record


def _document_separator(tokenizer) -> str:
    prefix, suffix = document_specials(tokenizer)
    if prefix == [] and suffix == [tokenizer.eos_id]:
        return "eot_after_each_document"
    return "document_prefix_and_suffix"  # listed in the manifest's tokenizer record


def _run(tasks, writers, tokenizer, workers: int, progress: bool) -> None:
    from tqdm import tqdm

    global _ENC
    _ENC = tokenizer  # used in this process (workers == 1) and by forked workers

    bar = tqdm(
        unit="tok", unit_scale=True, disable=not progress, dynamic_ncols=True, desc="tokenizing", file=sys.stderr
    )

    def consume(arrays: list[np.ndarray]) -> None:
        for writer, arr in zip(writers, arrays):
            writer.write(arr)
        bar.update(sum(a.size for a in arrays))
        bar.set_postfix(docs=writers[0].documents + writers[1].documents, refresh=False)

    try:
        if workers == 1:
            for task in tasks:
                consume(_encode_task(task))
            return
        # fork: workers start in milliseconds and inherit the loaded tokenizer.
        if "fork" in mp.get_all_start_methods():
            ctx, init, init_args = mp.get_context("fork"), None, ()
        else:
            ctx, init, init_args = mp.get_context("spawn"), _init_worker, (str(tokenizer.path),)
        with ctx.Pool(workers, init, init_args) as pool:
            pending: deque = deque()
            for task in tasks:  # bounded in-flight tasks: memory stays O(workers)
                pending.append(pool.apply_async(_encode_task, (task,)))
                if len(pending) >= 2 * workers:
                    consume(pending.popleft().get())
            while pending:
                consume(pending.popleft().get())
    finally:
        bar.close()
        _ENC = None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="grt-titan prepare",
        description="Tokenize local text (GPT-2 BPE, or --tokenizer) into uint16 (uint32 for "
        "vocabularies over 65,536) token shards + manifest.json for grt_titan's loader. See docs/data.md.",
    )
    p.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help=".txt, .jsonl, .parquet (.txt.gz, .jsonl.gz), a `datasets` "
        "save_to_disk folder, or a folder of these (searched recursively)",
    )
    p.add_argument("--out", required=True, help="output folder (must not exist)")
    p.add_argument("--text-field", default="text", help="JSON field / column holding the text (default: text)")
    p.add_argument(
        "--val-fraction",
        type=float,
        default=DEFAULT_VAL_FRACTION,
        help=f"share of documents in the val split (default: {DEFAULT_VAL_FRACTION})",
    )
    p.add_argument(
        "--shard-tokens",
        type=int,
        default=DEFAULT_SHARD_TOKENS,
        help=f"tokens per shard file (default: {DEFAULT_SHARD_TOKENS:,})",
    )
    p.add_argument("--workers", type=int, default=None, help="tokenizer processes (default: all cores)")
    p.add_argument(
        "--tokenizer",
        default=None,
        metavar="FILE.tiktoken|HF_FOLDER",
        help="a tiktoken rank file, or a Hugging Face tokenizer folder holding tokenizer.json "
        "(default: the shipped GPT-2 ranks)",
    )
    p.add_argument(
        "--invalid-utf8",
        choices=("error", "skip"),
        default="error",
        help="on a document that is not valid UTF-8: fail (default) or count and skip it",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        manifest = prepare(
            args.inputs,
            args.out,
            tokenizer_path=args.tokenizer,
            text_field=args.text_field,
            val_fraction=args.val_fraction,
            shard_tokens=args.shard_tokens,
            workers=args.workers,
            invalid_utf8=args.invalid_utf8,
            overwrite=args.overwrite,
            progress=not args.no_progress,
        )
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        print(f"grt-titan prepare: error: {e}", file=sys.stderr)
        return 2
    s = manifest["splits"]
    kind = "prompt/completion records" if manifest.get("kind") == records.KIND else "documents"
    print(
        f"wrote {args.out}: {manifest['documents']} {kind}, "
        f"train {s['train']['tokens']:,} tokens in {len(s['train']['shards'])} shards, "
        f"val {s['val']['tokens']:,} tokens in {len(s['val']['shards'])} shards"
        + (f", per-step targets of {manifest['step_targets']} steps" if "step_targets" in manifest else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
