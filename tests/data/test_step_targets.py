"""Per-step supervision (grt_titan/model/methods/step_supervision.py, docs/tasks.md): prepare writes
one target stream per step, the loader hands step t's labels to the model, and the loss is
the mean over steps of each step readout's cross-entropy against its own target, computed
here by hand from the records' text."""

import json
import types

import numpy as np
import pytest
import torch
from torchtitan.components.loss import IGNORE_INDEX

from grt_titan.components.loss import grt_loss
from grt_titan.data import tasks
from grt_titan.data.loader import build_dataloader
from grt_titan.data.prepare import prepare
from grt_titan.model import grt_flavors
from grt_titan.model.flops import forward_flops_per_token, readout_flops_per_token
from grt_titan.model.part import TrainingOutput
from grt_titan.tokenizer import load_tokenizer

from data_helpers import chat_tokenizer, job_config, solve_iterated_function
from grt_test_helpers import build_model

S, B = 64, 4


def step_job(dataset, **kwargs):
    jc = job_config(str(dataset), seq_len=S, batch_size=B, **kwargs)
    jc.grt = types.SimpleNamespace(step_supervision=True)
    return jc


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """Iterated-function records of depths 1-4 over the task vocabulary, prepared."""
    root = tmp_path_factory.mktemp("steps")
    words = load_tokenizer(tasks.write_task_tokenizer(root / "vocab"))
    rows = tasks.generate("iterated-function", range(1, 5), 40, seed=0)
    (root / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    prepare([root / "t.jsonl"], root / "ds", tokenizer_path=root / "vocab", val_fraction=0.0, workers=1, progress=False)
    return root / "ds", rows, words


def test_prepare_writes_one_stream_per_step_with_each_step_in_the_completions_place(task):
    ds, rows, words = task
    manifest = json.loads((ds / "manifest.json").read_text())
    assert manifest["step_targets"] == 4 and len(manifest["splits"]["train"]["step_shards"]) == 4
    tokens = np.fromfile(ds / "train_000000.bin", dtype="<u2")
    starts = np.fromfile(ds / "train_records.bin", dtype="<i8")
    streams = [np.fromfile(ds / f"train_000000.step{t}.bin", dtype="<u2") for t in range(1, 5)]
    for k, row in enumerate(rows):
        a, b = int(starts[k]), int(starts[k + 1])
        answer = b - 2  # the completion is one word, then the end token
        for t, stream in enumerate(streams):
            target = row["steps"][t] if t < row["depth"] else row["steps"][-1]  # past the last: the answer
            assert stream[answer] == words.encode_ordinary(target)[0]
            assert np.array_equal(np.delete(stream[a:b], answer - a), np.delete(tokens[a:b], answer - a))


def test_the_loader_gives_each_steps_labels_masked_like_the_labels(task):
    """Each answer's step targets recomputed from the prompt the model reads (the table and
    the query before it), as tests/data/test_tasks.py solves it."""
    ds, _, words = task
    loader = build_dataloader(1, 0, words, step_job(ds), infinite=False)
    answers = 0
    for inputs, labels in loader:
        steps = inputs["step_labels"]
        assert steps.shape == (*labels.shape, 4)
        assert torch.equal(steps == IGNORE_INDEX, (labels == IGNORE_INDEX)[..., None].expand_as(steps))
        for x, y, st in zip(inputs["input"], labels, steps):
            text = words.decode(x.tolist())
            for p in (y != IGNORE_INDEX).nonzero().flatten().tolist():
                if y[p] == words.eos_id:
                    assert st[p].tolist() == [words.eos_id] * 4
                    continue
                prompt = words.decode(x[: p + 1].tolist()).split(words.decode([words.eos_id]))[-1]
                orbit = solve_iterated_function(prompt.strip())
                wanted = [orbit[min(t, len(orbit) - 1)] for t in range(4)]
                assert words.decode(st[p].tolist()).split() == wanted, text
                assert words.decode([int(y[p])]).strip() == orbit[-1]
                answers += 1
    assert answers > 20


def test_without_aligned_steps_step_supervision_is_refused_by_name(tmp_path, task):
    _, rows, words = task
    src = tmp_path / "x.jsonl"
    bad = [{**rows[0], "steps": ["a b", *rows[0]["steps"][1:]]}, *rows[1:5]]  # two words in place of one
    src.write_text("".join(json.dumps(r) + "\n" for r in bad))
    prepare([src], tmp_path / "ds", tokenizer_path=task[0].parent / "vocab", val_fraction=0, workers=1, progress=False)
    assert not list((tmp_path / "ds").glob("*.step*.bin"))
    with pytest.raises(ValueError, match=r"step_supervision = true needs per-step targets; .*x.jsonl:1: steps\[0\]"):
        build_dataloader(1, 0, words, step_job(tmp_path / "ds"))
    build_dataloader(1, 0, words, job_config(str(tmp_path / "ds"), seq_len=S, batch_size=1))  # answer-only: fine


def test_chat_records_steps_stand_in_for_the_last_assistant_turn(tmp_path, hf_dirs):
    """`grt-titan task --chat` records through a ChatML template: step t's stream is the record
    rendered with steps[t] (the answer past the last) as the assistant's turn, on the counted
    tokens; a step that renders to another length leaves the folder without steps, by name."""
    folder = chat_tokenizer(hf_dirs["qwen3"], tmp_path / "chat")
    rows = [tasks.as_chat(p) for p in tasks.generate("iterated-function", range(1, 4), 9, seed=0)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    prepare([tmp_path / "c.jsonl"], tmp_path / "ds", tokenizer_path=folder, val_fraction=0, workers=1, progress=False)
    tokenizer = load_tokenizer(folder)
    tokens = np.fromfile(tmp_path / "ds" / "train_000000.bin", dtype="<u2")
    mask = np.fromfile(tmp_path / "ds" / "train_000000.mask.bin", dtype="<u1").astype(bool)
    starts = np.fromfile(tmp_path / "ds" / "train_records.bin", dtype="<i8")
    streams = [np.fromfile(tmp_path / "ds" / f"train_000000.step{t}.bin", dtype="<u2") for t in range(1, 4)]
    for k, row in enumerate(rows):
        a, b = int(starts[k]), int(starts[k + 1])
        assert tokenizer.decode(tokens[a:b][mask[a:b]].tolist()) == row["messages"][1]["content"] + "<|im_end|>\n"
        for t, stream in enumerate(streams):
            target = row["steps"][min(t, row["depth"] - 1)]
            assert tokenizer.decode(stream[a:b][mask[a:b]].tolist()) == target + "<|im_end|>\n"
            assert np.array_equal(stream[a:b][~mask[a:b]], tokens[a:b][~mask[a:b]])
    bad = [{**rows[1], "steps": ["q r s", *rows[1]["steps"][1:]]}]
    (tmp_path / "bad.jsonl").write_text(json.dumps(bad[0]) + "\n")
    prepare(
        [tmp_path / "bad.jsonl"], tmp_path / "bad", tokenizer_path=folder, val_fraction=0, workers=1, progress=False
    )
    assert not list((tmp_path / "bad").glob("*.step*.bin"))
    with pytest.raises(ValueError, match=r"bad.jsonl:1: steps\[0\] as the last assistant turn, 'q r s', renders to"):
        build_dataloader(1, 0, tokenizer, step_job(tmp_path / "bad"))


def test_the_loss_is_the_mean_of_each_steps_cross_entropy_against_its_target(task):
    ds, _, words = task
    ((inputs, labels),) = [next(iter(build_dataloader(1, 0, words, step_job(ds))))]
    model = build_model("task_debug_words", 0, step_supervision=True, state_noise_std=0.0, gate_noise_std=0.0)
    r = 6  # beyond the data's 4 steps: steps 5 and 6 are trained on the answer
    out = model(inputs["input"], num_recurrences=r, step_labels=inputs["step_labels"])
    assert isinstance(out, TrainingOutput) and out.step_logits.shape[0] == r
    # By hand: the states after each step, each read out, CE against that step's target.
    with torch.no_grad():
        h_pre = model.prelude(model.embed(inputs["input"]), model.freqs_cis)
        states = model.recurrence(h_pre, model.freqs_cis, r, all_states=True).step_states
        by_hand = 0.0
        for t, h in enumerate(states):
            target = inputs["step_labels"][..., t] if t < 4 else labels
            logits = model.logits_from_state(h).double()
            counted = target != IGNORE_INDEX
            by_hand += -torch.log_softmax(logits, -1)[counted].gather(1, target[counted, None]).sum() / r
    assert torch.allclose(grt_loss(out, labels).double(), by_hand, rtol=1e-5)
    # A target changed at a prompt position changes nothing; at an answer, the loss moves.
    prompt = labels == IGNORE_INDEX
    moved = inputs["step_labels"].clone()
    moved[..., 0] = torch.where(prompt, 7, moved[..., 0])
    assert torch.equal(
        grt_loss(out._replace(step_labels=moved.masked_fill(prompt[..., None], IGNORE_INDEX)), labels),
        grt_loss(out, labels),
    )
    moved[..., 0] = torch.where(prompt, IGNORE_INDEX, (moved[..., 0] + 1) % 100)
    assert not torch.allclose(grt_loss(out._replace(step_labels=moved), labels), grt_loss(out, labels))
    model.eval()  # evaluation is the plain final readout
    assert torch.equal(model(inputs["input"], num_recurrences=r), model.logits_from_state(states[-1]))


def test_step_supervision_ends_after_its_steps_and_the_answer_alone_trains(task):
    """`step_supervision_steps = 2` at 2 forwards per optimizer step: forwards 0-3 (steps 0-1)
    read every step out, forward 4 on reads out the final answer alone, the same logits as a
    model without per-step supervision; the switch follows the persistent forward count, so a
    model restored at forward 4 (a resume) is past it too."""
    ds, _, words = task
    ((inputs, _),) = [next(iter(build_dataloader(1, 0, words, step_job(ds))))]
    settings = dict(step_supervision=True, step_supervision_steps=2, forwards_per_step=2)
    model = build_model("task_debug_words", 0, state_noise_std=0.0, gate_noise_std=0.0, **settings)
    # Sampled depths, as the trainer's forwards: each draw counts one forward.
    outputs = [model(inputs["input"], step_labels=inputs["step_labels"]) for _ in range(5)]
    assert [o.step_logits is not None for o in outputs[:4]] == [True] * 4
    assert isinstance(outputs[4], torch.Tensor)  # the answer alone: plain logits, CE on the labels
    answer_only = build_model("task_debug_words", 0, state_noise_std=0.0, gate_noise_std=0.0)
    answer_only.load_state_dict(model.state_dict())
    depth = model.recurrence.depth_sampler.history[-1]
    assert torch.equal(outputs[4], answer_only(inputs["input"], num_recurrences=depth))
    restored = build_model("task_debug_words", 1, state_noise_std=0.0, gate_noise_std=0.0, **settings)
    restored.load_state_dict(model.state_dict())  # recurrence.depth_sampler.draws = 5
    assert isinstance(restored(inputs["input"], step_labels=inputs["step_labels"]), torch.Tensor)


def test_step_supervision_rules_and_flops():
    grt = grt_flavors["task_debug_words"]
    with pytest.raises(ValueError, match=r"step_supervision.*needs a recurrent flavor"):
        grt_flavors["dense_debug"].replace(step_supervision=True).validate()
    with pytest.raises(ValueError, match=r"step_supervision.*cannot be combined with objective = 'exit_distribution'"):
        grt.replace(step_supervision=True, objective="exit_distribution").validate()
    with pytest.raises(ValueError, match=r"step_supervision_steps = 100 is invalid; needs step_supervision = true"):
        grt.replace(step_supervision_steps=100).validate()
    with pytest.raises(ValueError, match=r"step_supervision_steps = -1 is invalid; must be >= 0"):
        grt.replace(step_supervision=True, step_supervision_steps=-1).validate()
    supervised = grt.replace(step_supervision=True)
    extra = forward_flops_per_token(supervised, 128, 6, training=True) - forward_flops_per_token(
        grt, 128, 6, training=True
    )
    assert extra == 5 * readout_flops_per_token(grt, 128)
    assert forward_flops_per_token(supervised, 128, 6) == forward_flops_per_token(grt, 128, 6)  # eval: one readout


def test_each_answer_of_a_record_of_many_answers_gets_its_own_steps(tmp_path):
    """`turns`: step t's stream holds each turn's t-th target at that turn's completion (its
    answer past its last step), the record's other tokens unchanged; prepare writes as many
    streams as the deepest turn has steps."""
    words = load_tokenizer(tasks.write_task_tokenizer(tmp_path / "vocab"))
    (record,) = tasks.generate("iterated-function", range(1, 4), 1, seed=0, queries=3)
    (tmp_path / "q.jsonl").write_text(json.dumps(record) + "\n")
    prepare(
        [tmp_path / "q.jsonl"],
        tmp_path / "ds",
        tokenizer_path=tmp_path / "vocab",
        val_fraction=0.0,
        workers=1,
        progress=False,
    )
    assert json.loads((tmp_path / "ds" / "manifest.json").read_text())["step_targets"] == 3
    tokens = np.fromfile(tmp_path / "ds" / "train_000000.bin", dtype="<u2")
    mask = np.fromfile(tmp_path / "ds" / "train_000000.mask.bin", dtype="<u1")
    streams = [np.fromfile(tmp_path / "ds" / f"train_000000.step{t}.bin", dtype="<u2") for t in range(1, 4)]
    answers, at = [], 0
    for turn in record["turns"]:
        at += len(words.encode_ordinary(turn["prompt"]))
        answers.append((at, turn))
        at += 1  # one word
    assert [int(k) for k in np.flatnonzero(mask)] == [a for a, _ in answers] + [at]  # and the end token
    for t, stream in enumerate(streams):
        for position, turn in answers:
            target = turn["steps"][min(t, turn["depth"] - 1)]
            assert stream[position] == words.encode_ordinary(target)[0]
        others = np.ones(len(tokens), bool)
        others[[a for a, _ in answers]] = False
        assert np.array_equal(stream[others], tokens[others])
