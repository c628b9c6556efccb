"""The tokenizer files of an exported model: a Hugging Face tokenizer folder's, carried
unchanged with its chat templates and generation ids (`copy_tokenizer_files`,
`source_generation_ids`), or GPT-2's, derived offline from tiktoken ranks (the rest).

The training tokenizer (grt_titan/tokenizer.py) is tiktoken over ``gpt2.tiktoken``: a map
from byte strings to ranks. Hugging Face's GPT-2 tokenizer is the same byte-level BPE
written as ``vocab.json`` (token strings in the GPT-2 ``bytes_to_unicode`` alphabet) and
``merges.txt`` (one merge per non-byte token, in rank order). The merges are recovered
exactly: replaying BPE on a token's bytes with only the merges of lower rank ends in two
parts, and those two parts are the merge that created the token (tiktoken's own
``data_gym_to_mergeable_bpe_ranks`` is the inverse of this).

Both tokenizers split text with the same GPT-2 regex (``tokenizers``' ByteLevel
pre-tokenizer uses it verbatim), so ids are equal on any text. ``<|endoftext|>``: the
training tokenizer encodes a literal ``<|endoftext|>`` in text as ordinary text
(``encode_ordinary``); the exported tokenizer does the same because
``tokenizer_config.json`` sets ``split_special_tokens = true``. It stays the EOS token.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from grt_titan.tokenizer import HF_TOKENIZER_FILES

ENDOFTEXT = "<|endoftext|>"

# What an export carries from a Hugging Face tokenizer folder, where present: the files that
# define its tokens (its identity hashes them), the slow tokenizers' vocabulary files, and how
# its users prompt it: the chat template (a `chat_template` key rides in tokenizer_config.json).
CARRIED_TOKENIZER_FILES = (
    *HF_TOKENIZER_FILES,
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)
CHAT_TEMPLATE_DIR = "additional_chat_templates"  # named templates, <name>.jinja (transformers' layout)
# The special ids of the source's generation_config.json that generate() stops, starts and pads with.
GENERATION_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def copy_tokenizer_files(source: Path, out: Path) -> list[str]:
    """Copy the source folder's `CARRIED_TOKENIZER_FILES` and named chat templates into `out`,
    byte for byte, so the export tokenizes and prompts as the source; returns their names."""
    names = [name for name in CARRIED_TOKENIZER_FILES if (source / name).is_file()]
    names += [f"{CHAT_TEMPLATE_DIR}/{p.name}" for p in sorted((source / CHAT_TEMPLATE_DIR).glob("*.jinja"))]
    for name in names:
        (out / name).parent.mkdir(exist_ok=True)
        shutil.copyfile(source / name, out / name)
    return names


def source_generation_ids(source: Path, vocab_size: int) -> dict[str, int | list[int]]:
    """`GENERATION_IDS` of the source's generation_config.json whose ids are all below
    `vocab_size` (an instruct model's EOS may be a list: end of turn besides end of text)."""
    path = source / "generation_config.json"
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e}); allowed: a generation_config.json transformers wrote") from e
    found = {}
    for key in GENERATION_IDS:
        value = config.get(key)
        ids = value if isinstance(value, list) else [value]
        if value is not None and ids and all(isinstance(i, int) and 0 <= i < vocab_size for i in ids):
            found[key] = value
    return found


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable unicode characters."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(printable, (chr(c) for c in chars)))


def _bpe_split(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    """BPE of `token` using only merges whose result ranks below `max_rank` (tiktoken's rule)."""
    parts = [bytes([b]) for b in token]
    while True:
        best_i, best_rank = -1, max_rank
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < best_rank:
                best_i, best_rank = i, rank
        if best_i < 0:
            return parts
        parts[best_i : best_i + 2] = [parts[best_i] + parts[best_i + 1]]


def vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """HF `vocab` (token string -> id) and `merges` (in rank order) from tiktoken ranks."""
    byte_encoder = bytes_to_unicode()

    def to_str(b: bytes) -> str:
        return "".join(byte_encoder[x] for x in b)

    vocab = {to_str(token): rank for token, rank in ranks.items()}
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) == 1:
            continue
        parts = _bpe_split(ranks, token, rank)
        if len(parts) != 2:
            raise ValueError(
                f"tiktoken rank {rank} ({token!r}) is not the merge of two lower-ranked tokens; "
                "the rank file is not a byte-level BPE that HF's tokenizer can express"
            )
        merges.append((to_str(parts[0]), to_str(parts[1])))
    return vocab, merges


def build_tokenizer_json(vocab: dict[str, int], merges: list[tuple[str, str]], eos_id: int) -> str:
    """tokenizer.json of a GPT-2 byte-level BPE with `<|endoftext|>` as added special token."""
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE

    tok = Tokenizer(
        BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
        )
    )
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(ENDOFTEXT, special=True, normalized=False)])
    if tok.token_to_id(ENDOFTEXT) != eos_id:
        raise ValueError(f"{ENDOFTEXT} got id {tok.token_to_id(ENDOFTEXT)}, expected {eos_id}")
    return tok.to_str(pretty=False)


def write_tokenizer_files(out_dir: str | Path, ranks: dict[bytes, int], model_max_length: int) -> None:
    """Write vocab.json, merges.txt, tokenizer.json and the configs for `AutoTokenizer`.

    Args:
        out_dir: Existing folder to write into.
        ranks: tiktoken mergeable ranks (bytes -> id); `<|endoftext|>` gets id len(ranks).
        model_max_length: Longest sequence the model takes (learned positions / RoPE table).
    """
    out = Path(out_dir)
    eos_id = len(ranks)
    vocab, merges = vocab_and_merges(ranks)
    (out / "vocab.json").write_text(json.dumps({**vocab, ENDOFTEXT: eos_id}, ensure_ascii=False), encoding="utf-8")
    (out / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
    vocab_with_eos = {**vocab, ENDOFTEXT: eos_id}
    (out / "tokenizer.json").write_text(build_tokenizer_json(vocab_with_eos, merges, eos_id), encoding="utf-8")
    special = {"bos_token": ENDOFTEXT, "eos_token": ENDOFTEXT, "unk_token": ENDOFTEXT}
    config = {
        "tokenizer_class": "GPT2Tokenizer",
        **special,
        "pad_token": None,
        "add_prefix_space": False,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": model_max_length,
        # The training tokenizer encodes a literal "<|endoftext|>" in text as text.
        "split_special_tokens": True,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
