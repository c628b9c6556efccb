"""`grt-titan task` (grt_titan/data/tasks.py): every answer and step recomputed here from the
prompt text alone; deterministic per seed; splits disjoint; the task tokenizer gives one
token per word and prepares like any tokenizer."""

import json
import re

import numpy as np
import pytest

from grt_titan.data import tasks
from grt_titan.data.prepare import prepare
from grt_titan.data.records import read_records
from grt_titan.tokenizer import load_tokenizer

from data_helpers import SOLVERS


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_answers_and_steps_are_what_the_prompt_says(name):
    problems = tasks.generate(name, range(1, 7), 60, seed=1)
    assert [p["depth"] for p in problems] == [1 + k % 6 for k in range(60)]  # depths balanced
    for p in problems:
        steps = SOLVERS[name](p["prompt"])
        assert steps == p["steps"] and len(steps) == p["depth"]
        assert p["completion"] == " " + steps[-1]


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_deterministic_per_seed_and_splits_disjoint(name):
    a = tasks.generate(name, range(2, 5), 50, seed=3)
    assert a == tasks.generate(name, range(2, 5), 50, seed=3)
    assert a != tasks.generate(name, range(2, 5), 50, seed=4)
    assert len({p["prompt"] for p in a}) == 50  # distinct within a file
    test = tasks.generate(name, range(2, 5), 20, seed=3, split="test")
    train_prompts = {p["prompt"] for seed in (3, 4) for p in tasks.generate(name, range(2, 5), 50, seed=seed)}
    assert not train_prompts & {p["prompt"] for p in test}
    assert {tasks.problem_split(p["prompt"]) for p in test} == {"test"}


def test_bad_requests_are_named():
    with pytest.raises(ValueError, match="depth 12 needs at least 13 symbols; got --symbols 12"):
        tasks.generate("iterated-function", range(12, 13), 1, seed=0)
    with pytest.raises(ValueError, match="task 'sorting': unknown; allowed: iterated-function, chains, mano"):
        tasks.generate("sorting", range(1, 2), 1, seed=0)
    with pytest.raises(ValueError, match="found no new train problem of depth 1"):
        tasks.generate("mano", range(1, 2), 5000, seed=0)  # 3 x 23 x 23 problems of depth 1
    with pytest.raises(ValueError, match=r"--depths '3-1'; allowed: A-B with 1 <= A <= B"):
        tasks.parse_depths("3-1")


def test_cli_writes_jsonl_and_the_task_tokenizer_reads_it(tmp_path, capsys):
    out = tmp_path / "train.jsonl"
    assert tasks.main(["iterated-function", "--depths", "1-3", "--n", "40", "--seed", "2", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 40 and set(rows[0]) == {"prompt", "completion", "depth", "steps"}
    assert tasks.main(["vocab", "--out", str(tmp_path / "vocab")]) == 0
    tokenizer = load_tokenizer(tmp_path / "vocab")
    assert tokenizer.get_vocab_size() == len(tasks.task_vocabulary()) + 2
    for row in rows:  # one token per word, nothing unknown
        ids = tokenizer.encode_ordinary(row["prompt"] + row["completion"])
        assert len(ids) == len((row["prompt"] + row["completion"]).split())
        assert tokenizer.tokenizer.token_to_id("<unk>") not in ids
    manifest = prepare([out], tmp_path / "ds", tokenizer_path=tmp_path / "vocab", workers=1, progress=False)
    assert manifest["tokenizer"]["vocab_size"] == tokenizer.get_vocab_size()
    tokens = np.fromfile(tmp_path / "ds" / "train_000000.bin", dtype="<u2")
    assert tokens[-1] == tokenizer.eos_id and tokens.max() < tokenizer.get_vocab_size()
    assert tasks.main(["chains", "--depths", "9", "--out", str(tmp_path / "x.jsonl"), "--symbols", "10"]) == 2
    assert "depth 9 needs at least 27 symbols (3 chains)" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_a_scratchpad_writes_every_step_the_answer_last(name, tmp_path):
    problems = tasks.generate(name, range(1, 4), 6, seed=0)
    for p in problems:
        pad = tasks.as_scratchpad(p)
        assert pad == {
            "prompt": p["prompt"],
            "completion": " " + " ".join(SOLVERS[name](p["prompt"])),
            "depth": p["depth"],
        }
        assert pad["completion"].split()[-1] == p["completion"].strip()
    out = tmp_path / "pad.jsonl"
    assert tasks.main([name, "--depths", "1-3", "--n", "6", "--scratchpad", "--chat", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == [tasks.as_chat(tasks.as_scratchpad(p)) for p in problems]
    assert set(rows[0]) == {"messages", "depth"}  # no per-step targets: the steps are the text


def test_many_queries_share_one_table_and_each_answer_is_what_the_prompt_says():
    """--queries: every turn's answer and steps recomputed from the first turn's table; f is
    one cycle over the symbols; depths cycle across the file's queries; distinct and split by
    the first turn's prompt (the table)."""
    records = tasks.generate("iterated-function", range(1, 7), 30, seed=2, queries=4)
    depths = [turn["depth"] for r in records for turn in r["turns"]]
    assert depths == [1 + k % 6 for k in range(120)]
    for record in records:
        first, *rest = record["turns"]
        table = first["prompt"].split(" | ")[0]
        assert all(t["prompt"].startswith(" | ") and " > " not in t["prompt"] for t in rest)
        f = dict(re.findall(r"(\w) > (\w) ;", table))
        x, walk = "a", ["a"]
        while (x := f[x]) != "a":
            walk.append(x)
        assert len(walk) == 12  # one cycle through every symbol
        for turn in record["turns"]:
            steps = SOLVERS["iterated-function"](table + " | " + turn["prompt"].split("| ")[-1])
            assert steps == turn["steps"] and len(steps) == turn["depth"] and turn["completion"] == " " + steps[-1]
    keys = [r["turns"][0]["prompt"] for r in records]
    assert len(set(keys)) == 30 and {tasks.problem_split(k) for k in keys} == {"train"}
    test = tasks.generate("iterated-function", range(1, 7), 10, seed=2, split="test", queries=4)
    assert not set(keys) & {r["turns"][0]["prompt"] for r in test}
    with pytest.raises(ValueError, match=r"--queries 3; allowed: 1, or more for iterated-function"):
        tasks.generate("chains", range(1, 3), 2, seed=0, queries=3)
    with pytest.raises(ValueError, match="depth 12 needs at least 13 symbols"):
        tasks.generate("iterated-function", range(1, 13), 2, seed=0, queries=12)


@pytest.mark.parametrize("queries", [1, 4])
def test_an_ordered_table_lists_symbol_i_at_line_i_and_answers_as_the_shuffled_one_would(queries):
    """--table ordered: the same lines as a shuffled table, in symbol order (a lookup by
    position); every answer recomputed from the table; the shuffled tables of the same file
    are in no fixed order."""
    ordered = tasks.generate("iterated-function", range(1, 7), 20, seed=1, queries=queries, table="ordered")
    shuffled = tasks.generate("iterated-function", range(1, 7), 20, seed=1, queries=queries)
    for record in ordered:
        turns = record.get("turns", [record])
        table = turns[0]["prompt"].split(" | ")[0]
        assert [a for a, _ in re.findall(r"(\w) > (\w) ;", table)] == list(tasks.SYMBOLS[:12])
        for turn in turns:
            steps = SOLVERS["iterated-function"](table + " | " + turn["prompt"].split("| ")[-1])
            assert steps == turn["steps"] and turn["completion"] == " " + steps[-1]
    firsts = [re.findall(r"(\w) > ", r.get("turns", [r])[0]["prompt"]) for r in shuffled]
    assert any(symbols != sorted(symbols) for symbols in firsts)
    with pytest.raises(ValueError, match="--table ordered; allowed: shuffled, ordered, edges for iterated-function"):
        tasks.generate("chains", range(1, 3), 2, seed=0, table="ordered")


@pytest.mark.parametrize("queries", [1, 4])
def test_an_edge_table_is_one_word_a_line_each_a_token_of_the_task_vocabulary(queries, tmp_path):
    """--table edges: every line one word `a>b`, shuffled (the same lines as the shuffled
    table's); every answer recomputed from them; over 10 symbols the task tokenizer reads each
    word as one token; a symbol beyond its edge words is unknown there and prepare says so."""
    records = tasks.generate("iterated-function", range(1, 7), 20, seed=1, symbols=10, queries=queries, table="edges")
    vocab = load_tokenizer(tasks.write_task_tokenizer(tmp_path / "vocab"))
    assert vocab.get_vocab_size() == 235
    orders = []
    for record in records:
        turns = record.get("turns", [record])
        table = turns[0]["prompt"].split(" | ")[0]
        words = table.split()
        assert all(re.fullmatch(r"[a-j]>[a-j]", w) for w in words) and len({w[0] for w in words}) == 10
        orders.append([w[0] for w in words])
        for turn in turns:
            steps = SOLVERS["iterated-function"](table + " | " + turn["prompt"].split("| ")[-1])
            assert steps == turn["steps"] and turn["completion"] == " " + steps[-1]
            text = turn["prompt"] + turn["completion"]
            assert len(vocab.encode_ordinary(text)) == len(text.split())
    assert any(order != sorted(order) for order in orders)
    wide = tmp_path / "wide.jsonl"
    assert tasks.main(["iterated-function", "--table", "edges", "--symbols", "12", "--n", "4", "--out", str(wide)]) == 0
    with pytest.raises(ValueError) as info:
        prepare([wide], tmp_path / "ds", tokenizer_path=tmp_path / "vocab", workers=1, progress=False)
    assert re.fullmatch(
        rf"{re.escape(str(wide))}:1: field 'prompt' has words the tokenizer 'vocab' does not know \('\w>\w'(, '\w>\w')*\): "
        r"it would read them as its unknown token; allowed: text in its vocabulary",
        str(info.value),
    ), info.value
    unknown = re.findall(r"'(\w>\w)'", str(info.value))
    assert unknown and all({"k", "l"} & set(word) for word in unknown)  # a symbol past the 10 the edge words cover
    assert not (tmp_path / "ds").exists()  # nothing half-written


@pytest.mark.parametrize("queries", [1, 16])
def test_with_the_depth_given_by_the_loops_a_query_names_its_start_alone(queries, tmp_path):
    """--depth-given loops: a query is `| x =`; its answer and steps are f's orbit from x for
    the record's depth (recomputed from the table), marked `depth_given`; other tasks refuse it."""
    options = dict(symbols=10, queries=queries, table="edges")
    loops = tasks.generate("iterated-function", range(1, 10), 18, seed=2, depth_given="loops", **options)
    depths = []
    for record in loops:
        turns = record.get("turns", [record])
        table = turns[0]["prompt"].split(" | ")[0]
        for turn in turns:
            query = turn["prompt"].split("| ")[-1]
            assert re.fullmatch(r"[a-j] =", query) and turn["depth_given"] == "loops"
            steps = SOLVERS["iterated-function"](table + " | " + query, loops=turn["depth"])
            assert steps == turn["steps"] and turn["completion"] == " " + steps[-1] and len(steps) == turn["depth"]
            depths.append(turn["depth"])
    assert set(depths) == set(range(1, 10))
    out = tmp_path / "loops.jsonl"
    assert tasks.main(["iterated-function", "--depth-given", "loops", "--n", "3", "--out", str(out)]) == 0
    assert all(json.loads(line)["depth_given"] == "loops" for line in out.read_text().splitlines())
    assert all(record.meta["depth_given"] == "loops" for record in read_records([out]))  # kept as metadata
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "a", "completion": " b", "depth_given": "steps"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: field 'depth_given' is 'steps'; allowed: 'query', 'loops'"):
        list(read_records([bad]))
    with pytest.raises(
        ValueError, match="--depth-given loops; allowed: query, loops for iterated-function, query otherwise"
    ):
        tasks.generate("chains", range(1, 3), 2, seed=0, depth_given="loops")


def test_cli_refuses_many_queries_as_chat_or_scratchpad(tmp_path, capsys):
    out = tmp_path / "q.jsonl"
    assert tasks.main(["iterated-function", "--queries", "4", "--chat", "--out", str(out)]) == 2
    assert (
        "--queries 4 writes records of many answers; allowed with neither --chat nor --scratchpad"
        in capsys.readouterr().err
    )
    assert not out.exists()
