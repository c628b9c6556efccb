"""`grt_default`: the embedded corpus (Jane Austen's six novels), prepared on first use.

The text ships in ``grt_titan/assets/corpus/austen.jsonl.gz`` (one JSON document per
chapter; source and license in docs/data.md). The first run tokenizes it with the same
``prepare`` code as any corpus into ``<cache>/grt_default-<key>/``, where the key hashes
the corpus, the tokenizer and the options, so the debug run exercises the real data path.
Ranks that start together take a file lock; the output appears by an atomic rename, so a
racing rank without the lock (a file system without flock) cannot see it half-written.
"""

import hashlib
import json
import os
from pathlib import Path

from torchtitan.tools.logging import logger

from grt_titan.data import shards as sh
from grt_titan.data.config import DataConfig

NAME = "grt_default"
CORPUS_PATH = Path(__file__).resolve().parent.parent / "assets" / "corpus" / "austen.jsonl.gz"
CORPUS_SHA256 = "fd48be7efa6ae3d10c9b8125a40d56f7e00e03dc142fe15e0abbf68d613d5b3b"
SHARD_TOKENS = 1 << 20


def cache_root(data_cfg: DataConfig) -> Path:
    if data_cfg.cache_dir:
        return Path(data_cfg.cache_dir)
    if os.environ.get("GRT_TITAN_CACHE"):
        return Path(os.environ["GRT_TITAN_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "grt_titan"


def _key(tokenizer_sha256: str, val_fraction: float) -> str:
    blob = json.dumps([CORPUS_SHA256, tokenizer_sha256, sh.FORMAT_VERSION, val_fraction, SHARD_TOKENS])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def ensure_prepared(tokenizer, data_cfg: DataConfig, location: str | None = None) -> Path:
    """The prepared grt_default folder for ``tokenizer``, preparing it if needed.

    Args:
        tokenizer: A ``GPT2Tokenizer`` or ``HFTokenizer`` (its rank file or tokenizer folder
            is used to prepare the corpus).
        data_cfg: The ``[data]`` section (cache folder, val fraction).
        location: ``dataset_path`` from the TOML: use this folder instead of the cache.
    """
    path = getattr(tokenizer, "path", None)
    if path is None or getattr(tokenizer, "sha256", None) is None:
        raise ValueError(
            f"dataset {NAME!r} is tokenized with grt_titan's GPT2Tokenizer or HFTokenizer; got "
            f"{type(tokenizer).__name__} (use the `grt` train spec's build_tokenizer)"
        )
    if location:
        out = Path(location)
    else:
        key = _key(tokenizer.sha256, data_cfg.default_val_fraction)
        out = cache_root(data_cfg) / f"{NAME}-{key}"
    if (out / sh.MANIFEST_NAME).is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with _FileLock(out.parent / f".{out.name}.lock"):
        if (out / sh.MANIFEST_NAME).is_file():  # another rank prepared it meanwhile
            return out
        _check_corpus()
        from grt_titan.data.prepare import prepare

        logger.info(f"Preparing the embedded corpus {NAME} into {out} (once)")
        try:
            prepare(
                [CORPUS_PATH],
                out,
                tokenizer_path=path,
                val_fraction=data_cfg.default_val_fraction,
                shard_tokens=SHARD_TOKENS,
                progress=False,
                input_labels=[f"grt_titan/assets/corpus/{CORPUS_PATH.name}"],
            )
        except OSError:
            # Without a working lock another process may have renamed its copy first;
            # it is byte-identical, so use it.
            if not (out / sh.MANIFEST_NAME).is_file():
                raise
    return out


def _check_corpus() -> None:
    if not CORPUS_PATH.is_file():
        raise FileNotFoundError(f"embedded corpus missing: {CORPUS_PATH} (broken install?)")
    h = hashlib.sha256(CORPUS_PATH.read_bytes()).hexdigest()
    if h != CORPUS_SHA256:
        raise ValueError(f"{CORPUS_PATH}: sha256 {h} differs from the expected {CORPUS_SHA256}")


class _FileLock:
    """flock on a lock file; a no-op where the file system does not support it."""

    def __init__(self, path: Path):
        self.path, self.fd = path, None

    def __enter__(self):
        try:
            import fcntl

            self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except (ImportError, OSError):
            if self.fd is not None:
                os.close(self.fd)
            self.fd = None
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            import fcntl

            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
