"""Every bad input gets its own clear error naming the file, and leaves nothing behind."""

import json

import numpy as np
import pytest

from grt_titan.data import shards as sh
from grt_titan.data.loader import build_dataloader, build_validation_dataloader
from grt_titan.data.prepare import prepare

from data_helpers import DOCS, job_config, make_synthetic_dataset, write_jsonl


def _listing(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _prepare_fails(tmp_path, inputs, exc, match, **kw):
    """prepare raises ``exc`` matching ``match`` and leaves the folder as it was."""
    before = _listing(tmp_path)
    with pytest.raises(exc, match=match):
        prepare(inputs, tmp_path / "out", progress=False, **kw)
    assert _listing(tmp_path) == before  # no out, no temporary folder


def test_missing_path(tmp_path):
    _prepare_fails(tmp_path, [tmp_path / "nope.jsonl"], FileNotFoundError, r"nope\.jsonl.*no such file")


@pytest.mark.parametrize("kind", ["empty_txt", "empty_docs", "empty_folder"])
def test_empty_input(tmp_path, kind):
    if kind == "empty_txt":
        (tmp_path / "a.txt").write_text("")
        inp = tmp_path / "a.txt"
        match = "empty input"
    elif kind == "empty_docs":
        inp = write_jsonl(tmp_path / "a.jsonl", ["", ""])
        match = r"empty input.*2 empty"
    else:
        (tmp_path / "d").mkdir()
        (tmp_path / "d" / "readme.md").write_text("not an input")
        inp = tmp_path / "d"
        match = r"holds no inputs"
    _prepare_fails(tmp_path, [inp], ValueError, match)


@pytest.mark.parametrize("workers", [1, 2])
def test_invalid_utf8_fails_by_default(tmp_path, workers):
    src = write_jsonl(tmp_path / "a.jsonl", DOCS * 40)
    with open(src, "ab") as f:
        f.write(b'{"text": "bad \xff\xfe bytes"}\n')
    n = len(DOCS) * 40 + 1
    _prepare_fails(tmp_path, [src], ValueError, rf"a\.jsonl:{n}: invalid UTF-8 .*--invalid-utf8 skip", workers=workers)


def test_invalid_utf8_skip_counts(tmp_path, tokenizer):
    src = write_jsonl(tmp_path / "a.jsonl", DOCS[:2])
    with open(src, "ab") as f:
        f.write(b'{"text": "bad \xff bytes"}\n{"text": "lone \\ud800 surrogate"}\n')
    (tmp_path / "b.txt").write_bytes(b"latin-1 caf\xe9")
    m = prepare(
        [src, tmp_path / "b.txt"], tmp_path / "out", invalid_utf8="skip", val_fraction=0.0, workers=1, progress=False
    )
    assert m["skipped_documents"]["invalid_utf8"] == 3 and m["documents"] == 2


def test_unsupported_and_malformed_inputs(tmp_path):
    (tmp_path / "a.csv").write_text("text\nhello\n")
    _prepare_fails(tmp_path, [tmp_path / "a.csv"], ValueError, r"a\.csv.*unsupported file type")
    (tmp_path / "b.jsonl").write_text('{"text": "ok"}\n{"body": "x"}\n')
    _prepare_fails(tmp_path, [tmp_path / "b.jsonl"], ValueError, r"b\.jsonl:2: no text field 'text'.*--text-field")
    (tmp_path / "c.jsonl").write_text('{"text": "ok"}\n{not json\n')
    _prepare_fails(tmp_path, [tmp_path / "c.jsonl"], ValueError, r"c\.jsonl:2: not valid JSON")
    (tmp_path / "d.parquet").write_bytes(b"not parquet at all")
    _prepare_fails(tmp_path, [tmp_path / "d.parquet"], ValueError, r"d\.parquet: not a readable")


def test_existing_out_is_kept(tmp_path):
    src = write_jsonl(tmp_path / "a.jsonl", DOCS)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    _prepare_fails(tmp_path, [src], FileExistsError, "--overwrite")


def test_bad_options(tmp_path):
    src = write_jsonl(tmp_path / "a.jsonl", DOCS)
    _prepare_fails(tmp_path, [src], ValueError, r"--val-fraction 1\.5", val_fraction=1.5)
    one = write_jsonl(tmp_path / "one.jsonl", ["only"])
    _prepare_fails(tmp_path, [one], ValueError, "went to the val split", val_fraction=0.9)


# --- loader-side checks of a prepared dataset -------------------------------------------


@pytest.fixture
def synth(tmp_path, tokenizer):
    return make_synthetic_dataset(tmp_path / "ds", tokenizer, 16 * 20 + 1, 16 * 2 + 1, shard_tokens=100)


def _edit_manifest(root, fn):
    path = root / sh.MANIFEST_NAME
    m = json.loads(path.read_text())
    fn(m)
    path.write_text(json.dumps(m))


def test_missing_dataset(tmp_path, tokenizer):
    with pytest.raises(FileNotFoundError, match=r"\[training\] dataset = .*c4_test.*grt_default"):
        build_dataloader(1, 0, tokenizer, job_config("c4_test"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"manifest\.json missing.*grt-titan prepare"):
        build_dataloader(1, 0, tokenizer, job_config(str(tmp_path / "empty")))


def test_other_tokenizer(synth, tokenizer):
    _edit_manifest(synth, lambda m: m["tokenizer"].update(name="other", sha256="ab" * 32))
    with pytest.raises(ValueError, match=r"manifest\.json: prepared with tokenizer 'other'"):
        build_dataloader(1, 0, tokenizer, job_config(str(synth)))


def test_token_id_beyond_vocab(synth, tokenizer):
    # A shard the manifest says holds a too-large id...
    _edit_manifest(synth, lambda m: m["splits"]["train"]["shards"][1].update(max_token_id=50257))
    with pytest.raises(ValueError, match=r"train_000001\.bin: holds token id 50257 >= .*50257"):
        build_dataloader(1, 0, tokenizer, job_config(str(synth)))
    # ...and one that holds it although the manifest does not say so (caught on read).
    _edit_manifest(synth, lambda m: m["splits"]["train"]["shards"][1].update(max_token_id=199))
    data = np.fromfile(synth / "train_000001.bin", dtype="<u2")
    data[5] = 60000
    data.tofile(synth / "train_000001.bin")
    jc = job_config(str(synth), batch_size=20)  # one epoch in one batch: reads every window
    with pytest.raises(ValueError, match=r"train_000001\.bin: token id 60000 at position 5"):
        next(iter(build_dataloader(1, 0, tokenizer, jc)))


def test_split_too_short(synth, tokenizer):
    with pytest.raises(ValueError, match=r"split 'train' has 321 tokens, 0 sequences of seq_len 4"):
        build_dataloader(1, 0, tokenizer, job_config(str(synth), seq_len=400))
    with pytest.raises(ValueError, match=r"split 'val' has 33 tokens.*2 data-parallel rank"):
        build_validation_dataloader(2, 0, tokenizer, job_config(str(synth), seq_len=32))


def test_truncated_shard(synth, tokenizer):
    path = synth / "train_000002.bin"
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(ValueError, match=r"train_000002\.bin: 198 bytes, .* lists 100 uint16"):
        build_dataloader(1, 0, tokenizer, job_config(str(synth)))
    path.unlink()
    with pytest.raises(FileNotFoundError, match=r"train_000002\.bin: shard listed in .* missing"):
        build_dataloader(1, 0, tokenizer, job_config(str(synth)))
