import gzip
import hashlib
import json

import pytest

from grt_titan.data.prepare import is_val_document, main, prepare, split_long_text
from grt_titan.tokenizer import ENDOFTEXT

from data_helpers import DOCS, split_tokens, write_jsonl


def _sha(out):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.iterdir())}


def test_round_trip(tmp_path, tokenizer):
    src = write_jsonl(tmp_path / "docs.jsonl", DOCS)
    out = tmp_path / "out"
    m = prepare([src], out, val_fraction=0.0, shard_tokens=7, workers=1, progress=False)
    tokens = split_tokens(out, "train")
    assert tokenizer.decode(tokens) == "".join(d + ENDOFTEXT for d in DOCS)
    assert (tokens == tokenizer.eos_id).sum() == len(DOCS)  # the literal one is ordinary text
    assert m["documents"] == m["splits"]["train"]["documents"] == len(DOCS)
    shards = m["splits"]["train"]["shards"]
    assert [s["tokens"] for s in shards[:-1]] == [7] * (len(shards) - 1)  # docs span shards
    assert sum(s["tokens"] for s in shards) == tokens.size == m["splits"]["train"]["tokens"]
    assert m["tokenizer"] == {"name": "gpt2", "sha256": tokenizer.sha256, "vocab_size": 50257, "eot_id": 50256}
    assert m["dtype"] == "uint16" and m["splits"]["val"]["tokens"] == 0


def test_val_split_is_an_even_fixed_fraction(tmp_path, tokenizer):
    docs = [f"Document number {i}." for i in range(40)]
    src = write_jsonl(tmp_path / "docs.jsonl", docs)
    m = prepare([src], tmp_path / "out", val_fraction=0.1, workers=1, progress=False)
    val = [d for i, d in enumerate(docs) if is_val_document(i, 0.1)]
    assert len(val) == 4 and m["splits"]["val"]["documents"] == 4
    assert [i for i in range(40) if is_val_document(i, 0.1)] == [4, 14, 24, 34]
    train = [d for d in docs if d not in val]
    assert tokenizer.decode(split_tokens(tmp_path / "out", "val")) == "".join(d + ENDOFTEXT for d in val)
    assert tokenizer.decode(split_tokens(tmp_path / "out", "train")) == "".join(d + ENDOFTEXT for d in train)


def test_deterministic_and_independent_of_workers(tmp_path):
    src = write_jsonl(tmp_path / "docs.jsonl", DOCS * 30)
    kw = dict(val_fraction=0.1, shard_tokens=500, progress=False)
    a = prepare([src], tmp_path / "a", workers=1, **kw)
    b = prepare([src], tmp_path / "b", workers=2, **kw)
    assert len(a["splits"]["train"]["shards"]) > 1 and b == a  # the same manifest, returned
    assert _sha(tmp_path / "a") == _sha(tmp_path / "b")  # shards and manifest, byte for byte


def test_long_documents_are_cut_exactly(tokenizer):
    # \x1c and \u3000: whitespace for Python's str.isspace, not both for the tokenizer.
    text = (
        "Whitespace  runs,\n\n\nnew\tlines\u3000ideographic\x1c \x1cseparators 12 345!! "
        "and ... punctuation'' 's contractions.  \n "
    ) * 40
    pieces = split_long_text(text, piece_chars=50)
    assert len(pieces) > 20 and "".join(pieces) == text
    assert sum((tokenizer.encode(p) for p in pieces), []) == tokenizer.encode(text)
    assert split_long_text("x" * 500, piece_chars=50) == ["x" * 500]  # no cut point


def test_cut_documents_through_prepare(tmp_path, tokenizer, monkeypatch):
    import grt_titan.data.prepare as prep

    docs = ["A long  one,\n\nwith paragraphs.\t" * 50, "short", "x" * 300]
    src = write_jsonl(tmp_path / "d.jsonl", docs)
    monkeypatch.setattr(prep, "PIECE_CHARS", 64)
    monkeypatch.setattr(prep, "TASK_CHARS", 100)
    prepare([src], tmp_path / "o", val_fraction=0.0, workers=2, progress=False)
    assert split_tokens(tmp_path / "o", "train").tolist() == sum((tokenizer.encode(d, add_eos=True) for d in docs), [])


def test_input_formats_agree(tmp_path):
    """.txt, .jsonl.gz, .parquet, a datasets save_to_disk folder, and a folder of them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = DOCS[:3]
    txt_dir = tmp_path / "txt"
    txt_dir.mkdir()
    for i, d in enumerate(docs):  # one .txt file = one document, files in name order
        (txt_dir / f"{i:02d}.txt").write_text(d, encoding="utf-8")
    (txt_dir / "notes.md").write_text("ignored: not an input type")
    with gzip.open(tmp_path / "d.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"body": d}) + "\n" for d in docs)
    pq.write_table(pa.table({"body": docs}), tmp_path / "d.parquet", row_group_size=2)

    outs = {}
    for name, inp, field in [
        ("txt", txt_dir, "text"),
        ("jsonl", tmp_path / "d.jsonl.gz", "body"),
        ("parquet", tmp_path / "d.parquet", "body"),
    ]:
        prepare([inp], tmp_path / f"o_{name}", text_field=field, val_fraction=0.0, workers=1, progress=False)
        outs[name] = split_tokens(tmp_path / f"o_{name}", "train").tolist()
    assert outs["txt"] == outs["jsonl"] == outs["parquet"]


def test_hf_datasets_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    docs = DOCS[:4]
    datasets.Dataset.from_dict({"text": docs}).save_to_disk(str(tmp_path / "hf"))
    prepare([tmp_path / "hf"], tmp_path / "o_hf", val_fraction=0.0, workers=1, progress=False)
    write_jsonl(tmp_path / "d.jsonl", docs)
    prepare([tmp_path / "d.jsonl"], tmp_path / "o_j", val_fraction=0.0, workers=1, progress=False)
    assert split_tokens(tmp_path / "o_hf", "train").tolist() == split_tokens(tmp_path / "o_j", "train").tolist()


def test_cli(tmp_path, capsys):
    src = write_jsonl(tmp_path / "docs.jsonl", DOCS)
    rc = main(
        [
            str(src),
            "--out",
            str(tmp_path / "out"),
            "--val-fraction",
            "0.2",
            "--workers",
            "2",
            "--shard-tokens",
            "50",
            "--no-progress",
        ]
    )
    assert rc == 0
    assert "6 documents" in capsys.readouterr().out
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["splits"]["val"]["documents"] == 1 and m["shard_tokens"] == 50
    rc = main([str(src), "--out", str(tmp_path / "out"), "--no-progress"])
    assert rc == 2 and "--overwrite" in capsys.readouterr().err
    assert main([str(src), "--out", str(tmp_path / "out"), "--overwrite", "--no-progress"]) == 0
