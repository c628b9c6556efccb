"""Tokenizers, with no network at run time: GPT-2's BPE through tiktoken (the default), or
a Hugging Face tokenizer folder (``tokenizer.json``) through torchtitan's HuggingFaceTokenizer.

The GPT-2 merge ranks ship in the package (``grt_titan/assets/gpt2.tiktoken``, taken from
the MIT-licensed openai-whisper sdist; see ``grt_titan/assets/README.md``), and so do their
first 4,096 ranks (``gpt2_4k.tiktoken``, the debug presets'), so building the tokenizer never
downloads anything. Another ``.tiktoken`` rank file can be used instead by
pointing ``[model] hf_assets_path`` at it (or at a folder holding exactly one); its
``<|endoftext|>`` id is then the number of ranks. A folder holding ``tokenizer.json`` (Llama
3.x, Qwen3, GPT-2's own) selects ``HFTokenizer``. Both offer the same interface: ``name``,
``sha256`` (the identity token shards record), ``eos_id``, ``bos_id``, ``get_vocab_size``,
``encode`` / ``encode_batch`` / ``decode``, and ``path`` (docs/data.md, "Tokenizer").
"""

import hashlib
import json
import os
from binascii import a2b_base64
from pathlib import Path

import tiktoken
from torchtitan.components.tokenizer import BaseTokenizer, HuggingFaceTokenizer
from torchtitan.tools.logging import logger

ASSETS_DIR = Path(__file__).resolve().parent / "assets"
PACKAGE_PARENT = ASSETS_DIR.parents[1]
"""The folder holding the grt_titan package: the source checkout, or site-packages."""
GPT2_TIKTOKEN_PATH = ASSETS_DIR / "gpt2.tiktoken"
GPT2_TIKTOKEN_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
"""sha256 of the shipped rank file (openai-whisper 20250625, whisper/assets/gpt2.tiktoken)."""

# tiktoken's own "gpt2" definition (tiktoken_ext/openai_public.py).
GPT2_PAT_STR = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
ENDOFTEXT = "<|endoftext|>"
GPT2_VOCAB_SIZE = 50257
GPT2_4K_TIKTOKEN_PATH = ASSETS_DIR / "gpt2_4k.tiktoken"
"""GPT-2's first 4,096 ranks (the 256 bytes and the first 3,840 merges): the debug presets'
vocabulary (4,097 ids with `<|endoftext|>`), a twelfth of GPT-2's, so that CPU runs spend their
steps on the blocks rather than on the LM head (grt_titan/assets/README.md)."""


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


_ENCODINGS: dict[tuple[str, str], tiktoken.Encoding] = {}


def _encoding(path: Path, data: bytes, sha256: str, name: str) -> tiktoken.Encoding:
    """The tiktoken encoding of a rank file, built once per process for each file content
    (its sha256): a training rank builds the tokenizer twice, for the start-up vocabulary check
    and for the trainer, and reading 50k ranks then building the encoding costs about 0.1 s of
    CPU each time. An encoding is read-only once built, so tokenizers share it."""
    if (sha256, name) not in _ENCODINGS:
        ranks = _load_ranks(path, data)
        _ENCODINGS[sha256, name] = tiktoken.Encoding(
            name=name,
            pat_str=GPT2_PAT_STR,
            mergeable_ranks=ranks,
            special_tokens={ENDOFTEXT: len(ranks)},
            explicit_n_vocab=len(ranks) + 1,
        )
    return _ENCODINGS[sha256, name]


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
        self.path = path
        self.name = "gpt2" if self.sha256 == GPT2_TIKTOKEN_SHA256 else path.stem
        self._encoding = _encoding(path, data, self.sha256, self.name)
        self.eos_id = self._encoding.eot_token
        self.bos_id = None

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


HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
"""The files of a Hugging Face tokenizer folder that define its tokens: its identity (``sha256``)
hashes them, and an HF export copies them."""

# Pre-tokenizer regexes whose long-document cuts are proven safe (docs/data.md, "Parallelism"):
# Llama 3's (tiktoken's cl100k) and Qwen2/Qwen3's; GPT-2's is ByteLevel's built-in regex.
LLAMA3_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT_REGEX = LLAMA3_SPLIT_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")
_SAFE_SPLIT_REGEXES = (LLAMA3_SPLIT_REGEX, QWEN2_SPLIT_REGEX)
_PROBE = "Hello world"


def hf_tokenizer_sha256(folder: str | os.PathLike) -> str:
    """The identity of a Hugging Face tokenizer folder: sha256 over, for each of
    ``HF_TOKENIZER_FILES`` present (in that order), its name, a NUL byte, its size in bytes
    (decimal), a NUL byte and its bytes."""
    h = hashlib.sha256()
    for name in HF_TOKENIZER_FILES:
        path = Path(folder) / name
        if path.is_file():
            data = path.read_bytes()
            h.update(f"{name}\0{len(data)}\0".encode())
            h.update(data)
    return h.hexdigest()


def _cut_problem(tokenizer_json: dict, added_tokens) -> str | None:
    """Why cutting a text before a space or newline that follows an ASCII letter or digit
    might change its tokens (None: it cannot). Proven for GPT-2's, Llama 3's and Qwen's
    pre-tokenizers (tests/data/test_tokenizer_folders.py checks it on adversarial text)."""
    normalizer = tokenizer_json.get("normalizer")
    if normalizer is not None and normalizer.get("type") != "NFC":
        return f"normalizer {normalizer.get('type')!r}"
    pre = tokenizer_json.get("pre_tokenizer") or {}
    gpt2 = pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space")
    steps = pre.get("pretokenizers") or []
    split_then_bytes = (
        pre.get("type") == "Sequence"
        and len(steps) == 2
        and steps[0].get("type") == "Split"
        and steps[0].get("pattern", {}).get("Regex") in _SAFE_SPLIT_REGEXES
        and steps[0].get("behavior") == "Isolated"
        and not steps[0].get("invert")
        and steps[1].get("type") == "ByteLevel"
        and not steps[1].get("use_regex", True)
        and not steps[1].get("add_prefix_space")
    )
    if not (gpt2 or split_then_bytes):
        return "a pre-tokenizer other than GPT-2's, Llama 3's or Qwen's"
    for token in added_tokens:
        if token.lstrip or token.rstrip or token.single_word or any(c.isspace() for c in token.content):
            return f"added token {token.content!r} (whitespace, lstrip, rstrip or single_word)"
    return None


class HFTokenizer(HuggingFaceTokenizer):
    """A Hugging Face tokenizer folder, read alike on torchtitan 0.2.2 and 0.3.

    torchtitan's ``HuggingFaceTokenizer`` loads ``tokenizer.json`` and registers the special
    tokens tokenizer_config.json names (the same on both hosts). The rest its two versions
    do differently (0.3 reads a BOS that is also the EOS as both and then adds no EOS; it
    keeps the config under another name), so this class decides it from the
    ``tokenizers.Tokenizer`` and tokenizer_config.json itself:

    - ``encode`` adds what the source adds: the post-processor's special tokens (Llama 3's
      ``<|begin_of_text|>``; GPT-2 and Qwen3 add none), BOS when ``add_bos`` (default:
      ``add_bos_token`` of tokenizer_config.json) and EOS when ``add_eos``, each unless the
      post-processor puts it there already;
    - text is ordinary text: a literal special token in it (``<|endoftext|>``) is encoded
      as text, as ``GPT2Tokenizer`` does (``encode_special_tokens``);
    - ``bos_id`` is tokenizer_config.json's ``bos_token``; ``eos_id`` its ``eos_token``, else
      special_tokens_map.json's, else an added ``<|endoftext|>`` (GPT-2's own folder names
      none); a folder without one is refused: documents are separated by EOS;
    - ``decode`` keeps special tokens and takes arrays and tensors, like ``GPT2Tokenizer``.

    Args:
        folder: A folder holding ``tokenizer.json`` (and usually ``tokenizer_config.json``).
        expected_sha256: Checked against the folder's identity when given.

    Attributes:
        path: The folder.
        name: The folder's name.
        sha256: ``hf_tokenizer_sha256(folder)``; token shards record it (docs/data.md).
        config: tokenizer_config.json (``{}`` without one); its chat template is the one
            chat records are rendered with.
        document_prefix, document_suffix: The ids ``encode(doc, add_eos=True)`` puts before
            and after a document's text (Llama 3: ``[bos]``, ``[eos]``).
        cut_problem: None when long documents may be cut into pieces before a space or
            newline that follows an ASCII letter or digit (``grt-titan prepare``), else why not.
        unknown_id: The id a word outside the vocabulary is read as, or None (byte-level BPE
            reads every text).
    """

    def __init__(self, folder: str | os.PathLike, expected_sha256: str | None = None):
        folder = Path(folder)
        tokenizer_file = folder / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise FileNotFoundError(f"{folder}: no tokenizer.json (a Hugging Face tokenizer folder holds one)")
        self.sha256 = hf_tokenizer_sha256(folder)
        if expected_sha256 is not None and self.sha256 != expected_sha256:
            raise ValueError(
                f"{folder}: tokenizer sha256 {self.sha256} does not match the expected {expected_sha256}; "
                "the tokenizer files differ"
            )
        try:
            super().__init__(tokenizer_path=str(folder))  # the keyword both torchtitan hosts take
            tokenizer_json = json.loads(tokenizer_file.read_text(encoding="utf-8"))
            self.config = _read_json(folder / "tokenizer_config.json")
        except Exception as e:  # tokenizers raises its own Exception type
            raise ValueError(f"{folder}: not a readable Hugging Face tokenizer ({e})") from e
        self.path = folder
        self.name = folder.resolve().name
        self.tokenizer.encode_special_tokens = True
        self.bos_token, self.bos_id = self._special_token("bos_token")
        self.eos_token, self.eos_id = self._eos()
        vocab = self.tokenizer.get_vocab(with_added_tokens=True)
        self._vocab_size = max(vocab.values()) + 1
        # A word-level (or WordPiece, Unigram) model reads a word it lacks as its unknown
        # token; byte-level BPE (GPT-2, Qwen3) has none. `grt-titan prepare` refuses such text.
        unknown = (tokenizer_json.get("model") or {}).get("unk_token")
        self.unknown_id = None if unknown is None else self.tokenizer.token_to_id(unknown)
        self._post_prefix, self._post_suffix = self._around_probe(self.tokenizer.encode(_PROBE).ids)
        self.document_prefix, self.document_suffix = self._around_probe(self.encode(_PROBE, add_eos=True))
        self.cut_problem = _cut_problem(tokenizer_json, self.tokenizer.get_added_tokens_decoder().values())

    def _special_token(self, key: str, *fallbacks: str | None) -> tuple[str | None, int | None]:
        """The token tokenizer_config.json names as ``key``, else the first of ``fallbacks``,
        that the vocabulary has, and its id; (None, None) if none."""
        for name in (self._get_token_from_config(self.config, key), *fallbacks):
            if name is not None and self.tokenizer.token_to_id(name) is not None:
                return name, self.tokenizer.token_to_id(name)
        return None, None

    def _eos(self) -> tuple[str, int]:
        """EOS: tokenizer_config.json's, else special_tokens_map.json's, else an added
        ``<|endoftext|>`` (GPT-2's own folder names none)."""
        special_map = _read_json(self.path / "special_tokens_map.json")
        added = {t.content for t in self.tokenizer.get_added_tokens_decoder().values() if t.special}
        name, eos_id = self._special_token(
            "eos_token",
            self._get_token_from_config(special_map, "eos_token"),
            ENDOFTEXT if ENDOFTEXT in added else None,
        )
        if eos_id is None:
            raise ValueError(
                f"{self.path}: no end-of-text token (tokenizer_config.json and special_tokens_map.json "
                'name no "eos_token" the vocabulary has); documents are separated by it: add '
                '"eos_token" to tokenizer_config.json'
            )
        return name, eos_id

    def _around_probe(self, ids: list[int]) -> tuple[list[int], list[int]]:
        """The ids before and after the probe text's own tokens in ``ids`` (its encoding)."""
        body = self.encode_ordinary(_PROBE)
        for i in range(len(ids) - len(body) + 1):
            if ids[i : i + len(body)] == body:
                return ids[:i], ids[i + len(body) :]
        raise ValueError(
            f"{self.path}: encoding {_PROBE!r} gives {ids}, which does not hold the text's tokens "
            f"{body}; unsupported post-processor"
        )

    def encode(self, text: str, add_bos: bool | None = None, add_eos: bool = False) -> list[int]:
        """The tokens of ``text`` with the special tokens the source adds (see the class);
        ``add_bos`` None: tokenizer_config.json's ``add_bos_token``."""
        ids = self.tokenizer.encode(text).ids
        if add_bos is None:
            add_bos = bool(self.config.get("add_bos_token"))
        if add_bos and self.bos_id is not None and self.bos_id not in self._post_prefix:
            ids.insert(0, self.bos_id)
        if add_eos and self.eos_id not in self._post_suffix:
            ids.append(self.eos_id)
        return ids

    def set_chat_template(self, template: object) -> None:
        """Compiles nothing: torchtitan 0.3 loads a folder's chat template at construction (0.2.2
        does not) and fails on a list of named ones, which transformers writes. Chat records
        are rendered from ``config`` by grt_titan's own ``ChatTemplate`` on both hosts."""

    def encode_ordinary(self, text: str) -> list[int]:
        """The tokens of ``text`` alone: no special token added, none recognised in it."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str], num_threads: int = 8, add_eos: bool = False) -> list[list[int]]:
        """``[encode(t, add_eos=add_eos) for t in texts]``; ``num_threads`` is accepted for
        ``GPT2Tokenizer``'s interface."""
        return [self.encode(text, add_eos=add_eos) for text in texts]

    def decode(self, ids, **kwargs) -> str:
        """Decodes ids (a list, tuple, numpy array or tensor) to text, special tokens kept
        unless ``skip_special_tokens=True``."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        kwargs.setdefault("skip_special_tokens", False)
        return self.tokenizer.decode(list(ids), **kwargs)

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def get_vocab_size(self) -> int:
        """The number of ids the tokenizer can emit: its largest id + 1."""
        return self._vocab_size


def _read_json(path: Path) -> dict:
    """A JSON file's object; ``{}`` when the file is absent."""
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def resolve_tokenizer_path(hf_assets_path: str | None) -> Path | None:
    """The ``.tiktoken`` file selected by ``[model] hf_assets_path``, or None.

    A path ending in ``.tiktoken`` must exist; a relative one is looked for from the working
    directory, then beside the grt_titan package, so the presets'
    ``grt_titan/assets/gpt2_4k.tiktoken`` is found wherever a run starts. A folder is used only if it holds a
    ``.tiktoken`` file: ``gpt2.tiktoken`` if present, else the only one (several -> error).
    Anything else (torchtitan's default ``./tests/assets/tokenizer``, an HF tokenizer folder
    without ``.tiktoken`` files) gives None; ``resolve_tokenizer_source`` also finds HF
    tokenizer folders.
    """
    if not hf_assets_path:
        return None
    p = Path(hf_assets_path)
    if p.suffix == ".tiktoken":
        if p.is_file():
            return p
        if not p.is_absolute() and (PACKAGE_PARENT / p).is_file():
            return PACKAGE_PARENT / p  # grt_titan/assets/..., from outside the checkout
        raise FileNotFoundError(f"[model] hf_assets_path = {str(p)!r}: file not found")
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


# torchtitan 0.2.2's default `[model] hf_assets_path`: no folder of this repository.
TORCHTITAN_DEFAULT_ASSETS = Path("./tests/assets/tokenizer")


def resolve_tokenizer_source(hf_assets_path: str | None) -> Path | None:
    """The tokenizer selected by ``[model] hf_assets_path``: a ``.tiktoken`` file (as
    ``resolve_tokenizer_path``), else a Hugging Face tokenizer folder (a folder holding
    ``tokenizer.json``, or that file itself); None (the shipped GPT-2 ranks) when the key is
    unset or torchtitan's default. Any other path that holds no tokenizer is an error."""
    path = resolve_tokenizer_path(hf_assets_path)
    if path is not None or not hf_assets_path:
        return path
    p = Path(hf_assets_path)
    if p.name == "tokenizer.json" and p.is_file():
        return p.parent
    if (p / "tokenizer.json").is_file():
        return p
    if Path(hf_assets_path) == TORCHTITAN_DEFAULT_ASSETS:
        return None  # the key left at torchtitan's default: the shipped GPT-2 ranks
    # A path someone set (a retrofit's source folder, say) that holds no tokenizer: falling
    # back to GPT-2's would train on the wrong ids whenever the vocabulary check passes.
    where = "does not exist" if not p.exists() else "holds no .tiktoken file and no tokenizer.json"
    raise FileNotFoundError(
        f"[model] hf_assets_path = {hf_assets_path!r} {where}; allowed: a .tiktoken file, a Hugging Face "
        "tokenizer folder (tokenizer.json), or the key unset (the shipped GPT-2 tokenizer)"
    )


def load_tokenizer(path: str | os.PathLike | None = None) -> "GPT2Tokenizer | HFTokenizer":
    """The tokenizer at ``path``: None = the shipped GPT-2 ranks; a ``.tiktoken`` file, or a
    folder holding one (as ``resolve_tokenizer_path``) = ``GPT2Tokenizer``; a folder holding
    ``tokenizer.json``, or that file = ``HFTokenizer``; another file = ``GPT2Tokenizer`` (a
    rank file by another name)."""
    if path is None:
        return GPT2Tokenizer()
    p = Path(path)
    if p.is_dir():
        ranks = resolve_tokenizer_path(str(p))
        if ranks is not None:
            return GPT2Tokenizer(ranks)
        if not (p / "tokenizer.json").is_file():
            raise FileNotFoundError(f"tokenizer folder {str(p)!r} holds no .tiktoken file and no tokenizer.json")
        return HFTokenizer(p)
    if p.name == "tokenizer.json" and p.is_file():
        return HFTokenizer(p.parent)
    return GPT2Tokenizer(p)


def export_tokenizer(folder: str | os.PathLike) -> "GPT2Tokenizer | HFTokenizer":
    """The tokenizer of an exported folder (`grt-titan analyze` without a TOML): the shipped
    rank file of that size for the GPT-2 files `grt-titan export-hf` derives from GPT-2's ranks
    or their first 4,096
    (tokenizer_config.json: ``tokenizer_class`` GPT2Tokenizer, ``split_special_tokens``) or
    a folder without tokenizer.json; else the folder's tokenizer.json (an export carries its
    source's tokenizer files unchanged, so its identity is the source's)."""
    folder = Path(folder)
    if not (folder / "tokenizer.json").is_file():
        return GPT2Tokenizer()
    config = _read_json(folder / "tokenizer_config.json")
    if config.get("tokenizer_class") == "GPT2Tokenizer" and config.get("split_special_tokens") is True:
        vocab = _read_json(folder / "tokenizer.json")["model"]["vocab"]  # the ranks and <|endoftext|>
        shipped = shipped_ranks(len(vocab) - 1)
        if shipped is not None:
            return GPT2Tokenizer(shipped)
    return HFTokenizer(folder)


def shipped_ranks(count: int) -> Path | None:
    """The shipped rank file holding `count` ranks: an export's GPT-2 files name no file, and
    their vocabulary's size tells GPT-2's ranks from their first 4,096."""
    for path in sorted(ASSETS_DIR.glob("*.tiktoken")):
        if len(path.read_bytes().split()) == 2 * count:  # one "<base64> <rank>" line per rank
            return path
    return None


def build_tokenizer(job_config) -> "GPT2Tokenizer | HFTokenizer":
    """The train spec's ``build_tokenizer_fn``: GPT-2 unless hf_assets_path names a
    ``.tiktoken`` file or a Hugging Face tokenizer folder (``resolve_tokenizer_source``)."""
    model_cfg = job_config.model
    path = resolve_tokenizer_source(getattr(model_cfg, "tokenizer_path", None))
    if path is not None:
        logger.warning("[model] tokenizer_path is deprecated in torchtitan; use hf_assets_path")
    else:
        path = resolve_tokenizer_source(getattr(model_cfg, "hf_assets_path", None))
    tokenizer = load_tokenizer(path)
    logger.info(
        f"Tokenizer {tokenizer.name} ({tokenizer.path}, vocab {tokenizer.get_vocab_size()}, "
        f"sha256 {tokenizer.sha256[:12]})"
    )
    return tokenizer
