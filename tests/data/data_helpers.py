"""Helpers of the data tests: small corpora, synthetic shard sets, job configs, and tiny
Hugging Face tokenizer folders built offline with the `tokenizers` library (a byte-level BPE
trained on a few sentences, with the pre-tokenizer, normalizer, special tokens and
tokenizer_config.json of the tokenizer each style imitates)."""

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from grt_titan.data.config import DataConfig
from grt_titan.tokenizer import LLAMA3_SPLIT_REGEX, QWEN2_SPLIT_REGEX

from grt_test_helpers import write_token_dataset

DOCS = [
    "It is a truth universally acknowledged, that a single man in possession\n"
    "of a good fortune, must be in want of a wife.",
    "Emma Woodhouse, handsome, clever, and rich, with a comfortable home\n\n"
    "and happy disposition.   Extra  spaces,\ttabs, and 123 numbers.",
    "Unicode: café, naïve, 東京, emoji 🙂, and a literal <|endoftext|> in the text.",
    "Short one.",
    "The family of Dashwood had long been settled in Sussex. " * 20,
    "Last document\n",
]


def write_jsonl(path: Path, docs, field: str = "text") -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({field: d, "id": len(d)}) + "\n")
    return path


def split_tokens(out: Path, split: str) -> np.ndarray:
    """A prepared dataset's `split` as one token array (its manifest's dtype)."""
    from grt_titan.data import shards as sh

    manifest = json.loads((out / sh.MANIFEST_NAME).read_text())
    dtype = np.dtype(manifest["dtype"])
    parts = [np.fromfile(out / s["file"], dtype=dtype) for s in manifest["splits"][split]["shards"]]
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


def make_synthetic_dataset(
    root: Path, tokenizer, train_tokens: int, val_tokens: int = 0, shard_tokens: int = 1000
) -> Path:
    """A prepared dataset whose token at stream position i is i (ids < 50,000): a window's
    first token tells which sequence it is."""
    assert train_tokens < 50_000 and val_tokens < 50_000
    root.mkdir(parents=True)
    splits = {"train": np.arange(train_tokens, dtype=np.int64), "val": np.arange(val_tokens, dtype=np.int64)}
    return write_token_dataset(root, tokenizer, splits, shard_tokens, val_fraction=0.0)


@dataclass
class LoaderWorkers:
    """0.2.2's `[training.dataloader]` keys and defaults: the StatefulDataLoader options the
    loader passes on (`asdict`)."""

    num_workers: int = 0
    persistent_workers: bool = False
    pin_memory: bool = False
    prefetch_factor: int | None = None


def job_config(
    dataset: str,
    seq_len: int = 16,
    batch_size: int = 4,
    num_workers: int = 0,
    seed: int = 0,
    cache_dir: str | None = None,
    val_dataset: str | None = None,
) -> SimpleNamespace:
    """The keys build_dataloader and build_validation_dataloader read, as 0.2.2's JobConfig
    holds them (its defaults for the rest): one config for either torchtitan host."""

    def section(name: str) -> SimpleNamespace:
        return SimpleNamespace(
            dataset=name,
            dataset_path=None,
            seq_len=seq_len,
            local_batch_size=batch_size,
            dataloader=LoaderWorkers(num_workers=num_workers),
        )

    training = section(dataset)
    training.global_batch_size = -1
    return SimpleNamespace(
        training=training, validation=section(val_dataset or dataset), data=DataConfig(seed=seed, cache_dir=cache_dir)
    )


STYLES = ("llama3", "qwen3", "gpt2", "metaspace")
"""llama3: Llama 3's split regex, BOS added by the post-processor, <|end_of_text|> as EOS;
qwen3: NFC + Qwen's split regex, no BOS, <|endoftext|> as EOS, chat tokens;
gpt2: ByteLevel's GPT-2 regex and a tokenizer_config.json naming no special token (as
openai-community/gpt2's); metaspace: a SentencePiece-style pre-tokenizer (no proven cut)."""

TRAINING_TEXT = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife.",
    "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition, "
    "seemed to unite some of the best blessings of existence; 1811, 1813, 2024.",
    "The family of Dashwood had long been settled in Sussex.\nTheir estate was large.\n\n",
    "Unicode: café, naïve, 東京, emoji 🙂, don't, we'll, I'm, they've.",
]


def make_hf_tokenizer(folder: Path, style: str = "llama3", vocab_size: int | None = None) -> Path:
    """Writes tokenizer.json + tokenizer_config.json of a tiny `style` tokenizer into `folder`.

    `vocab_size`: pad the BPE vocabulary with unused tokens so the special tokens come
    after it (e.g. 70_000: ids beyond uint16, as Llama 3's 128k and Qwen3's 151k).
    """
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    assert style in STYLES, style
    folder.mkdir(parents=True, exist_ok=True)
    byte_level = style != "metaspace"
    if style == "llama3":
        pre = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(LLAMA3_SPLIT_REGEX), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    elif style == "qwen3":
        pre = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    elif style == "gpt2":
        pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        pre = pre_tokenizers.Metaspace()
    tok = Tokenizer(models.BPE(unk_token=None if byte_level else "<unk>"))
    tok.pre_tokenizer = pre
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet() if byte_level else [],
        special_tokens=[] if byte_level else ["<unk>"],
        show_progress=False,
    )
    tok.train_from_iterator(TRAINING_TEXT, trainer)
    if vocab_size is not None:  # pad the vocabulary: unreachable tokens, no merges
        model = json.loads(tok.to_str())["model"]
        vocab = dict(model["vocab"])
        for i in range(len(vocab), vocab_size):
            vocab[f"<unused_{i}>"] = i
        merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
        padded = Tokenizer(models.BPE(vocab=vocab, merges=merges))
        padded.pre_tokenizer = pre
        tok = padded
    if style == "qwen3":
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel() if byte_level else decoders.Metaspace()
    specials = {
        "llama3": ["<|begin_of_text|>", "<|end_of_text|>"],
        "qwen3": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "gpt2": ["<|endoftext|>"],
        "metaspace": ["<s>", "</s>"],
    }[style]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    if style == "llama3":
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B", special_tokens=[("<|begin_of_text|>", bos)]
        )
    elif byte_level:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", "model_max_length": 131072},
        "qwen3": {"bos_token": None, "eos_token": "<|endoftext|>", "add_bos_token": False, "pad_token": None},
        "gpt2": {"model_max_length": 1024},
        "metaspace": {"bos_token": "<s>", "eos_token": "</s>"},
    }[style]
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder


# ---- multi-step tasks (grt_titan/data/tasks.py): each answer and step from the prompt alone ----


def solve_iterated_function(prompt: str, loops: int | None = None) -> list[str]:
    """The steps the prompt asks for; `loops`: the depth of a query that does not name it (`| x =`)."""
    table, query = prompt.split(" | ")
    lines = re.findall(r"(\w) > (\w) ;", table) or re.findall(r"(\w)>(\w)", table)  # lines, or edge words
    f = dict(lines)
    if loops is None:
        x, depth = re.fullmatch(r"(\w) \* (\d+) =", query).groups()
    else:
        (x,), depth = re.fullmatch(r"(\w) =", query).groups(), loops
    orbit = [x]
    for _ in range(int(depth)):
        orbit.append(f[orbit[-1]])
    assert len(set(orbit)) == len(orbit), "the orbit repeats before the answer"
    assert len(f) == len(lines) == table.count(">")  # every line read, each symbol once
    assert len(f) in (10, 12)  # a total function (12 symbols by default; 10: edges in the vocabulary)
    return orbit[1:]


def solve_chains(prompt: str) -> list[str]:
    table, query = prompt.split(" | ")
    value = dict(re.findall(r"(\w) = (\w) ;", table))
    digits = [v for v in value.values() if v.isdigit()]
    assert len(digits) == len(set(digits)) == 3, "three chains, each to a digit of its own"
    var, steps = re.fullmatch(r"(\w) =", query).group(1), []
    while not var.isdigit():
        var = value[var]
        steps.append(var)
    assert len(value) == 3 * len(steps), "three chains of the query's depth"
    return steps


def solve_mano(prompt: str) -> list[str]:
    words = prompt.removesuffix(" =").split()
    steps = []

    def evaluate(i):
        if words[i].isdigit():
            return int(words[i]), i + 1
        left, j = evaluate(i + 1)
        right, k = evaluate(j)
        v = {"+": left + right, "-": left - right, "*": left * right}[words[i]] % 23
        steps.append(str(v))
        return v, k

    _, end = evaluate(0)
    assert end == len(words)
    return steps


SOLVERS = {"iterated-function": solve_iterated_function, "chains": solve_chains, "mano": solve_mano}


CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def chat_tokenizer(qwen3_folder: Path, folder: Path) -> Path:
    """A copy of the qwen3-style tokenizer folder with a ChatML chat template."""
    shutil.copytree(qwen3_folder, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": CHATML}))
    return folder
