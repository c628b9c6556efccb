"""GPT-2 BPE tokenizer (50,257 tokens) through tiktoken, with no network at run time.

The GPT-2 merge ranks ship in the package (``grt_titan/assets/gpt2.tiktoken``, taken from
the MIT-licensed openai-whisper sdist; see ``grt_titan/assets/README.md``), so building the
tokenizer never downloads anything. Another ``.tiktoken`` rank file can be used instead by
pointing ``[model] hf_assets_path`` at it (or at a folder holding exactly one); its
``<|endoftext|>`` id is then the number of ranks.
"""

import hashlib
import os
from binascii import a2b_base64
from pathlib import Path

import tiktoken
from torchtitan.components.tokenizer import BaseTokenizer
from torchtitan.tools.logging import logger

ASSETS_DIR = Path(__file__).resolve().parent / "assets"
GPT2_TIKTOKEN_PATH = ASSETS_DIR / "gpt2.tiktoken"
GPT2_TIKTOKEN_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
"""sha256 of the shipped rank file (openai-whisper 20250625, whisper/assets/gpt2.tiktoken)."""

# tiktoken's own "gpt2" definition (tiktoken_ext/openai_public.py).
GPT2_PAT_STR = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
ENDOFTEXT = "<|endoftext|>"
GPT2_VOCAB_SIZE = 50257


def _load_ranks(path: Path, data: bytes) -> dict[bytes, int]:
    ranks = {}
    for lineno, line in enumerate(data.splitlines(), start=1):
        if not line:
            continue
        try:
            token, rank = line.split()
            ranks[a2b_base64(token)] = int(rank)
        except ValueError as e:  # includes binascii.Error
            raise ValueError(f"{path}:{lineno}: not a tiktoken rank line ('<base64> <rank>'): {line[:80]!r}") from e
    if not ranks:
        raise ValueError(f"{path}: empty tiktoken rank file")
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"{path}: ranks are not the contiguous ids 0..{len(ranks) - 1}")
    return ranks


class GPT2Tokenizer(BaseTokenizer):
    """GPT-2 byte-level BPE with ``<|endoftext|>`` as EOS and no BOS.

    Args:
        tokenizer_path: A ``.tiktoken`` rank file. ``None`` uses the shipped GPT-2 file,
            whose sha256 is checked against ``GPT2_TIKTOKEN_SHA256``.
        expected_sha256: Checked against the file's sha256 when given (always checked for
            the shipped file).

    Attributes:
        name: ``"gpt2"`` for the GPT-2 ranks (whatever the path), else the file's stem.
        sha256: sha256 of the rank file; token shards record it (docs/data.md).
    """

    def __init__(self, tokenizer_path: str | os.PathLike | None = None, expected_sha256: str | None = None):
        super().__init__()
        path = Path(tokenizer_path) if tokenizer_path is not None else GPT2_TIKTOKEN_PATH
        if tokenizer_path is None:
            expected_sha256 = GPT2_TIKTOKEN_SHA256
        if not path.is_file():
            raise FileNotFoundError(f"tiktoken rank file not found: {path}")
        data = path.read_bytes()
        self.sha256 = hashlib.sha256(data).hexdigest()
        if expected_sha256 is not None and self.sha256 != expected_sha256:
            raise ValueError(
                f"{path}: sha256 {self.sha256} does not match the expected {expected_sha256}; "
                "the tokenizer file is corrupt or a different vocabulary"
            )
        ranks = _load_ranks(path, data)
        self.path = path
        self.name = "gpt2" if self.sha256 == GPT2_TIKTOKEN_SHA256 else path.stem
        self.eos_id = len(ranks)
        self.bos_id = None
        self._encoding = tiktoken.Encoding(
            name=self.name,
            pat_str=GPT2_PAT_STR,
            mergeable_ranks=ranks,
            special_tokens={ENDOFTEXT: self.eos_id},
            explicit_n_vocab=len(ranks) + 1,
        )

    @property
    def encoding(self) -> tiktoken.Encoding:
        return self._encoding

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Encodes ``text`` as ordinary text: a literal ``<|endoftext|>`` in it is not EOS.

        ``add_bos`` is accepted for torchtitan's interface and ignored: GPT-2 has no BOS.
        """
        ids = self._encoding.encode_ordinary(text)
        if add_eos:
            ids.append(self.eos_id)
        return ids

    def encode_batch(self, texts: list[str], num_threads: int = 8, add_eos: bool = False) -> list[list[int]]:
        """Encodes many texts on ``num_threads`` threads (tiktoken releases the GIL)."""
        out = self._encoding.encode_ordinary_batch(texts, num_threads=num_threads)
        if add_eos:
            for ids in out:
                ids.append(self.eos_id)
        return out

    def decode(self, ids, **kwargs) -> str:
        """Decodes ids (a list, tuple, numpy array or tensor) to text; bad UTF-8 -> U+FFFD."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        return self._encoding.decode(list(ids), **kwargs)

    def get_vocab_size(self) -> int:
        return self._encoding.n_vocab


def resolve_tokenizer_path(hf_assets_path: str | None) -> Path | None:
    """The ``.tiktoken`` file selected by ``[model] hf_assets_path``, or None (shipped GPT-2).

    A path ending in ``.tiktoken`` must exist. A folder is used only if it holds a
    ``.tiktoken`` file: ``gpt2.tiktoken`` if present, else the only one (several -> error).
    Anything else (torchtitan's default ``./tests/assets/tokenizer``, an HF tokenizer folder
    without ``.tiktoken`` files) selects the shipped GPT-2 ranks.
    """
    if not hf_assets_path:
        return None
    p = Path(hf_assets_path)
    if p.suffix == ".tiktoken":
        if not p.is_file():
            raise FileNotFoundError(f"[model] hf_assets_path = {str(p)!r}: file not found")
        return p
    if p.is_dir():
        found = sorted(p.glob("*.tiktoken"))
        if not found:
            return None
        if (p / "gpt2.tiktoken").is_file():
            return p / "gpt2.tiktoken"
        if len(found) > 1:
            raise ValueError(
                f"[model] hf_assets_path = {str(p)!r} holds several .tiktoken files "
                f"({', '.join(f.name for f in found)}); point it at one of them"
            )
        return found[0]
    return None


def build_tokenizer(job_config) -> GPT2Tokenizer:
    """The train spec's ``build_tokenizer_fn``: GPT-2 unless hf_assets_path names a .tiktoken."""
    model_cfg = job_config.model
    path = resolve_tokenizer_path(getattr(model_cfg, "tokenizer_path", None))
    if path is not None:
        logger.warning("[model] tokenizer_path is deprecated in torchtitan; use hf_assets_path")
    else:
        path = resolve_tokenizer_path(getattr(model_cfg, "hf_assets_path", None))
    tokenizer = GPT2Tokenizer(path)
    logger.info(
        f"Tokenizer {tokenizer.name} ({tokenizer.path}, vocab {tokenizer.get_vocab_size()}, "
        f"sha256 {tokenizer.sha256[:12]})"
    )
    return tokenizer
