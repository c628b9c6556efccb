"""benchmarks/retrofit_reasoning.py's scoring (the arms train a real model for an hour; not
here): its one-pass accuracy and persistence equal a forward at each depth, its step targets
are the values' first tokens as the chat template renders them, and its summary counts by
hand."""

import json
import sys

import pytest
import torch

from grt_titan.analysis import task_eval
from grt_titan.data import tasks
from grt_titan.data.records import Record
from grt_titan.tokenizer import load_tokenizer

from grt_test_helpers import REPO, build_model


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))
    from benchmarks import retrofit_reasoning

    yield retrofit_reasoning
    sys.modules.pop("benchmarks.retrofit_reasoning", None)


@pytest.fixture(scope="module")
def words(tmp_path_factory):
    return load_tokenizer(tasks.write_task_tokenizer(tmp_path_factory.mktemp("vocab") / "vocab"))


def test_one_pass_scores_are_forwards_at_each_depth(bench, words):
    """Half the references and step values are the model's own argmax (so some cells are
    right), half the task's; every cell must equal `forward(num_recurrences=r)`'s. The
    weights are perturbed so that each depth predicts differently (at init every r agrees)."""
    model = build_model("task_debug_words", 0, vocab_size=words.get_vocab_size(), num_recurrences=3).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for weight in model.parameters():
            weight.add_(0.2 * torch.randn_like(weight))
    problems = tasks.generate("iterated-function", range(1, 4), 8, seed=0)
    encoded, steps = [], []
    with torch.no_grad():
        for k, p in enumerate(problems):
            prompt = words.encode_ordinary(p["prompt"])
            own = [int(model(torch.tensor([prompt]), num_recurrences=t)[0, -1].argmax()) for t in (1, 2, 3)]
            task = [words.encode_ordinary(" " + value)[0] for value in p["steps"]]
            steps.append((own if k % 2 == 0 else task)[: p["depth"]])
            encoded.append((prompt + [own[k % 3]], 1))  # right at r = k % 3 + 1 at least
        # every r up to 4 for most; a sparse set (no r = 1, r beyond the steps) for every third
        readouts = [{2, 4} if k % 3 == 0 else {1, 2, 3, 4} for k in range(len(encoded))]
        scores = bench.score_by_step(model, encoded, steps, readouts)
        expected = task_eval.score(model, encoded, [1, 2, 3, 4], batch_size=3)
        for (ids, n), step, score, right, wanted in zip(encoded, steps, scores, expected, readouts):
            assert score["answer"] == {r: right[r] for r in wanted}
            at = [model(torch.tensor([ids[:-1]]), num_recurrences=t)[0, len(ids) - n - 1].argmax() for t in (1, 2, 3)]
            assert score["step"] == {t: at[t - 1].item() == step[t - 1] for t in wanted if t <= len(step)}
    for key in ("answer", "step"):
        cells = [ok for s in scores for ok in s[key].values()]
        assert any(cells) and not all(cells)
    assert any(len(set(s["answer"].values())) > 1 for s in scores)  # right at one depth, wrong at another
    dense = build_model("dense_task_debug_words", 0).eval()
    with torch.no_grad():
        scored = bench.score_by_step(dense, encoded, steps, readouts)
        assert [s["answer"] for s in scored] == [{"dense": r[None]} for r in task_eval.score(dense, encoded, [None], 3)]
    assert all(s["step"] == {} for s in scored)


def test_step_targets_are_each_values_first_token_as_the_answer_renders(bench, tmp_path):
    folder = tasks.write_task_tokenizer(tmp_path / "vocab")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    template = "{% for m in messages %}{{ m['content'] + ' <eos> ' }}{% endfor %}"
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    chat_words = load_tokenizer(folder)
    problem = tasks.generate("iterated-function", range(3, 4), 1, seed=0)[0]
    chat = tasks.as_chat(problem)
    record = Record("", "", "t.jsonl:1", {"depth": 3, "steps": chat["steps"]}, chat["messages"])
    ids, n = task_eval.encode(chat_words, record, chat_words.get_vocab_size(), 64)
    tokens = bench.step_first_tokens(chat_words, record, n, ids)
    assert tokens == [chat_words.encode_ordinary(value)[0] for value in problem["steps"]]
    assert tokens[-1] == ids[len(ids) - n]  # the last step is the answer


def test_summary_counts_by_hand(bench):
    opts = bench.build_parser().parse_args(["--source", "x", "--out", "y", "--depths", "1-2", "--recurrences", "2"])
    records = [Record("", "", f"t:{k}", {"depth": d}) for k, d in enumerate((1, 2, 3, 3))]
    scores = [
        {"answer": {"1": True, "2": True, "3": False}, "step": {"1": True}},
        {"answer": {"1": False, "2": True, "3": True}, "step": {"1": True, "2": False}},
        {"answer": {"1": False, "2": False, "3": True}, "step": {"1": True, "2": True}},
        {"answer": {"1": False, "2": True, "3": False}, "step": {"1": False, "2": False}},
    ]
    generated = [{"depth": 1, "seconds": 0.5, "tokens": 2, "right": True}]
    train = {"losses": {"1": 3.0, "10": 1.5}, "seconds": 12.0, "trained_params": "7", "anneal_step": 8}
    recurrent = {"train": train, "scores": scores, "generated": generated, "text_loss_r1": 3.5}
    recurrent["scores_before_annealing"] = [{"answer": {}, "step": {"1": True}}]
    dense = {"train": {**train, "trained_params": "all"}, "text_loss_r1": 3.25, "generated": generated * 2}
    dense["scores"] = [{"answer": {"dense": ok}, "step": {}} for ok in (True, True, False, True)]
    text = bench.report({"recurrent": recurrent, "dense": dense}, records, 3.0, opts)
    assert "| recurrent, r = depth | 1.00 | 1.00 | 0.50 | 1.00 | 0.50 |" in text  # d = 3 at r = 3: 1 of 2
    assert "| recurrent, r = R = 2 | 1.00 | 1.00 | 0.50 | 1.00 | 0.50 |" in text
    assert "| recurrent, r = 1 | 1.00 | 0.00 | 0.00 | 0.50 | 0.00 |" in text
    assert "| dense | 1.00 | 1.00 | 0.50 | 1.00 | 0.50 |" in text
    # loop 1: 3 of 4 after, 1 of 1 before; loop >= 2: 1 of 3 after, none before
    assert "| recurrent | 7 | 12 | 1.5000 | 1.00 / -; 0.75 / 0.33 | 3.5000 | 0.500 | - | 2.0 |" in text
    assert "| dense | all | 12 | 1.5000 | - | 3.2500 | 0.500 | - | 2.0 |" in text
