"""Write a folder or a file all-or-nothing: build it beside its destination, then rename it in place."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_directory(out: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield an empty temporary folder beside `out`; publish it as `out` on success.

    On any error (or interrupt) the temporary folder is removed and `out` is untouched, so
    no half-written output is ever left behind. An existing `out` is replaced only with
    `overwrite`, and only once the new folder is complete.
    """
    out = Path(out)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
        old = None
        if out.exists():
            if not overwrite:
                raise FileExistsError(f"{str(out)!r} appeared while it was being written; not replaced")
            old = out.parent / f".{out.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write `text` to a temporary file beside `path`, then rename it onto `path`: a reader
    sees the old file or the whole new one, never part of it."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
