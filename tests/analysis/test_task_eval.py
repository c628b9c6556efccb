"""`grt-titan eval-task` (grt_titan/analysis/task_eval.py): exact match by teacher forcing
equals a greedy decode loop written here; arrival steps by hand; the command on a trained
checkpoint writes its table, JSON and heatmap, and refuses bad input in one line each."""

import json

import pytest
import torch

from grt_titan.analysis import task_eval
from grt_titan.data import tasks
from grt_titan.data.records import Record
from grt_titan.model import grt_flavors
from grt_titan.tokenizer import load_tokenizer

from grt_test_helpers import REPO, build_model, one_process

TASK_TOML = REPO / "train_configs" / "grt_task_debug.toml"


@pytest.fixture(scope="module")
def words(tmp_path_factory):
    return load_tokenizer(tasks.write_task_tokenizer(tmp_path_factory.mktemp("vocab") / "vocab"))


def greedy(model, ids: list[int], n: int, r) -> list[int]:
    """n tokens decoded one at a time, each fed back (no cache, no teacher forcing)."""
    out = list(ids)
    for _ in range(n):
        out.append(int(model(torch.tensor([out]), num_recurrences=r)[0, -1].argmax()))
    return out[len(ids) :]


def test_exact_match_is_what_a_greedy_decode_loop_gives(words):
    model = build_model("task_debug_words", 0, vocab_size=words.get_vocab_size(), num_recurrences=3).eval()
    args = model.model_args
    problems = tasks.generate("mano", range(1, 4), 12, seed=0)
    records, encoded = [], []
    with torch.no_grad():
        for k, p in enumerate(problems):
            prompt = words.encode_ordinary(p["prompt"])
            # Half the references are the model's own greedy 2-word decode at r = 2 (so some
            # scores are 1), half the task's answer.
            reference = greedy(model, prompt, 2, 2) if k % 2 == 0 else words.encode_ordinary(p["completion"])
            records.append(Record(p["prompt"], " " + words.decode(reference), f"x:{k}", {"depth": p["depth"]}))
            encoded.append((prompt + reference, len(reference)))
        depths = task_eval.depths_to_score(args, 4)
        correct = task_eval.score(model, encoded, depths, batch_size=5)
        for (ids, n), right in zip(encoded, correct):
            prompt, reference = ids[:-n], ids[-n:]
            assert right == {r: greedy(model, prompt, n, r) == reference for r in depths}
    assert any(right[2] for right in correct) and not all(right[0] for right in correct)
    result = task_eval.summarize(records, correct, depths, args)
    assert set(result["accuracy"]) == {"1", "2", "3"} and result["depths"] == [0, 1, 2, 3, 4]


def test_the_learned_rules_probe_learns_from_the_positions_that_predict_each_completion(monkeypatch):
    """fit_probe hands the fit each batch's inputs (the ids less the last) and, True, exactly the
    positions whose next token is a completion token, at the fit's default depth (the eval depth:
    tests/model/halting/test_halting_probe.py)."""
    from grt_titan.model.halting import probe as halting_probe

    model = build_model("task_debug", 1, vocab_size=64, num_recurrences=3).eval()
    encoded = [([1, 2, 3, 4, 5], 2), ([6, 7, 8, 9, 10], 1), ([1, 2, 3], 1)]
    seen = {}

    def fit(model, batches, steps, depth=None):
        seen["depth"], seen["batches"] = depth, [next(batches) for _ in range(4)]
        return "probe", [(steps, 0.5)]

    monkeypatch.setattr(halting_probe, "fit_halting_probe", fit)
    assert task_eval.fit_probe(model, encoded, 7, batch_size=2) == ("probe", [(7, 0.5)])
    assert seen["depth"] is None
    (short, short_at), (pair, pair_at), (again, _), _ = seen["batches"]  # by length (two batches), then again
    assert short.tolist() == [[1, 2]] and short_at.tolist() == [[False, True]]
    assert pair.tolist() == [[1, 2, 3, 4], [6, 7, 8, 9]]
    assert pair_at.tolist() == [[False, False, True, True], [False, False, False, True]]
    assert torch.equal(again, short)  # the records again once every batch was used


@pytest.mark.parametrize("context", ["full", "halts"])
def test_halting_scores_and_steps_are_a_halting_decode_loops(words, context):
    """`--halting`: exact match when the positions that predict the completion halt by the
    rule, the prompt before them at full depth (or halting too: `--context-halts`), equals a
    decode loop whose every token is forward_with_halting's argmax with that context held
    (`may_halt`); its steps are that forward's depths at the completion positions; the saving
    is against the smallest fixed r as accurate, by hand."""
    model = build_model("task_debug_words", 1, vocab_size=words.get_vocab_size(), num_recurrences=4).eval()
    problems = tasks.generate("iterated-function", range(1, 4), 9, seed=0)
    records, encoded, loop = [], [], []
    with torch.no_grad():
        for k, p in enumerate(problems):
            prompt, out, steps = words.encode_ordinary(p["prompt"]), [], []
            ids = list(prompt)
            for _ in range(2):  # a halting greedy decode of 2 tokens, no cache
                held = torch.arange(len(ids)) >= len(prompt) - 1 if context == "full" else None
                logits, depths = model.forward_with_halting(torch.tensor([ids]), "state", 0.05, may_halt=held)
                if held is not None:
                    assert (depths[0, ~held] == 4).all()  # the context ran every step
                out.append(int(logits[0, -1].argmax()))
                steps.append(int(depths[0, -1]))
                ids.append(out[-1])
            reference = out if k % 2 == 0 else words.encode_ordinary(p["completion"]) + [words.eos_id]
            records.append(Record(p["prompt"], "x", f"x:{k}", {"depth": p["depth"]}))
            encoded.append((prompt + reference, len(reference)))
            loop.append((reference == out, sum(steps) / 2 if reference == out else None))
        scored = task_eval.score_halting(model, encoded, "state", 0.05, batch_size=4, context=context)
        correct = task_eval.score(model, encoded, [0, 1, 2, 3, 4], batch_size=4)
    assert [right for right, _ in scored] == [right for right, _ in loop]
    assert any(right for right, _ in scored)
    for (right, steps), (_, by_loop) in zip(scored, loop):
        if right:  # teacher forcing fed the loop's own tokens: the same forwards, the same depths
            assert steps == by_loop
    row = task_eval.halting_summary([r.meta["depth"] for r in records], scored, correct, "state", 0.05)
    accuracy = sum(right for right, _ in scored) / len(scored)
    fixed = [r for r in range(1, 5) if sum(c[r] for c in correct) / len(correct) >= accuracy]
    assert row["accuracy"] == accuracy and row["fixed_r_as_accurate"] == (min(fixed) if fixed else None)
    by_r = {r: sum(c[r] for c in correct) / len(correct) for r in range(1, 5)}
    best = [r for r in range(1, 5) if by_r[r] == max(by_r.values())][0]
    assert row["most_accurate_fixed_r"] == best and row["fixed_accuracy"] == {str(r): a for r, a in by_r.items()}
    lost = by_r[best] - accuracy
    assert row["lost_accuracy"] == (lost if lost > 0.01 else None)
    assert row["steps_saved_vs_most_accurate"] == (None if lost > 0.01 else 1 - row["mean_steps"] / best)
    assert set(row["by_depth"]) == {"1", "2", "3"}
    assert "| state 0.05 |" in task_eval.halting_table([row])
    with pytest.raises(ValueError, match=r"--halting 'often:1'; allowed: RULE:THRESHOLD with RULE one of state"):
        task_eval.parse_halting("often:1")


def test_a_rule_that_loses_answers_says_so_and_saves_nothing():
    """Against the most accurate fixed depth, a rule more than the tolerance below it reports no
    saving and one line naming its loss (the learned rule on the gate -4 models read 0.26 where
    fixed r = 6 read 1.00, and was shown as a saving); within the tolerance it saves."""
    correct = [{0: False, 1: d == 1, 2: d <= 2, 3: True} for d in (1, 2, 3, 3)]  # fixed r = 3 reads 1.00
    depths = [1, 2, 3, 3]
    lossy = task_eval.halting_summary(
        depths, [(True, 1.0), (True, 2.0), (False, 1.0), (True, 3.0)], correct, "learned", 0.1
    )
    assert lossy["accuracy"] == 0.75 and lossy["lost_accuracy"] == 0.25
    assert lossy["steps_saved_vs_most_accurate"] is None and lossy["fixed_r_as_accurate"] == 3
    assert "| 3 (1.000): lost 0.250, no saving |" in task_eval.halting_table([lossy])
    assert task_eval.halting_loss_line(lossy) == (
        "halting learned 0.1 lost answers: 0.750 against 1.000 at fixed r = 3, 0.250 below "
        "(tolerance 0.01, --halting-tolerance); its 1.75 steps are no saving"
    )
    exact = task_eval.halting_summary(depths, [(True, 1.0), (True, 2.0), (True, 3.0), (True, 3.0)], correct, "kl", 0.1)
    assert exact["steps_saved_vs_most_accurate"] == 1 - 2.25 / 3 and task_eval.halting_loss_line(exact) is None
    tolerant = task_eval.halting_summary(
        depths, [(True, 1.0), (True, 2.0), (False, 1.0), (True, 3.0)], correct, "learned", 0.1, tolerance=0.3
    )
    assert tolerant["lost_accuracy"] is None and tolerant["steps_saved_vs_most_accurate"] == 1 - 1.75 / 3


def test_wall_clock_decodes_with_the_cache_what_teacher_forcing_scores(words, tmp_path):
    """`--wall-clock`: the exported model's cached greedy decode, at each fixed r and under a
    halting rule, gets right exactly the records the uncached native forwards score right,
    with the steps forward_with_halting gives the positions that predict the completion."""
    from grt_titan.hf.convert import write_hf_folder

    model = build_model("task_debug_words", 1, vocab_size=words.get_vocab_size(), num_recurrences=3).eval()
    problems = tasks.generate("iterated-function", range(1, 4), 8, seed=1)
    encoded = []
    with torch.no_grad():
        for k, p in enumerate(problems):
            prompt = words.encode_ordinary(p["prompt"])
            # Half the references are the model's own greedy decode at r = 2 (right there)
            reference = greedy(model, prompt, 2, 2) if k % 2 == 0 else words.encode_ordinary(p["completion"])
            encoded.append((prompt + reference, len(reference)))
        correct = task_eval.score(model, encoded, [1, 2, 3], batch_size=4)
        halted = task_eval.score_halting(model, encoded, "state", 0.05, batch_size=4)
    write_hf_folder(tmp_path / "hf", model.state_dict(), model.model_args, write_tokenizer=False)
    hf_model = task_eval.cached_model(tmp_path / "hf")
    rows = task_eval.wall_clock(hf_model, encoded, [1, 2, 3], [("state", 0.05)])
    assert [row["decode"] for row in rows] == ["r = 1", "r = 2", "r = 3", "state 0.05"]
    for r, row in zip([1, 2, 3], rows):
        assert row["accuracy"] == sum(c[r] for c in correct) / len(correct) and row["mean_steps"] == r
        assert row["seconds_per_answer"] > 0
    assert 0 < rows[1]["accuracy"] < 1
    halting = rows[-1]
    assert halting["accuracy"] == sum(right for right, _ in halted) / len(halted)
    assert 1 <= halting["mean_steps"] <= 3
    # References that are the model's own halting decode (no cache, forward_with_halting's
    # argmax, the prompt before its last token held at full depth): every cached decode
    # follows them, its positions' steps those forwards' depths.
    own, steps = [], []
    with torch.no_grad():
        for p in problems:
            ids = words.encode_ordinary(p["prompt"])
            context = len(ids) - 1
            for _ in range(2):
                held = torch.arange(len(ids)) >= context
                logits, depths = model.forward_with_halting(torch.tensor([ids]), "state", 0.05, may_halt=held)
                ids.append(int(logits[0, -1].argmax()))
                steps.append(int(depths[0, -1]))
            own.append((ids, 2))
    (row,) = task_eval.wall_clock(hf_model, own, [], [("state", 0.05)])
    assert row["accuracy"] == 1 and row["mean_steps"] == pytest.approx(sum(steps) / len(steps))
    assert max(steps) < 3  # the rule halted the answering positions; the context ran all 3 steps
    table = task_eval.wall_clock_table(rows, len(encoded))
    assert "| decode | accuracy | mean steps | s / answer | / r = 3 |" in table and "| r = 3 | " in table
    assert table.splitlines()[-2].endswith("| 1.00x |")  # r = 3 against itself


def test_arrival_step_by_hand():
    depths = [0, 1, 2, 3, 4]
    assert task_eval.arrival_step(dict(zip(depths, [0, 1, 0, 1, 1])), depths) == 3
    assert task_eval.arrival_step(dict(zip(depths, [1, 1, 1, 1, 1])), depths) == 0
    assert task_eval.arrival_step(dict(zip(depths, [1, 1, 1, 1, 0])), depths) is None


def test_with_the_depth_given_by_the_loops_the_answer_to_depth_d_is_read_at_r_equal_d():
    """Records whose query does not name its depth (`depth_given: loops`): the summary adds each
    depth's accuracy at r = d (by hand), which the table prints; records that name it get none."""
    args = grt_flavors["task_debug"]  # R = 8
    depths = [0, 1, 2, 3]
    loops = [Record("p", " a", f"x:{k}", {"depth": d, "depth_given": "loops"}) for k, d in enumerate([1, 1, 2, 3])]
    correct = [dict(zip(depths, right)) for right in ([0, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 0], [1, 1, 1, 0])]
    result = task_eval.summarize(loops, correct, depths, args)
    assert result["at_loops"] == {"1": 0.5, "2": 1.0, "3": 0.0}  # depth 1: right at r = 1 once of twice
    assert "loops = depth (the answer to depth d read at r = d): 1: 0.50, 2: 1.00, 3: 0.00" in task_eval.table(
        result, None
    )
    named = [Record(r.prompt, r.completion, r.where, {"depth": r.meta["depth"]}) for r in loops]
    assert "at_loops" not in task_eval.summarize(named, correct, depths, args)


def test_the_figure_of_loops_records_reads_each_depth_at_r_equal_d():
    """With the depth given by the loops there is no arrival (the answer is meant to be right at
    r = d only): the second panel is each depth's accuracy at r = d beside r = 1's."""
    from grt_titan.plots import task_accuracy_figure

    args = grt_flavors["task_debug"]
    depths = [0, 1, 2, 3]
    loops = [Record("p", " a", f"x:{k}", {"depth": d, "depth_given": "loops"}) for k, d in enumerate([1, 2, 3])]
    correct = [dict(zip(depths, right)) for right in ([0, 1, 0, 0], [0, 0, 1, 1], [0, 1, 0, 1])]
    result = task_eval.summarize(loops, correct, depths, args)
    _, panel, *_ = task_accuracy_figure(result).axes
    at_d, at_one = panel.lines
    assert list(at_d.get_ydata()) == [1.0, 1.0, 1.0] and list(at_one.get_ydata()) == [1.0, 0.0, 1.0]
    assert panel.get_title() == "the answer to depth d, read after d steps"
    named = [Record(r.prompt, r.completion, r.where, {"depth": r.meta["depth"]}) for r in loops]
    _, arrival, *_ = task_accuracy_figure(task_eval.summarize(named, correct, depths, args)).axes
    assert arrival.get_title() == "arrival of the answer"


def test_depths_a_model_can_run():
    grt = grt_flavors["task_debug"]
    assert task_eval.depths_to_score(grt, None) == list(range(17))  # 2R
    adapters = grt.replace(step_adapter="lora")  # one module per step up to R
    assert task_eval.depths_to_score(adapters, None) == list(range(9))
    with pytest.raises(ValueError, match=r"--max-depth 9: r beyond what the model can run; allowed: 0 to 8"):
        task_eval.depths_to_score(adapters, 9)
    assert task_eval.depths_to_score(grt_flavors["dense_debug"], None) == [None]


@pytest.mark.slow
def test_eval_task_on_a_trained_checkpoint(tmp_path, words, capsys):
    from grt_titan.cli import main as cli

    vocab = tmp_path / "vocab"
    tasks.write_task_tokenizer(vocab)
    for split, n in (("train", 400), ("test", 12)):
        assert cli(["task", "iterated-function", "--depths", "1-3", "--n", str(n), "--split", split,
                    "--out", str(tmp_path / f"{split}.jsonl")]) == 0  # fmt: skip
    assert cli(["prepare", str(tmp_path / "train.jsonl"), "--out", str(tmp_path / "data"), "--tokenizer", str(vocab),
                "--val-fraction", "0.05", "--no-progress"]) == 0  # fmt: skip
    overrides = ["--model.flavor", "task_debug_words", "--model.hf_assets_path", str(vocab),
                 "--training.dataset", str(tmp_path / "data"), "--validation.dataset", str(tmp_path / "data")]  # fmt: skip
    proc = one_process(
        ["--job.config_file", str(TASK_TOML), "--job.dump_folder", str(tmp_path / "run"), *overrides,
         "--training.steps", "3", "--checkpoint.interval", "3", "--validation.freq", "3", "--lr_scheduler.warmup_steps", "1",
         "--grt.step_supervision", "True", "--grt.step_supervision_steps", "2"],
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "prompt/completion records one per sequence" in proc.stdout + proc.stderr  # the preset: pack_records = false
    assert "per-step targets of 3 steps ([grt] step_supervision)" in proc.stdout + proc.stderr
    assert (
        "per-step supervision for the first 2 optimizer steps, then the final answer alone" in proc.stdout + proc.stderr
    )
    checkpoint = str(tmp_path / "run" / "checkpoint")
    base = [checkpoint, "--data", str(tmp_path / "test.jsonl"), "--no-progress"]
    probe_data = tmp_path / "probe.jsonl"  # training records the learned rule's probe is fitted on
    probe_data.write_text("".join((tmp_path / "train.jsonl").read_text().splitlines(keepends=True)[:32]))
    learned = ["--halting", "learned:0.1", "--probe-data", str(probe_data), "--probe-steps", "3"]
    capsys.readouterr()
    code = cli(["eval-task", *base, "--out", str(tmp_path / "eval"), "--json", str(tmp_path / "e.json"),
                "--trained-depths", "1-2", "--halting", "kl:0.001", *learned, "--config", str(TASK_TOML), *overrides])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    result = json.loads((tmp_path / "e.json").read_text())
    assert result["depths"] == list(range(17)) and set(result["accuracy"]) == {"1", "2", "3"}
    assert all(len(result["arrival"][d]) == result["counts"][d] == 4 for d in "123")
    assert (tmp_path / "eval" / "task_accuracy.png").stat().st_size > 0
    assert "| 3* | 4 |" in out and "r=9*" in out and "beyond the trained R = 8" in out
    halting = result["halting"]
    assert [(h["rule"], h["threshold"]) for h in halting] == [("kl", 0.001), ("learned", 0.1)]
    assert "| kl 0.001 |" in out and "| learned 0.1 |" in out
    assert "The learned rule's probe: fitted for 3 steps, last loss" in out
    assert halting[1]["probe"]["steps"] == 3 and halting[1]["probe"]["data"] == str(probe_data)
    for row in halting:
        assert 1 <= row["mean_steps"] <= 8 and set(row["by_depth"]) == {"1", "2", "3"}
    # The run exported: the transformers-side model and its own tokenizer files score alike.
    export = str(tmp_path / "export")
    probe_file = tmp_path / "eval" / "halting_probe.pt"  # the learned rule's probe, for export-hf --halting-probe
    assert f"wrote {probe_file}" in out
    export_args = ["export-hf", "--checkpoint", checkpoint, "--config", str(TASK_TOML), "--out", export]
    assert cli([*export_args, "--halting-probe", str(probe_file), *overrides]) == 0
    assert json.loads((tmp_path / "export" / "config.json").read_text())["halting_probe"] is True
    (tmp_path / "no_probe.pt").write_bytes(b"not a probe")
    capsys.readouterr()
    bad = [*export_args[:-1], str(tmp_path / "never"), "--halting-probe", str(tmp_path / "no_probe.pt"), *overrides]
    assert cli(bad) != 0 and not (tmp_path / "never").exists()
    assert "not a halting probe that eval-task wrote" in capsys.readouterr().err
    capsys.readouterr()
    assert cli(["eval-task", export, "--data", str(tmp_path / "test.jsonl"), "--json", str(tmp_path / "x.json"),
                "--no-progress", "--halting", "kl:0.001", *learned, "--wall-clock", "2"]) == 0  # fmt: skip
    exported = json.loads((tmp_path / "x.json").read_text())
    assert [h["rule"] for h in exported["halting"]] == ["kl", "learned"]  # the export's model takes the probe
    assert exported["accuracy"] == result["accuracy"] and exported["arrival"] == result["arrival"]
    timed = exported["wall_clock"]  # r = 1..R, then the exported rule (not the probe's), with the export's cache
    assert timed["records"] == 2 and [row["decode"] for row in timed["rows"]] == [f"r = {r}" for r in range(1, 9)] + [
        "kl 0.001"
    ]
    captured = capsys.readouterr()
    assert "Cached greedy decoding, batch 1, the first 2 records:" in captured.out and "| kl 0.001 | " in captured.out
    assert "Loading weights" not in captured.err
    # One line each: no depth; an r the model cannot run; records its tokenizer cannot read.
    (tmp_path / "nodepth.jsonl").write_text(json.dumps({"prompt": "a > b ; | a * 1 =", "completion": " b"}) + "\n")
    (tmp_path / "words.jsonl").write_text(json.dumps({"prompt": "hello world", "completion": " b", "depth": 1}) + "\n")
    loops = {"prompt": "a > b ; | a =", "completion": " b", "depth": 1, "depth_given": "loops"}
    (tmp_path / "loops.jsonl").write_text(json.dumps(loops) + "\n")
    for data, extra, message in (
        ("nodepth.jsonl", [], "nodepth.jsonl:1: no 'depth' field"),
        ("test.jsonl", ["--max-depth", "-1"], "--max-depth -1: r beyond what the model can run"),
        ("test.jsonl", ["--wall-clock", "2"], "--wall-clock decodes with an export's model and KV cache;"),
        ("test.jsonl", ["--halting", "learned:0.1"], "--halting learned:X needs --probe-data FILE.jsonl"),
        ("test.jsonl", ["--probe-data", "x.jsonl"], "--probe-data x.jsonl is read by --halting learned:X only"),
        ("words.jsonl", [], "words.jsonl:1: the model's tokenizer 'vocab' does not read this record back"),
        ("loops.jsonl", ["--halting", "kl:0.1"], "its records ask depth d by running r = d loops"),
    ):
        argv = ["eval-task", checkpoint, "--data", str(tmp_path / data), *extra, "--config", str(TASK_TOML), *overrides]
        assert cli(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


def test_overrides_without_a_config_are_refused(tmp_path, capsys):
    """analyze, eval-task and import-hf share the refusal (run_reader.check_overrides_have_config)."""
    from grt_titan.cli import main as cli

    for argv in (
        ["eval-task", str(tmp_path), "--data", str(tmp_path / "x.jsonl"), "--training.steps", "3"],
        ["analyze", str(tmp_path), "--out", str(tmp_path / "a"), "--training.steps", "3"],
        ["import-hf", "--hf-dir", str(tmp_path), "--out", str(tmp_path / "b"), "--training.steps", "3"],
    ):
        assert cli(argv) != 0
        assert "--training.steps 3: overrides of a training config need --config" in capsys.readouterr().err


def test_a_chat_record_is_scored_on_its_last_assistant_turn_as_the_template_renders_it(tmp_path, words):
    """`grt-titan task --chat` records: the ids are the template's rendering up to the end of
    the last assistant turn, the completion that turn's tokens and its end; a tokenizer
    without a chat template is refused by the record's line."""
    problem = tasks.generate("iterated-function", range(2, 3), 1, seed=0)[0]
    chat = tasks.as_chat(problem)
    record = Record("", "", "t.jsonl:1", {"depth": 2}, chat["messages"])
    with pytest.raises(ValueError, match=r"t\.jsonl:1: a chat record \(messages\) needs a tokenizer with a chat"):
        task_eval.encode(words, record, words.get_vocab_size(), 64)
    folder = tmp_path / "vocab"
    task_folder = tasks.write_task_tokenizer(folder)
    config = json.loads((task_folder / "tokenizer_config.json").read_text())
    template = "{% for m in messages %}{{ m['content'] + ' <eos> ' }}{% endfor %}"  # words of the vocabulary only
    (task_folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    chat_words = load_tokenizer(task_folder)
    ids, n = task_eval.encode(chat_words, record, chat_words.get_vocab_size(), 64)
    prompt, answer = (chat_words.encode_ordinary(problem[key]) for key in ("prompt", "completion"))
    assert ids == [*prompt, chat_words.eos_id, *answer, chat_words.eos_id] and n == 2
    assert task_eval.encode(chat_words, record, chat_words.get_vocab_size(), len(ids) - 1) == (ids, n)  # last: unread
    with pytest.raises(ValueError, match=rf"t\.jsonl:1: {len(ids) - 1} tokens read .* exceed the model's max_seq_len"):
        task_eval.encode(chat_words, record, chat_words.get_vocab_size(), len(ids) - 2)


def test_each_answer_of_a_record_of_many_answers_is_scored_after_the_references_before_it(tmp_path, words):
    """A `turns` record is one scored answer per turn, its prompt every word before that answer
    (the earlier answers as the record writes them), its depth the turn's; encoded, each is the
    record's own token prefix (what the trained model read), a turn without `depth` refused."""
    (record,) = tasks.generate("iterated-function", range(2, 5), 1, seed=0, queries=3)
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps(record) + "\n")
    scored = task_eval.task_records(path)
    turns = record["turns"]
    assert [r.meta["depth"] for r in scored] == [2, 3, 4] and [r.completion for r in scored] == [
        t["completion"] for t in turns
    ]
    assert (
        scored[2].prompt
        == turns[0]["prompt"]
        + turns[0]["completion"]
        + turns[1]["prompt"]
        + turns[1]["completion"]
        + turns[2]["prompt"]
    )
    whole = words.encode_ordinary("".join(t["prompt"] + t["completion"] for t in turns))
    for answer in scored:
        ids, n = task_eval.encode(words, answer, words.get_vocab_size(), 512)
        assert n == 1 and ids == whole[: len(ids)]
    del turns[1]["depth"], turns[1]["steps"]
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(ValueError, match=r"q\.jsonl:1 turn 1: no 'depth' field"):
        task_eval.task_records(path)
