"""Hugging Face tokenizer folders (tokenizer.json) through build_tokenizer, prepare, the
loader, the tokenizer check and the export's tokenizer files; tiny tokenizers built offline
(data_helpers.make_hf_tokenizer)."""

import json
import random
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

from grt_titan.data import default_corpus
from grt_titan.data import shards as sh
from grt_titan.data.config import DataConfig
from grt_titan.data.loader import build_dataloader, build_validation_dataloader
from grt_titan.data.prepare import _CUT, document_cut, is_val_document, main, prepare, split_long_text
from grt_titan.tokenizer import (
    GPT2_4K_TIKTOKEN_PATH,
    GPT2_TIKTOKEN_PATH,
    GPT2Tokenizer,
    HFTokenizer,
    build_tokenizer,
    export_tokenizer,
    hf_tokenizer_sha256,
    load_tokenizer,
)

from data_helpers import CHATML, DOCS, job_config, split_tokens, write_jsonl


def _jc_with_tokenizer(path) -> SimpleNamespace:
    """The one key build_tokenizer reads, whichever torchtitan host's config holds it."""
    return SimpleNamespace(model=SimpleNamespace(hf_assets_path=str(path)))


def test_build_from_a_folder(hf_dirs, tmp_path):
    llama = build_tokenizer(_jc_with_tokenizer(hf_dirs["llama3"]))
    assert isinstance(llama, HFTokenizer) and llama.name == "llama3" and llama.path == hf_dirs["llama3"]
    assert llama.sha256 == hf_tokenizer_sha256(hf_dirs["llama3"])
    # Llama 3: BOS from the post-processor, EOS appended; the special tokens after the BPE ids.
    assert (llama.bos_id, llama.eos_id, llama.get_vocab_size()) == (400, 401, 402)
    assert (llama.document_prefix, llama.document_suffix) == ([400], [401])
    ids = llama.encode("Hello world", add_eos=True)
    assert ids[0] == 400 and ids[-1] == 401 and ids[1:-1] == llama.encode_ordinary("Hello world")
    assert llama.decode(ids) == "<|begin_of_text|>Hello world<|end_of_text|>"
    assert llama.decode(np.array(ids[1:-1])) == "Hello world"
    # Text is ordinary text: a literal special token in it is not that token.
    assert 401 not in llama.encode_ordinary("a <|end_of_text|> b")
    assert llama.encode_batch(["a b", "c"], add_eos=True) == [
        llama.encode("a b", add_eos=True),
        llama.encode("c", add_eos=True),
    ]

    qwen = load_tokenizer(hf_dirs["qwen3"])  # no BOS: tokenizer_config.json has none
    assert qwen.bos_id is None and qwen.document_prefix == [] and qwen.document_suffix == [qwen.eos_id]
    assert qwen.tokenizer.id_to_token(qwen.eos_id) == "<|endoftext|>"
    # GPT-2's own folder names no EOS in tokenizer_config.json: the added <|endoftext|>.
    gpt2 = load_tokenizer(hf_dirs["gpt2"] / "tokenizer.json")  # the file selects its folder
    assert gpt2.tokenizer.id_to_token(gpt2.eos_id) == "<|endoftext|>" and gpt2.document_prefix == []

    # The identity covers tokenizer_config.json: another EOS is another tokenizer.
    other = tmp_path / "llama3"
    shutil.copytree(hf_dirs["llama3"], other)
    config = json.loads((other / "tokenizer_config.json").read_text())
    (other / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<|begin_of_text|>"}))
    assert load_tokenizer(other).sha256 != llama.sha256
    with pytest.raises(ValueError, match="does not match the expected"):
        HFTokenizer(other, expected_sha256=llama.sha256)

    # A .tiktoken file in the folder still wins (as before); a folder with neither is refused.
    shutil.copy(GPT2_TIKTOKEN_PATH, other / "gpt2.tiktoken")
    assert isinstance(build_tokenizer(_jc_with_tokenizer(other)), GPT2Tokenizer)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no .tiktoken file and no tokenizer.json"):
        load_tokenizer(tmp_path / "empty")


# transformers' tokenizer_config.json with several chat templates (0.3 compiled it at load).
_NAMED_TEMPLATES = [{"name": "default", "template": CHATML}, {"name": "plain", "template": "{{ messages }}"}]
# Folder -> (tokenizer_config.json changes, None: no such file; bos_id, eos_id, vocabulary
# size, document_prefix, document_suffix): what both torchtitan hosts must read.
_SPECIALS = {
    "llama3": ({}, 400, 401, 402, [400], [401]),
    "llama3_bos_is_eos": ({"eos_token": "<|begin_of_text|>"}, 400, 400, 402, [400], [400]),
    "qwen3": ({}, None, 400, 403, [], [400]),
    "qwen3_add_bos": ({"bos_token": "<|im_start|>", "add_bos_token": True}, 401, 400, 403, [401], [400]),
    "qwen3_named_chat_templates": ({"chat_template": _NAMED_TEMPLATES}, None, 400, 403, [], [400]),
    "gpt2": ({}, None, 400, 401, [], [400]),
    "gpt2_no_config": (None, None, 400, 401, [], [400]),
    "words": ({}, None, 234, 235, [], [234]),  # `grt-titan task vocab`'s word-level tokenizer
}


@pytest.mark.parametrize("case", list(_SPECIALS))
def test_special_tokens_are_read_alike_on_either_host(hf_dirs, tmp_path, case):
    """torchtitan 0.3's HuggingFaceTokenizer reads a BOS that is also the EOS as both and then
    adds no EOS (0.2.2: BOS only), and compiles the chat template; HFTokenizer decides the
    specials itself, alike on both, and leaves chats to grt_titan's ChatTemplate."""
    from tokenizers import Tokenizer

    from grt_titan.data.records import ChatTemplate
    from grt_titan.data.tasks import write_task_tokenizer

    changes, *expected = _SPECIALS[case]
    style = case.split("_")[0]
    folder = (
        write_task_tokenizer(tmp_path / case) if style == "words" else shutil.copytree(hf_dirs[style], tmp_path / case)
    )
    config_file = folder / "tokenizer_config.json"
    if changes is None:
        config_file.unlink()
    elif changes:
        config_file.write_text(json.dumps({**json.loads(config_file.read_text()), **changes}))
    tok = HFTokenizer(folder)
    assert [tok.bos_id, tok.eos_id, tok.get_vocab_size(), tok.document_prefix, tok.document_suffix] == expected
    text = "a > b ; 12 = c" if style == "words" else "Hello world, 12 cafés."
    ordinary = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    assert tok.encode_ordinary(text) == ordinary and tok.unknown_id not in ordinary
    assert tok.encode(text, add_eos=True) == tok.document_prefix + ordinary + tok.document_suffix
    assert tok.encode(text, add_bos=False) == ([400] if style == "llama3" else []) + ordinary  # the post-processor's
    if "chat_template" in (changes or {}):
        chat = [{"role": "user", "content": text}]
        assert ChatTemplate(tok, case).render(chat, False) == f"<|im_start|>user\n{text}<|im_end|>\n"


def test_a_folder_without_eos_is_refused(hf_dirs, tmp_path):
    folder = tmp_path / "no_eos"
    shutil.copytree(hf_dirs["qwen3"], folder)
    tok = json.loads((folder / "tokenizer.json").read_text())
    tok["added_tokens"] = [t for t in tok["added_tokens"] if t["content"] != "<|endoftext|>"]
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    (folder / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"no_eos: no end-of-text token .*eos_token"):
        HFTokenizer(folder)


@pytest.mark.parametrize("style", ["llama3", "qwen3"])
def test_prepare_open_and_load_a_batch(hf_dirs, tmp_path, style):
    tok = load_tokenizer(hf_dirs[style])
    src = write_jsonl(tmp_path / "docs.jsonl", DOCS * 20)
    out = tmp_path / "out"
    args = [str(src), "--out", str(out), "--tokenizer", str(hf_dirs[style]), "--val-fraction", "0.1", "--no-progress"]
    assert main(args) == 0
    m = json.loads((out / sh.MANIFEST_NAME).read_text())
    record = {"name": style, "sha256": tok.sha256, "vocab_size": tok.get_vocab_size(), "eot_id": tok.eos_id}
    assert m["tokenizer"] == {
        **record,
        "kind": "huggingface",
        "bos_id": tok.bos_id,
        "document_prefix": tok.document_prefix,
        "document_suffix": tok.document_suffix,
    }
    assert m["dtype"] == "uint16"
    assert m["document_separator"] == ("document_prefix_and_suffix" if style == "llama3" else "eot_after_each_document")
    # Every document is what the tokenizer's own encode(doc, add_eos=True) gives.
    for split, is_val in (("train", False), ("val", True)):
        docs = [d for i, d in enumerate(DOCS * 20) if is_val_document(i, 0.1) == is_val]
        assert split_tokens(out, split).tolist() == [t for d in docs for t in tok.encode(d, add_eos=True)]

    jc = job_config(str(out), seq_len=16, batch_size=4)
    ((inputs, labels),) = [next(iter(build_dataloader(1, 0, tok, jc)))]
    assert inputs["input"].shape == labels.shape == (4, 16)
    assert int(inputs["input"].max()) < tok.get_vocab_size()
    val = next(iter(build_validation_dataloader(1, 0, tok, job_config(str(out), seq_len=8, batch_size=1))))
    assert val[0]["input"].shape == (1, 8)


def test_vocabularies_beyond_uint16_get_uint32_shards(hf_big_dir, tmp_path):
    assert sh.dtype_for_vocab(65_536) == np.dtype("<u2")  # ids up to 65,535
    for vocab in (65_537, 128_256, 151_669):  # Llama 3, Qwen3
        assert sh.dtype_for_vocab(vocab) == np.dtype("<u4")
    tok = load_tokenizer(hf_big_dir)
    assert (tok.get_vocab_size(), tok.bos_id, tok.eos_id) == (70_002, 70_000, 70_001)
    src = write_jsonl(tmp_path / "docs.jsonl", DOCS)
    m = prepare([src], tmp_path / "out", tokenizer_path=hf_big_dir, val_fraction=0.0, workers=2, progress=False)
    tokens = split_tokens(tmp_path / "out", "train")
    assert m["dtype"] == "uint32" and m["splits"]["train"]["shards"][0]["max_token_id"] == 70_001
    assert tokens.tolist() == [t for d in DOCS for t in tok.encode(d, add_eos=True)]
    assert (tokens == 70_000).sum() == (tokens == 70_001).sum() == len(DOCS)
    jc = job_config(str(tmp_path / "out"), seq_len=8, batch_size=40)  # the whole epoch
    inputs, labels = next(iter(build_dataloader(1, 0, tok, jc, infinite=False)))
    assert int(inputs["input"].max()) == 70_001 and int(labels.max()) == 70_001


def test_shards_of_another_tokenizer_are_refused_naming_both(hf_dirs, tmp_path, tokenizer):
    src = write_jsonl(tmp_path / "docs.jsonl", DOCS * 4)
    prepare([src], tmp_path / "gpt2", val_fraction=0.0, workers=1, progress=False)
    prepare([src], tmp_path / "llama3", tokenizer_path=hf_dirs["llama3"], val_fraction=0.0, workers=1, progress=False)
    llama, qwen = load_tokenizer(hf_dirs["llama3"]), load_tokenizer(hf_dirs["qwen3"])
    cases = [("gpt2", tokenizer.sha256, llama), ("llama3", llama.sha256, qwen), ("llama3", llama.sha256, tokenizer)]
    for dataset, made_with, in_use in cases:
        with pytest.raises(ValueError) as e:
            build_dataloader(1, 0, in_use, job_config(str(tmp_path / dataset)))
        message = str(e.value)
        assert "\n" not in message
        assert f"prepared with tokenizer {dataset!r} (sha256 {made_with[:12]}...)" in message
        assert f"the tokenizer in use is {in_use.name!r} (sha256 {in_use.sha256[:12]}...)" in message


# Text that exercises every branch of the three regexes: contractions, letter / digit runs,
# punctuation with newlines after it, whitespace runs, \r\n, Unicode spaces, combining marks
# (NFC), CJK, emoji, and literal special tokens.
_FRAGMENTS = [
    "word", "Word", "x", "I", "'s", "'LL", "'ve", "don't", " ", "  ", "   ", "\n", "\n\n", "\r\n", "\t",
    " \n", ".", "...", "!?", ",", ";", "--", "(", ")", "123", "4567", "2024", "café", "e\u0301", "東京",
    "🙂", "\u3000", "\xa0", "\u2028", "Ⅻ", "½", "x1", "<|endoftext|>", "<|end_of_text|>", "naïve", "Ω",
]  # fmt: skip


def _adversarial_text(seed: int, n: int = 3000) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(_FRAGMENTS) for _ in range(n))


@pytest.mark.parametrize("style", ["llama3", "qwen3", "gpt2"])
def test_cuts_never_change_the_tokens(hf_dirs, style):
    tok = load_tokenizer(hf_dirs[style])
    cut = document_cut(tok)
    assert tok.cut_problem is None and cut is not None
    for seed in range(5):
        text = _adversarial_text(seed)
        whole = tok.encode_ordinary(text)
        points = [m.start() + 1 for m in cut.finditer(text)]
        assert len(points) > 100
        for i in points:  # every cut point alone, in its neighbourhood (the regexes look 1 ahead)
            window, k = text[max(0, i - 80) : i + 80], min(i, 80)
            assert tok.encode_ordinary(window[:k]) + tok.encode_ordinary(window[k:]) == tok.encode_ordinary(window), (
                style,
                seed,
                i,
            )
        pieces = split_long_text(text, piece_chars=40, cut=cut)  # and all at once
        assert len(pieces) > 20 and "".join(pieces) == text
        assert sum((tok.encode_ordinary(p) for p in pieces), []) == whole
    if style == "llama3":  # GPT-2's cut points are not safe here: ".\n" is one Llama 3 piece
        text = "End.\nNext"
        i = _CUT.search(text).start() + 1
        assert tok.encode_ordinary(text[:i]) + tok.encode_ordinary(text[i:]) != tok.encode_ordinary(text)


def test_unproven_pre_tokenizers_encode_documents_whole(hf_dirs, tmp_path, monkeypatch):
    import grt_titan.data.prepare as prep

    tok = load_tokenizer(hf_dirs["metaspace"])  # SentencePiece-style: "▁" before each piece
    assert "pre-tokenizer" in tok.cut_problem and document_cut(tok) is None
    doc = "the man was in want of a good wife and the estate was large " * 20
    assert split_long_text(doc, piece_chars=40, cut=document_cut(tok)) == [doc]
    monkeypatch.setattr(prep, "PIECE_CHARS", 40)
    monkeypatch.setattr(prep, "TASK_CHARS", 100)
    src = write_jsonl(tmp_path / "d.jsonl", [doc, "a short one"])
    prepare([src], tmp_path / "o", tokenizer_path=hf_dirs["metaspace"], val_fraction=0.0, workers=2, progress=False)
    expected = tok.encode(doc, add_eos=True) + tok.encode("a short one", add_eos=True)
    assert split_tokens(tmp_path / "o", "train").tolist() == expected


def test_long_documents_are_cut_exactly_through_prepare(hf_dirs, tmp_path, monkeypatch):
    import grt_titan.data.prepare as prep

    tok = load_tokenizer(hf_dirs["llama3"])
    docs = [_adversarial_text(7, 400), "short", _adversarial_text(8, 400)]
    monkeypatch.setattr(prep, "PIECE_CHARS", 64)
    monkeypatch.setattr(prep, "TASK_CHARS", 100)
    src = write_jsonl(tmp_path / "d.jsonl", docs)
    prepare([src], tmp_path / "o", tokenizer_path=hf_dirs["llama3"], val_fraction=0.0, workers=2, progress=False)
    # One BOS per document, not per piece.
    assert split_tokens(tmp_path / "o", "train").tolist() == sum((tok.encode(d, add_eos=True) for d in docs), [])


def test_default_corpus_is_prepared_with_the_hf_tokenizer(hf_dirs, tmp_path, monkeypatch, tokenizer):
    import gzip
    import hashlib

    corpus = tmp_path / "austen.jsonl.gz"  # a small stand-in for the embedded corpus
    with gzip.open(corpus, "wt", encoding="utf-8") as f:
        for d in DOCS * 10:
            f.write(json.dumps({"text": d}) + "\n")
    monkeypatch.setattr(default_corpus, "CORPUS_PATH", corpus)
    monkeypatch.setattr(default_corpus, "CORPUS_SHA256", hashlib.sha256(corpus.read_bytes()).hexdigest())
    tok = load_tokenizer(hf_dirs["qwen3"])
    cfg = DataConfig(cache_dir=str(tmp_path / "cache"), default_val_fraction=0.1)
    out = default_corpus.ensure_prepared(tok, cfg)
    assert json.loads((out / sh.MANIFEST_NAME).read_text())["tokenizer"]["sha256"] == tok.sha256
    assert default_corpus.ensure_prepared(tokenizer, cfg) != out  # one folder per tokenizer
    inputs, _ = next(iter(build_dataloader(1, 0, tok, job_config("grt_default", cache_dir=cfg.cache_dir))))
    assert inputs["input"].shape == (4, 16)


def test_export_carries_the_source_tokenizer(hf_dirs, tmp_path, tokenizer):
    from grt_titan.hf.convert import ExportError, _special_id, _write_tokenizer
    from grt_titan.model.args import GRTModelArgs

    source = tmp_path / "source"
    shutil.copytree(hf_dirs["llama3"], source)
    (source / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|end_of_text|>"}))
    tok = load_tokenizer(source)
    args = GRTModelArgs(vocab_size=512, max_seq_len=64)
    out = tmp_path / "export"
    out.mkdir()
    _write_tokenizer(out, tok, args)
    names = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
    assert sorted(p.name for p in out.iterdir()) == sorted(names)
    for name in names:
        assert (out / name).read_bytes() == (source / name).read_bytes()
    assert _special_id(tok, "eos_id", args) == 401 and _special_id(tok, "eos_id", GRTModelArgs(vocab_size=300)) is None
    # The export's tokenizer is the source's (analyze on it accepts the source's shards),
    # and transformers reads the folder to the same ids.
    again = export_tokenizer(out)
    assert isinstance(again, HFTokenizer) and again.sha256 == tok.sha256
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(out))
    assert hf("Hello world")["input_ids"] == tok.encode("Hello world")
    with pytest.raises(ExportError, match="402 ids but the model's vocab_size is 300"):
        _write_tokenizer(tmp_path, tok, GRTModelArgs(vocab_size=300))
    # A folder without tokenizer.json, or with the GPT-2 files export-hf derives from the
    # shipped ranks, is analysed with those ranks (as before).
    (tmp_path / "no_tokenizer").mkdir()
    assert isinstance(export_tokenizer(tmp_path / "no_tokenizer"), GPT2Tokenizer)
    gpt2_export = tmp_path / "gpt2_export"
    gpt2_export.mkdir()
    _write_tokenizer(gpt2_export, tokenizer, GRTModelArgs(max_seq_len=64))
    assert export_tokenizer(gpt2_export).sha256 == tokenizer.sha256
    small = GPT2Tokenizer(GPT2_4K_TIKTOKEN_PATH)  # the debug presets': told from GPT-2's by its size
    small_export = tmp_path / "gpt2_4k_export"
    small_export.mkdir()
    _write_tokenizer(small_export, small, GRTModelArgs(vocab_size=4097, max_seq_len=64))
    assert export_tokenizer(small_export).sha256 == small.sha256 and small.sha256 != tokenizer.sha256


def test_export_hf_writes_the_source_tokenizer_and_its_special_ids(hf_dirs, tmp_path):
    """The whole export path (write_hf_folder, as `grt-titan export-hf` calls it) with a
    Llama 3 style folder: its files, its BOS (not the EOS) in config.json and
    generation_config.json, and transformers' tokenizer on the export."""
    import torch
    from transformers import AutoTokenizer

    from grt_titan.hf.convert import write_hf_folder
    from grt_titan.model.args import GRTModelArgs
    from grt_titan.model.model import GRTModel

    tok = load_tokenizer(hf_dirs["llama3"])
    args = GRTModelArgs(block_style="llama", dim=32, n_heads=4, vocab_size=512, max_seq_len=64, multiple_of=16)
    torch.manual_seed(0)
    model = GRTModel(args)
    with torch.no_grad():
        model.init_weights()
    out = write_hf_folder(tmp_path / "export", model.state_dict(), args, tokenizer_path=hf_dirs["llama3"])
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (hf_dirs["llama3"] / name).read_bytes()
    config = json.loads((out / "config.json").read_text())
    generation = json.loads((out / "generation_config.json").read_text())
    assert tok.bos_id is not None and tok.bos_id != tok.eos_id
    assert (config["bos_token_id"], config["eos_token_id"]) == (tok.bos_id, tok.eos_id)
    assert (generation["bos_token_id"], generation["eos_token_id"]) == (tok.bos_id, tok.eos_id)
    assert AutoTokenizer.from_pretrained(str(out))("Hello world")["input_ids"] == tok.encode(
        "Hello world", add_bos=True
    )
