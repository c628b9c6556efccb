"""Prompt/completion records (grt_titan/data/records.py): prepared with a loss mask, packed
whole, labels counted on completions only; the loss is the cross-entropy over completion
tokens, computed here by hand; the loader resumes exactly; bad records are named."""

import itertools
import json

import numpy as np
import pytest
import torch
from torchtitan.components.loss import IGNORE_INDEX

from grt_titan.data import records
from grt_titan.data.loader import build_dataloader, build_validation_dataloader
from grt_titan.data.prepare import is_val_document, prepare
from grt_titan.tokenizer import load_tokenizer

from data_helpers import chat_tokenizer, job_config

S, B = 64, 2


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def sample_records(n=24):
    """Prompts and completions of varied lengths (1 to 12 words and 1 to 4)."""
    rows = []
    for i in range(n):
        prompt = " ".join(f"p{i}w{k}" for k in range(1 + i % 12))
        completion = " " + " ".join(f"c{i}w{k}" for k in range(1 + i % 4))
        rows.append({"prompt": prompt, "completion": completion, "depth": 1 + i % 3, "steps": ["s"] * (1 + i % 3)})
    return rows


@pytest.fixture
def sft(tmp_path, tokenizer):
    rows = sample_records()
    src = write_jsonl(tmp_path / "sft.jsonl", rows)
    prepare([src], tmp_path / "ds", val_fraction=0.25, workers=1, progress=False)
    return tmp_path / "ds", rows


def _take(loader, n):
    return list(itertools.islice(iter(loader), n))


def test_prepare_writes_tokens_mask_and_metadata(sft, tokenizer):
    ds, rows = sft
    manifest = json.loads((ds / "manifest.json").read_text())
    assert manifest["kind"] == "prompt_completion" and manifest["loss_mask"] == "completion"
    train = manifest["splits"]["train"]
    assert manifest["splits"]["val"]["records"] == 6 and train["records"] == 18
    tokens = np.fromfile(ds / "train_000000.bin", dtype="<u2")
    mask = np.fromfile(ds / "train_000000.mask.bin", dtype="<u1")
    starts = np.fromfile(ds / "train_records.bin", dtype="<i8")
    meta = [json.loads(line) for line in (ds / "train_meta.jsonl").read_text().splitlines()]
    train_rows = [r for i, r in enumerate(rows) if not is_val_document(i, 0.25)]
    for k, row in enumerate(train_rows):  # by hand: prompt ids (mask 0), completion ids + EOS (mask 1)
        prompt, completion = tokenizer.encode(row["prompt"]), tokenizer.encode(row["completion"])
        a, b = starts[k], starts[k + 1]
        assert tokens[a:b].tolist() == prompt + completion + [tokenizer.eos_id]
        assert mask[a:b].tolist() == [0] * len(prompt) + [1] * (len(completion) + 1)
        assert meta[k]["depth"] == row["depth"] and meta[k]["steps"] == row["steps"]
        assert meta[k]["where"].endswith(f"sft.jsonl:{rows.index(row) + 1}")


def test_loader_packs_whole_records_and_counts_completions_only(sft, tokenizer):
    ds, _ = sft
    loader = build_dataloader(1, 0, tokenizer, job_config(str(ds), seq_len=S, batch_size=B), infinite=False)
    stream, dataset = loader.dataset.stream, loader.dataset
    starts = set(stream.record_starts.tolist())
    assert set(dataset.pack_starts.tolist()) <= starts and set(dataset.pack_ends.tolist()) <= starts
    assert (dataset.pack_ends - dataset.pack_starts).max() <= S + 1
    seen = 0
    for inputs, labels in loader:
        for x, y in zip(inputs["input"], labels):
            g = dataset.sequence_index(seen)
            a, b = int(dataset.pack_starts[g]), int(dataset.pack_ends[g])
            window = stream.read(a, b - a)
            counted = stream.mask.read(a, b - a)[1:].astype(bool)
            n = min(b - a, S)
            assert x[:n].tolist() == window[:n].tolist()
            expected = np.full(S, IGNORE_INDEX)
            expected[: b - a - 1][counted] = window[1:][counted]
            assert y.tolist() == expected.tolist()
            seen += 1
    assert seen == dataset.num_sequences  # one epoch: every packed sequence once
    assert sum(int(b) - int(a) for a, b in zip(dataset.pack_starts, dataset.pack_ends)) == stream.num_tokens


def test_validation_reads_the_val_records_with_their_mask(sft, tokenizer):
    ds, _ = sft
    val = build_validation_dataloader(1, 0, tokenizer, job_config(str(ds), seq_len=S, batch_size=1))
    labels = torch.cat([y for _, y in val])
    mask = np.fromfile(ds / "val_000000.mask.bin", dtype="<u1")
    # every completion token (and EOS) of the val split is a label once, nothing else is
    assert int((labels != IGNORE_INDEX).sum()) == int(mask.sum())


def test_loss_is_the_cross_entropy_over_completion_tokens(sft, tokenizer):
    """torchtitan's summed CE over the batch's labels / its counted tokens (what the trainer
    divides by) equals -mean log p(completion token) computed by hand; prompt targets,
    whatever their ids, change neither the loss nor the gradients."""
    from grt_titan.components.loss import grt_loss
    from grt_titan.model import grt_flavors
    from grt_titan.model.model import GRTModel

    ds, _ = sft
    ((inputs, labels),) = _take(build_dataloader(1, 0, tokenizer, job_config(str(ds), seq_len=S, batch_size=B)), 1)
    args = grt_flavors["debug"].replace(vocab_size=tokenizer.get_vocab_size(), max_seq_len=S)
    torch.manual_seed(0)
    model = GRTModel(args)
    with torch.no_grad():
        model.init_weights()
    model.eval()  # no state noise: two forwards agree bitwise

    def loss_and_grads(lab):
        model.zero_grad()
        logits = model(inputs["input"], num_recurrences=2)
        loss = grt_loss(logits, lab) / (lab != IGNORE_INDEX).sum()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None], logits.detach()

    loss, grads, logits = loss_and_grads(labels)
    counted = labels != IGNORE_INDEX
    log_probs = torch.log_softmax(logits.double(), dim=-1)
    by_hand = -log_probs[counted].gather(1, labels[counted].unsqueeze(1)).mean()
    assert 0 < counted.sum() < counted.numel()
    assert torch.allclose(loss.double(), by_hand, rtol=1e-5)
    # The prompts' own next tokens as targets: ignored wherever the mask says so.
    raw = inputs["input"].roll(-1, dims=1)
    other = torch.where(counted, labels, torch.randint_like(labels, 0, 1000))
    masked_other = other.masked_fill(~counted, IGNORE_INDEX)
    loss2, grads2, _ = loss_and_grads(masked_other)
    assert torch.equal(loss, loss2) and all(torch.equal(g, h) for g, h in zip(grads, grads2))
    unmasked, _, _ = loss_and_grads(torch.where(counted, labels, raw))
    assert not torch.allclose(unmasked, loss)  # the mask is what made them equal


@pytest.mark.parametrize("num_workers", [0, 1])
def test_resume_mid_epoch_is_exact_with_masks(sft, tokenizer, num_workers):
    ds, _ = sft
    jc = job_config(str(ds), seq_len=S, batch_size=B, num_workers=num_workers, seed=5)
    full = build_dataloader(1, 0, tokenizer, jc)
    per_epoch = len(full.dataset) // B
    it = iter(full)
    for _ in range(per_epoch - 1):
        next(it)
    state = full.state_dict()
    expected = [next(it) for _ in range(3)]  # crosses into the next epoch
    resumed = build_dataloader(1, 0, tokenizer, jc)
    resumed.load_state_dict(state)
    for (a, la), (b, lb) in zip(_take(resumed, 3), expected):
        assert torch.equal(a["input"], b["input"]) and torch.equal(la, lb)


def test_documents_datasets_load_as_before(tmp_path, tokenizer):
    src = write_jsonl(tmp_path / "docs.jsonl", [{"text": f"document {i} " * 20} for i in range(8)])
    prepare([src], tmp_path / "ds", val_fraction=0.25, workers=1, progress=False)
    manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert "kind" not in manifest and "mask_shards" not in manifest["splits"]["train"]
    loader = build_dataloader(1, 0, tokenizer, job_config(str(tmp_path / "ds"), seq_len=8, batch_size=1))
    (inputs, labels), *_ = _take(loader, 1)
    assert loader.dataset.stream.record_starts is None and (labels != IGNORE_INDEX).all()
    assert torch.equal(inputs["input"][0, 1:], labels[0, :-1])  # the plain shifted window


def test_a_record_longer_than_seq_len_is_named_or_dropped(sft, tokenizer):
    ds, rows = sft
    longest = max(range(len(rows)), key=lambda i: len(tokenizer.encode(rows[i]["prompt"] + rows[i]["completion"])))
    jc = job_config(str(ds), seq_len=12, batch_size=1)
    with pytest.raises(ValueError, match=r"sft\.jsonl:\d+: a prompt/completion record of \d+ tokens does not fit "):
        build_dataloader(1, 0, tokenizer, jc)
    jc.data.long_records = "drop"
    loader = build_dataloader(1, 0, tokenizer, jc)
    assert loader.dataset.dropped_records > 0 and longest >= 0
    assert ((loader.dataset.pack_ends - loader.dataset.pack_starts) <= 13).all() and loader.dataset.num_sequences > 0


BAD = [
    ({"completion": " x"}, r"bad\.jsonl:2: field 'prompt' is missing"),
    ({"prompt": "", "completion": " x"}, r"bad\.jsonl:2: field 'prompt' is empty"),
    ({"prompt": "p", "completion": 3}, r"bad\.jsonl:2: field 'completion' is int; allowed: a non-empty string"),
    (
        {"prompt": "p", "completion": " x", "depth": 2, "steps": ["a"]},
        r"bad\.jsonl:2: field 'steps' has 1 targets but 'depth' is 2",
    ),
    ({"prompt": "p", "completion": " x", "depth": 0}, r"bad\.jsonl:2: field 'depth' is 0; allowed: an integer >= 1"),
    ("{not json", r"bad\.jsonl:2: not valid JSON"),
    ({"turns": []}, r"bad\.jsonl:2: field 'turns' must be a non-empty list"),
    ({"turns": [{"prompt": "p", "completion": " x"}], "depth": 1}, r"bad\.jsonl:2: field 'depth' beside 'turns'"),
    (
        {"turns": [{"prompt": "p", "completion": " x"}, {"prompt": "q"}]},
        r"bad\.jsonl:2 turn 1: field 'completion' is missing",
    ),
    (
        {"turns": [{"prompt": "p", "completion": " x", "depth": 2, "steps": ["a"]}]},
        r"bad\.jsonl:2 turn 0: field 'steps' has 1 targets but 'depth' is 2",
    ),
]


@pytest.mark.parametrize("row, message", BAD, ids=[m.split(": ")[1][:24] for _, m in BAD])
def test_a_bad_record_names_its_file_line_and_field_and_writes_nothing(tmp_path, row, message):
    src = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "p", "completion": " c"}, row])
    with pytest.raises(ValueError, match=message):
        prepare([src], tmp_path / "out", workers=1, progress=False)
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["bad.jsonl"]


def test_records_and_documents_do_not_mix(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [{"prompt": "p", "completion": " c"}])
    b = write_jsonl(tmp_path / "b.jsonl", [{"text": "a document"}])
    with pytest.raises(ValueError, match=r"b\.jsonl: not prompt/completion records, but .*a\.jsonl is"):
        prepare([a, b], tmp_path / "out", workers=1, progress=False)


def test_packing_by_hand():
    starts = np.array([0, 3, 5, 12, 14, 15])  # records of 3, 2, 7, 2, 1 tokens
    seq_starts, seq_ends, too_long = records.pack(starts, capacity=5)
    assert list(zip(seq_starts, seq_ends)) == [(0, 5), (12, 15)] and too_long.tolist() == [2]
    seq_starts, seq_ends, too_long = records.pack(starts, capacity=5, together=False)
    assert list(zip(seq_starts, seq_ends)) == [(0, 3), (3, 5), (12, 14), (14, 15)] and too_long.tolist() == [2]


def test_one_record_per_sequence_sees_no_other_record(sft, tokenizer):
    """[data] pack_records = false: each sequence is one whole record, then padding that no
    label counts, so no record attends to another's tokens; every record once per epoch."""
    ds, _ = sft
    jc = job_config(str(ds), seq_len=S, batch_size=B)
    jc.data.pack_records = False
    loader = build_dataloader(1, 0, tokenizer, jc, infinite=False)
    stream, dataset = loader.dataset.stream, loader.dataset
    record_starts = stream.record_starts
    assert dataset.num_sequences == len(record_starts) - 1  # every record fits S + 1 here
    seen = 0
    for inputs, labels in loader:
        for x, y in zip(inputs["input"], labels):
            k = int(np.searchsorted(record_starts, dataset.pack_starts[dataset.sequence_index(seen)]))
            a, b = int(record_starts[k]), int(record_starts[k + 1])
            n = min(b - a, S)
            assert x[:n].tolist() == stream.read(a, b - a)[:n].tolist()
            assert (x[b - a :] == 0).all() and (y[b - a - 1 :] == IGNORE_INDEX).all()  # padding, uncounted
            seen += 1
    assert seen == dataset.num_sequences
    packed = build_dataloader(1, 0, tokenizer, job_config(str(ds), seq_len=S, batch_size=B), infinite=False)
    assert packed.dataset.num_sequences < dataset.num_sequences  # packing put several records together


def test_chat_records_count_assistant_turns_only(tmp_path, hf_dirs):
    folder = chat_tokenizer(hf_dirs["qwen3"], tmp_path / "chat_tokenizer")
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is two and two?"},
        {"role": "assistant", "content": "Four."},
        {"role": "user", "content": "And <|im_end|> three?"},  # a special token's text in content
        {"role": "assistant", "content": "Seven, if you add them."},
    ]
    src = write_jsonl(
        tmp_path / "chat.jsonl", [{"messages": chat, "depth": 1}, {"prompt": "Hi", "completion": " there"}]
    )
    prepare([src], tmp_path / "ds", tokenizer_path=folder, val_fraction=0.0, workers=1, progress=False)
    tokenizer = load_tokenizer(folder)
    tokens = np.fromfile(tmp_path / "ds" / "train_000000.bin", dtype="<u2")
    mask = np.fromfile(tmp_path / "ds" / "train_000000.mask.bin", dtype="<u1")
    starts = np.fromfile(tmp_path / "ds" / "train_records.bin", dtype="<i8")
    ids, counted = tokens[: starts[1]], mask[: starts[1]].astype(bool)
    rendered = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in chat)  # ChatML by hand
    assert tokenizer.decode(ids.tolist()) == rendered
    assert tokenizer.decode(ids[counted].tolist()) == "Four.<|im_end|>\nSeven, if you add them.<|im_end|>\n"
    im_start = tokenizer.tokenizer.token_to_id("<|im_start|>")
    assert int((ids == im_start).sum()) == 5  # the template's special tokens are special ids
    # The prompt/completion record beside it: as before (the tokenizer's document specials).
    assert mask[starts[1] : starts[2]].tolist()[-1] == 1 and mask[starts[1]] == 0


def test_chat_records_need_a_chat_template(tmp_path):
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    src = write_jsonl(tmp_path / "chat.jsonl", [{"messages": chat}])
    with pytest.raises(
        ValueError, match=r"chat\.jsonl:1: a chat record \(messages\) needs a tokenizer with a chat template"
    ):
        prepare([src], tmp_path / "out", workers=1, progress=False)
    src = write_jsonl(tmp_path / "chat.jsonl", [{"messages": chat[:1]}])
    with pytest.raises(ValueError, match=r"chat\.jsonl:1: field 'messages' has no assistant turn"):
        prepare([src], tmp_path / "out", workers=1, progress=False)
    assert not (tmp_path / "out").exists()


def test_a_record_of_many_answers_counts_each_completion(tokenizer):
    """`turns`: the turns end to end between the document specials, the mask 1 on each
    completion and the end token, 0 on every prompt; by hand."""
    turns = [
        {"prompt": "Table: a b. Query one:", "completion": " first"},
        {"prompt": " Query two:", "completion": " second"},
    ]
    record = records.check_record({"turns": turns}, "t.jsonl:1")
    prefix, suffix = [], [tokenizer.eos_id]
    encoded = records.encode_records(tokenizer, [record], prefix, suffix)
    pieces = [tokenizer.encoding.encode_ordinary(t[key]) for t in turns for key in ("prompt", "completion")]
    assert encoded.ids.tolist() == [*pieces[0], *pieces[1], *pieces[2], *pieces[3], *suffix]
    expected = [0] * len(pieces[0]) + [1] * len(pieces[1]) + [0] * len(pieces[2]) + [1] * len(pieces[3]) + [1]
    assert encoded.mask.tolist() == expected and encoded.lengths == [len(expected)]
    assert records.meta_of(record) == {"turns": [{}, {}]}
