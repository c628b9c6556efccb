import itertools
import os

import pytest
import torch

from grt_titan.data import default_corpus
from grt_titan.data.loader import build_dataloader, build_validation_dataloader

from data_helpers import job_config, make_synthetic_dataset

S, B = 16, 4  # seq_len, local batch size


def _take(loader, n):
    return list(itertools.islice(iter(loader), n))


def _starts(batches):
    """First input token of each sample = its stream position (synthetic data)."""
    return [int(x) for inputs, _ in batches for x in inputs["input"][:, 0]]


@pytest.fixture
def synth(tmp_path, tokenizer):
    # 16 * 64 + 1 tokens -> exactly 64 sequences; shards of 100 tokens, so windows straddle.
    return make_synthetic_dataset(tmp_path / "ds", tokenizer, S * 64 + 1, S * 8 + 1,
                                  shard_tokens=100)


def test_batch_shape_and_labels(synth, tokenizer):
    loader = build_dataloader(1, 0, tokenizer, job_config(str(synth)))
    (inputs, labels), = _take(loader, 1)
    x = inputs["input"]
    assert x.shape == labels.shape == (B, S) and x.dtype == labels.dtype == torch.int64
    for row, lab in zip(x, labels):  # window g: positions g*S .. g*S + S
        start = int(row[0])
        assert start % S == 0
        assert row.tolist() == list(range(start, start + S))
        assert lab.tolist() == list(range(start + 1, start + S + 1))


def test_two_ranks_cover_the_split_once(synth, tokenizer):
    jc = job_config(str(synth), seed=3)
    per_rank = [_starts(build_dataloader(2, r, tokenizer, jc, infinite=False)) for r in (0, 1)]
    assert len(per_rank[0]) == len(per_rank[1]) == 32
    assert not set(per_rank[0]) & set(per_rank[1])
    assert sorted(per_rank[0] + per_rank[1]) == [g * S for g in range(64)]


def test_epochs_reshuffle_from_the_seed(synth, tokenizer):
    def epochs(seed):
        starts = _starts(_take(build_dataloader(1, 0, tokenizer, job_config(str(synth), seed=seed)),
                               2 * 64 // B))
        return starts[:64], starts[64:]

    e0, e1 = epochs(0)
    assert sorted(e0) == sorted(e1) == [g * S for g in range(64)]  # each epoch: every sequence
    assert e0 != e1  # reshuffled
    assert epochs(0) == (e0, e1)  # from the seed alone
    assert epochs(1)[0] != e0


def test_batches_do_not_depend_on_num_workers(synth, tokenizer):
    ref = _take(build_dataloader(1, 0, tokenizer, job_config(str(synth))), 20)
    got = _take(build_dataloader(1, 0, tokenizer, job_config(str(synth), num_workers=2)), 20)
    for (a, la), (b, lb) in zip(ref, got):
        assert torch.equal(a["input"], b["input"]) and torch.equal(la, lb)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_resume_matches_uninterrupted(synth, tokenizer, num_workers):
    jc = job_config(str(synth), num_workers=num_workers, seed=7)
    full = build_dataloader(2, 1, tokenizer, jc)  # 32 sequences per rank = 8 batches per epoch
    it = iter(full)
    for _ in range(6):
        next(it)
    state = full.state_dict()
    expected = [next(it) for _ in range(5)]  # crosses into the next epoch

    resumed = build_dataloader(2, 1, tokenizer, jc)
    resumed.load_state_dict(state)
    got = _take(resumed, 5)
    assert _starts(got) == _starts(expected)
    for (a, la), (b, lb) in zip(got, expected):
        assert torch.equal(a["input"], b["input"]) and torch.equal(la, lb)


def test_validation_split_is_fixed(synth, tokenizer):
    jc = job_config(str(synth))
    val = build_validation_dataloader(1, 0, tokenizer, jc, infinite=False)
    first = _starts(val)
    assert first == [g * S for g in range(8)]  # the val split, in stream order
    assert _starts(val) == first  # every pass scores the same sequences
    assert _starts(build_validation_dataloader(1, 0, tokenizer, jc, infinite=False)) == first


def test_dataset_path_overrides(synth, tokenizer):
    jc = job_config("my_corpus")
    jc.training.dataset_path = str(synth)
    assert len(_take(build_dataloader(1, 0, tokenizer, jc), 1)) == 1


def test_embedded_default_corpus(tmp_path, tokenizer):
    jc = job_config("grt_default", seq_len=256, cache_dir=str(tmp_path / "cache"))
    jc.validation.dataset = "grt_default"
    (inputs, labels), = _take(build_dataloader(2, 0, tokenizer, jc), 1)
    assert inputs["input"].shape == (B, 256)
    assert torch.equal(inputs["input"][:, 1:], labels[:, :-1])
    text = tokenizer.decode(inputs["input"][0])
    assert len(text.split()) > 100  # English prose
    (prepared,) = (tmp_path / "cache").glob("grt_default-*")
    manifest = prepared / "manifest.json"
    mtime = os.stat(manifest).st_mtime_ns
    val = _take(build_validation_dataloader(2, 1, tokenizer, jc, infinite=False), 2)
    assert len(val) == 2 and os.stat(manifest).st_mtime_ns == mtime  # prepared once
    assert not [p for p in (tmp_path / "cache").iterdir() if ".tmp-" in p.name]


def test_default_corpus_asset():
    import hashlib

    assert hashlib.sha256(default_corpus.CORPUS_PATH.read_bytes()).hexdigest() == (
        default_corpus.CORPUS_SHA256)
