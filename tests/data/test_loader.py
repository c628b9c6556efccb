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
    return make_synthetic_dataset(tmp_path / "ds", tokenizer, S * 64 + 1, S * 8 + 1, shard_tokens=100)


def test_batch_shape_and_labels(synth, tokenizer):
    loader = build_dataloader(1, 0, tokenizer, job_config(str(synth)))
    ((inputs, labels),) = _take(loader, 1)
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
        starts = _starts(_take(build_dataloader(1, 0, tokenizer, job_config(str(synth), seed=seed)), 2 * 64 // B))
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
    ((inputs, labels),) = _take(build_dataloader(2, 0, tokenizer, jc), 1)
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

    assert hashlib.sha256(default_corpus.CORPUS_PATH.read_bytes()).hexdigest() == (default_corpus.CORPUS_SHA256)


# ---- the global data position: resume at another data-parallel degree -------------------


def _loaders(synth, tokenizer, degree, local, **options):
    jc = job_config(str(synth), batch_size=local, seed=5)
    for key, value in options.items():
        setattr(jc.data, key, value)
    return [build_dataloader(degree, r, tokenizer, jc) for r in range(degree)]


def _positions(loaders, steps):
    """Per rank, the global data positions read in `steps` steps (synthetic data: position d
    reads sequence perm[d mod 64] of epoch d // 64, whose first token is its stream offset)."""
    its = [iter(loader) for loader in loaders]
    return [_starts([next(it) for _ in range(steps)]) for it in its]


def _expected(seed, positions):
    """An independent computation of the sequences at global positions: numpy's permutation
    of epoch e seeded by (seed, e), as docs/data.md specifies."""
    import numpy as np

    return [int(np.random.default_rng([seed, d // 64]).permutation(64)[d % 64]) * S for d in positions]


# 64 sequences, a global batch of 8: 8 steps per epoch, so 10 steps cross an epoch boundary.
@pytest.mark.parametrize(
    "before,after",
    [((2, 4), (1, 8)), ((1, 8), (2, 4)), ((2, 4), (4, 2)), ((4, 2), (2, 4)), ((2, 4), (8, 1))],
    ids=["2->1", "1->2", "2->4", "4->2", "2->8"],
)
def test_resume_at_another_degree_reads_what_an_uninterrupted_run_at_that_degree_reads(synth, tokenizer, before, after):
    (a, la), (b, lb) = before, after
    first = _loaders(synth, tokenizer, a, la)
    _positions(first, 7)  # 7 steps of 8 sequences
    states = [loader.state_dict() for loader in first]
    assert len({s["global_position"] for s in states}) == 1  # one global entry, the same on every rank
    resumed = _loaders(synth, tokenizer, b, lb)
    for loader in resumed:
        loader.load_state_dict(states[0])
    got = _positions(resumed, 4)  # steps 8..11, across the epoch boundary
    uninterrupted = _positions(_loaders(synth, tokenizer, b, lb), 11)
    assert got == [rank[7 * lb :] for rank in uninterrupted]
    flat = sorted(x for rank in got for x in rank)
    assert flat == sorted(_expected(5, range(56, 88)))  # positions 56..87 once each: none twice, none skipped


def test_a_changed_global_batch_is_refused_unless_allowed(synth, tokenizer):
    first = _loaders(synth, tokenizer, 2, 4)
    _positions(first, 3)
    state = first[0].state_dict()
    with pytest.raises(
        ValueError,
        match=r"\[training\] global_batch_size: the checkpoint was saved with 8 "
        r"sequences per step, this run takes 4; .* allowed: the same global "
        r"batch .* or \[data\] allow_global_batch_change = true",
    ):
        _loaders(synth, tokenizer, 2, 2)[0].load_state_dict(state)
    allowed = _loaders(synth, tokenizer, 2, 2, allow_global_batch_change=True)
    for loader in allowed:
        loader.load_state_dict(state)
    got = _positions(allowed, 2)
    assert sorted(got[0] + got[1]) == sorted(_expected(5, range(24, 32)))  # continues at position 24


def test_another_data_order_is_refused(synth, tokenizer):
    state = _loaders(synth, tokenizer, 1, 4)[0].state_dict()
    with pytest.raises(
        ValueError,
        match=r"another data order \(\[data\] seed: seed = 6, saved 5\).*"
        r"--checkpoint.exclude_from_loading dataloader",
    ):
        build_dataloader(1, 0, tokenizer, job_config(str(synth), seed=6)).load_state_dict(state)


def test_skip_windows_are_never_read(synth, tokenizer):
    loaders = _loaders(synth, tokenizer, 2, 4)
    for loader in loaders:
        loader.set_skip_windows([(16, 24), (40, 48)])
    got = _positions(loaders, 4)
    assert sorted(got[0] + got[1]) == sorted(_expected(5, [*range(0, 16), *range(24, 40)]))
    assert loaders[0].position() == 48  # the next position jumps the second window too


def _dcp_round_trip(tmp_path, saved_state: dict, loader) -> None:
    """Save `saved_state` as a checkpoint's `dataloader` entry (one process) and load it into
    `loader` through grt_titan's checkpointer, which picks the state format the checkpoint has."""
    import torch.distributed.checkpoint as dcp

    from grt_titan.components.checkpoint import GRTCheckpointManager

    path = str(tmp_path / "step-3")
    dcp.save({"dataloader": saved_state}, checkpoint_id=path)
    manager = GRTCheckpointManager.__new__(GRTCheckpointManager)
    manager.states = {}
    manager.dcp_load({"dataloader": loader}, checkpoint_id=path, from_hf=False, from_quantized=False)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_old_per_rank_checkpoints_still_load_at_their_own_degree(synth, tokenizer, tmp_path, num_workers):
    from torchtitan.components.dataloader import ParallelAwareDataloader

    jc = job_config(str(synth), num_workers=num_workers, seed=7)
    old = [build_dataloader(2, r, tokenizer, jc) for r in (0, 1)]
    its = [iter(loader) for loader in old]
    for _ in range(3):
        for it in its:
            next(it)
    legacy = {k: v for loader in old for k, v in ParallelAwareDataloader.state_dict(loader).items()}
    assert set(legacy) == {"dp_rank_0", "dp_rank_1", "world_size"}  # torchtitan's per-rank format
    expected = [next(its[1]) for _ in range(3)]
    resumed = build_dataloader(2, 1, tokenizer, jc)
    _dcp_round_trip(tmp_path, legacy, resumed)
    assert _starts(_take(resumed, 3)) == _starts(expected)
    assert set(resumed.state_dict()) == {"global_position"}  # the next save is the global format
    with pytest.raises(
        ValueError,
        match=r"data position per data-parallel rank \(torchtitan's format, 2 ranks\), "
        r"which loads only at that degree; allowed: data-parallel degree 2",
    ):
        _dcp_round_trip(tmp_path / "other", legacy, build_dataloader(4, 3, tokenizer, jc))
    with pytest.raises(ValueError, match=r"allowed: data-parallel degree 2"):  # rank 0's key exists, the degree differs
        _dcp_round_trip(tmp_path / "fewer", legacy, build_dataloader(1, 0, tokenizer, jc))
