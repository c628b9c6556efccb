"""Input readers for `grt-titan prepare`: documents from .txt, .jsonl, .parquet, HF datasets.

Every reader yields ``(text, where)`` per document in a fixed order (files sorted by path,
rows in file order), so the same inputs always give the same token stream. ``text`` is
None for a document that is not valid UTF-8 (the caller skips or fails, by flag).
"""

import gzip
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TEXT_SUFFIXES = (".txt", ".txt.gz")
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz")
PARQUET_SUFFIXES = (".parquet",)
SUPPORTED = TEXT_SUFFIXES + JSONL_SUFFIXES + PARQUET_SUFFIXES
_ALLOWED = ", ".join(SUPPORTED) + ", a `datasets` save_to_disk folder, or a folder of these"


class InvalidUTF8(Exception):
    """A document is not valid UTF-8; ``where`` names the file (and line/row)."""

    def __init__(self, where: str, detail: str):
        super().__init__(f"{where}: invalid UTF-8 ({detail})")
        self.where = where


def _is_hf_dataset_dir(p: Path) -> bool:
    return (p / "dataset_dict.json").is_file() or ((p / "state.json").is_file() and (p / "dataset_info.json").is_file())


def _kind(p: Path) -> str | None:
    name = p.name.lower()
    for kind, suffixes in (("txt", TEXT_SUFFIXES), ("jsonl", JSONL_SUFFIXES), ("parquet", PARQUET_SUFFIXES)):
        if name.endswith(suffixes):
            return kind
    return None


def collect_inputs(paths: list[str | os.PathLike]) -> list[tuple[str, Path]]:
    """Expands the given paths into ``(kind, path)`` inputs, folders recursively and sorted.

    Raises:
        FileNotFoundError: a path does not exist.
        ValueError: a file of an unsupported type, or a folder with no inputs in it.
    """
    out: list[tuple[str, Path]] = []
    if not paths:
        raise ValueError("no input given; pass one or more of: " + _ALLOWED)
    for given in paths:
        p = Path(given)
        if not p.exists():
            raise FileNotFoundError(f"input {str(p)!r}: no such file or directory")
        if p.is_dir():
            found = _walk(p)
            if not found:
                raise ValueError(f"input folder {str(p)!r} holds no inputs ({_ALLOWED})")
            out.extend(found)
        elif _kind(p) is None:
            raise ValueError(f"input {str(p)!r}: unsupported file type; allowed: {_ALLOWED}")
        else:
            out.append((_kind(p), p))
    return out


def _walk(root: Path) -> list[tuple[str, Path]]:
    if _is_hf_dataset_dir(root):
        return [("hf", root)]
    found = []
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            found.extend(_walk(entry))
        elif _kind(entry) is not None:
            found.append((_kind(entry), entry))
    return found


def _open_bytes(path: Path):
    return gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")


def _decode(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidUTF8(where, f"byte offset {e.start}: {e.reason}") from None


def read_txt(path: Path) -> Iterator[tuple[str | None, str]]:
    """A .txt file is one document, read whole; a leading UTF-8 BOM is dropped."""
    with _open_bytes(path) as f:
        data = f.read()
    try:
        text = _decode(data, str(path))
    except InvalidUTF8 as e:
        yield None, e.args[0]
        return
    yield text.removeprefix("\ufeff"), str(path)


def jsonl_values(path: Path) -> Iterator[tuple[Any, str]]:
    """(value, "file:line") of each non-blank line of a JSONL file, in order. A line that is
    not UTF-8 gives an ``InvalidUTF8`` as its value (the caller skips or fails); a line that
    is not JSON raises ValueError naming it."""
    with _open_bytes(path) as f:
        for lineno, line in enumerate(f, start=1):
            where = f"{path}:{lineno}"
            if not line.strip():
                continue
            try:
                text = _decode(line, where)
            except InvalidUTF8 as e:
                yield e, where
                continue
            try:
                value = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
            yield value, where


def read_jsonl(path: Path, text_field: str) -> Iterator[tuple[str | None, str]]:
    """One JSON object per line; ``text_field`` holds the document; blank lines skipped."""
    for obj, where in jsonl_values(path):
        if isinstance(obj, InvalidUTF8):
            yield None, obj.args[0]
            continue
        if not isinstance(obj, dict) or text_field not in obj:
            keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
            raise ValueError(
                f"{where}: no text field {text_field!r} (found {keys}); choose the field with --text-field"
            )
        text = obj[text_field]
        if text is None:
            text = ""
        if not isinstance(text, str):
            raise ValueError(f"{where}: field {text_field!r} is {type(text).__name__}, expected a string")
        if not text.isascii():
            try:  # "\ud800" escapes decode to lone surrogates: not valid UTF-8 text
                text.encode("utf-8")
            except UnicodeEncodeError as e:
                yield None, f"{where}: invalid UTF-8 (lone surrogate at char {e.start})"
                continue
        yield text, where


def _arrow_texts(batches, text_field: str, path: Path) -> Iterator[tuple[str | None, str]]:
    import pyarrow as pa

    row = 0
    for batch in batches:
        if text_field not in batch.schema.names:
            raise ValueError(
                f"{path}: no column {text_field!r} (found {batch.schema.names}); choose the column with --text-field"
            )
        col = batch.column(text_field)
        if not (
            pa.types.is_string(col.type)
            or pa.types.is_large_string(col.type)
            or pa.types.is_binary(col.type)
            or pa.types.is_large_binary(col.type)
        ):
            raise ValueError(f"{path}: column {text_field!r} is {col.type}, expected strings")
        # Decode ourselves, so one bad row is one skipped document, not a failed batch.
        for data in col.cast(pa.large_binary()).to_pylist():
            where = f"{path} row {row}"
            row += 1
            if data is None:
                yield "", where
                continue
            try:
                yield _decode(data, where), where
            except InvalidUTF8 as e:
                yield None, e.args[0]


def read_parquet(path: Path, text_field: str) -> Iterator[tuple[str | None, str]]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises ArrowInvalid/OSError for non-parquet files
        raise ValueError(f"{path}: not a readable parquet file ({e})") from None
    if text_field not in pf.schema_arrow.names:
        raise ValueError(
            f"{path}: no column {text_field!r} (found {pf.schema_arrow.names}); choose the column with --text-field"
        )
    yield from _arrow_texts(pf.iter_batches(batch_size=1024, columns=[text_field]), text_field, path)


def read_hf_dataset(path: Path, text_field: str) -> Iterator[tuple[str | None, str]]:
    """A `datasets` save_to_disk folder: a Dataset, or a DatasetDict (all splits, by name)."""
    import pyarrow as pa

    if (path / "dataset_dict.json").is_file():
        with open(path / "dataset_dict.json") as f:
            splits = json.load(f).get("splits", [])
        for split in sorted(splits):
            yield from read_hf_dataset(path / split, text_field)
        return
    with open(path / "state.json") as f:
        state = json.load(f)
    files = [d["filename"] for d in state.get("_data_files", [])]
    if not files:
        raise ValueError(f"{path}/state.json: lists no _data_files")
    for name in files:
        with pa.memory_map(str(path / name)) as source:
            try:
                reader = pa.ipc.open_stream(source)
            except pa.ArrowInvalid:
                reader = pa.ipc.open_file(source)
                reader = (reader.get_batch(i) for i in range(reader.num_record_batches))
            yield from _arrow_texts(reader, text_field, path / name)


def iter_documents(inputs: list[tuple[str, Path]], text_field: str) -> Iterator[tuple[str | None, str]]:
    readers = {
        "txt": lambda p: read_txt(p),
        "jsonl": lambda p: read_jsonl(p, text_field),
        "parquet": lambda p: read_parquet(p, text_field),
        "hf": lambda p: read_hf_dataset(p, text_field),
    }
    for kind, path in inputs:
        try:
            yield from readers[kind](path)
        except (EOFError, OSError) as e:  # truncated .gz, unreadable file
            raise ValueError(f"{path}: cannot read {kind} input ({e})") from e
