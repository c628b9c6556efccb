"""benchmarks/depth_pays_bench.py: its problems recomputed by hand (a single cycle, each answer
f^d(x) at its query, step t's target f^min(t, d)(x)), table 1's rows built from their paper
TOMLs, and a few steps of every row through the model's training forward and loss, scored and
summarised."""

import json

import pytest
import tomllib
import torch

from grt_test_helpers import REPO, import_benchmark


@pytest.fixture
def bench(monkeypatch):
    yield from import_benchmark(monkeypatch, "depth_pays_bench")


def test_problems_are_pointer_chases_over_one_cycle(bench, tmp_path):
    opts = bench.build_parser().parse_args(["--out", str(tmp_path)])
    n, k, r = opts.symbols, opts.queries, opts.recurrences
    batch = bench.problems(opts, 4, torch.Generator().manual_seed(0))
    for row in range(4):
        f = batch["tokens"][row, :n].tolist()
        x, seen = 0, set()
        for _ in range(n):  # one cycle through every symbol
            seen.add(x)
            x = f[x]
        assert seen == set(range(n)) and x == 0
        for q in range(k):
            query = batch["tokens"][row, n + q].item() - n
            start, depth = divmod(query, r)
            depth += 1
            assert depth == batch["depth"][row, q]
            walk = [start]
            for _ in range(r):
                walk.append(f[walk[-1]])
            assert batch["labels"][row, n + q] == walk[depth]
            assert batch["step_labels"][row, n + q].tolist() == [walk[min(t, depth)] for t in range(1, r + 1)]
    assert (batch["labels"][:, :n] == bench.IGNORE).all() and (batch["step_labels"][:, :n] == bench.IGNORE).all()
    shallow = bench.problems(opts, 64, torch.Generator().manual_seed(0), deepest=2)["depth"]  # the curriculum's
    assert set(shallow.flatten().tolist()) == {1, 2}


def test_every_row_trains_scores_and_summarises(bench, tmp_path, capsys):
    args = ["--out", str(tmp_path), "--steps", "4", "--eval-sequences", "2", "--recurrences", "3"]
    args += ["--cached-sequences", "0", "--probe-steps", "3"]  # the cached decode: its own test below
    assert bench.main([*args, "--parallel", "2"]) == 0  # rows in two spawned processes
    out = capsys.readouterr().out
    steps = {}
    for line in out.splitlines():
        if " training FLOPs/token, " in line:
            name, rest = line.split(": ", 1)
            steps[name] = int(rest.rsplit(", ", 1)[1].split()[0])
    assert steps["grt_steps"] == 4 and steps["dense"] < steps["grt"]  # equal FLOPs: 8 dense layers cost more
    summary = (tmp_path / "summary.md").read_text()
    sections = summary.split("## ")[1:]
    assert [s.split(":")[0] for s in sections] == list(bench.ROWS)
    named = dict(zip(bench.ROWS, sections))
    for recurrent in ("grt_steps", "grt"):  # depth x r = 0..2R, arrival; each halting rule
        assert "| depth | r=0 | r=1 | r=2 | r=3 | r=4 | r=5 | r=6 | mean arrival" in named[recurrent]
        table, halting = named[recurrent].split("Halting on a uniform mix")
        assert table.split("Step t's readout")[0].count("\n| ") == 4  # the header and depths 1..3
        rules = [line.split(" | ")[0] for line in halting.strip().splitlines()[4:] if line.startswith("| ")]
        assert rules == [f"| {rule} {x:g}" for rule, x in bench.HALTING] + [f"| learned {x:g}" for x in bench.LEARNED]
        assert "The learned rule's probe: fitted for 3 steps to the frozen model" in halting
        assert "Fixed depth on the same queries: r = 1: " in halting and "Mean steps of every token" in halting
        assert "over the fixed r = R forward's: argmax 1: " in halting
    assert "| depth | accuracy |" in named["dense"] and "Halting" not in named["dense"]
    assert "| r=6 |" in named["unlooped"] and "Halting" not in named["unlooped"]  # R = 1: nothing to halt
    assert "| r=3 | mean arrival" in named["rrt_steps"]  # an adapter per step: no r > R
    assert (
        "Halting on a uniform mix" not in named["mor"]
        and "Halting rules the model refuses: argmax 1, argmax 2: " in named["mor"]
        and "learned 0.03, learned 0.1, learned 0.3: halting = 'learned' is not supported with router" in named["mor"]
    )
    assert "refuses: gate 0.02:" in named["poisson_steps"]  # no gate to halt on; its other rules scored
    ouro = named["ouro"].split("Halting on a uniform mix")[1]
    exits = [line for line in ouro.splitlines() if line.startswith("| ouro-exit ")]
    assert [line.split(" | ")[0] for line in exits] == [f"| ouro-exit {q:g}" for q in bench.OURO_EXIT]
    assert all(1 <= float(line.split(" | ")[2]) <= 3 for line in exits)  # mean steps within 1..R
    for row in ("grt_steps", "ouro", "rrt_steps"):  # step t's target is the answer from t = d on
        depths = json.loads((tmp_path / row / "result.json").read_text())["depths"]
        for d, entry in depths.items():
            assert len(entry["step_accuracy"]) == 3
            for t in range(int(d), 4):
                assert entry["step_accuracy"][t - 1] == entry["accuracy"][t]
        assert "Step t's readout says f^min(t, d)(x)" in named[row]
    assert "Step t's readout" not in named["dense"]
    overview = {
        line.split(" | ")[0][2:]: line.split(" | ") for line in summary.split("## ")[0].splitlines()[4:] if line
    }
    assert list(overview) == list(bench.ROWS)
    for row, at in [("grt", "r = 3"), ("unlooped", "r = 1"), ("dense", "its own"), ("rrt_steps", "r = 3")]:
        cells = overview[row]
        assert cells[4] == at
        table = [line.split(" | ") for line in named[row].splitlines() if line.startswith("| 1 |")][0]
        column = 1 if at == "its own" else 1 + int(at[-1])  # the table's first cell is the depth
        assert cells[5] == table[column].strip(" |")  # depth 1 at the row's own depth

    def untrained(*args):
        raise AssertionError("a row with result.json and model.pt is scored again, not trained")

    bench.train = untrained
    # Two rows scored again (the halting and the refusing kind); the summary is rebuilt from
    # every row's result.json, those two included.
    assert bench.main([*args, "--rows", "grt_steps", "mor"]) == 0

    def scores(text):  # the wall-clock ratios are measured again, not scores
        return [line for line in text.splitlines() if not line.startswith("Wall-clock of the halted")]

    assert scores((tmp_path / "summary.md").read_text()) == scores(summary)  # the same weights, the same scores


def test_table_1_rows_take_their_paper_tomls_parts_at_the_tasks_depth(bench, tmp_path):
    opts = bench.build_parser().parse_args(["--out", str(tmp_path), "--recurrences", "4"])
    for row, stem in bench.PAPER_ROWS.items():
        args = bench.model_args(row, opts)
        paper = tomllib.loads((REPO / "train_configs" / "paper" / f"{stem}.toml").read_text())["grt"]
        for key, value in paper.items():
            expected = {"num_recurrences": 4, "min_recurrences": 1, "lora_rank": opts.dim // 4}.get(key, value)
            if key == "backprop_recurrences":
                expected = min(value, 4)
            assert getattr(args, key) == expected, (row, key)
        assert args.step_supervision == row.endswith("_steps") and args.num_recurrences == 4
    assert bench.model_args("unlooped", opts).num_recurrences == 1


def test_gate_bias_init_starts_every_gated_row_near_overwriting(bench, tmp_path):
    """--gate-bias-init -4: the gate of each gated row starts at sigmoid(-4) = 0.018 (the
    paper's +4: 0.982), its gate module measured on random states; unset, the model's +4 stays."""
    default = bench.build_parser().parse_args(["--out", str(tmp_path), "--recurrences", "2"])
    low = bench.build_parser().parse_args(["--out", str(tmp_path), "--recurrences", "2", "--gate-bias-init", "-4"])
    for row in ("grt_steps", "grt", "unlooped", "rrt_steps"):
        assert bench.model_args(row, default).gate_bias_init == 4.0
        assert bench.model_args(row, low).gate_bias_init == -4.0
    gates = []
    for opts in (default, low):
        torch.manual_seed(0)
        model = bench.GRTModel(bench.model_args("grt_steps", opts))
        with torch.no_grad():
            model.init_weights()
            h = torch.randn(2, 5, opts.dim)
            gates.append(model.recurrence.step.gate(h, h, None).mean().item())  # sigmoid(bias + a small term)
    assert gates == pytest.approx([0.982, 0.018], abs=0.005)


def test_loops_give_the_depth_beyond_r(bench, tmp_path, capsys):
    opts = bench.build_parser().parse_args(["--out", str(tmp_path), "--depth-given", "loops", "--recurrences", "3"])
    n, r = opts.symbols, opts.recurrences
    for depth in (2, 8):  # shallower and deeper than R
        batch = bench.problems(opts, 3, torch.Generator().manual_seed(0), depth=depth)
        for row in range(3):
            f = batch["tokens"][row, :n].tolist()
            for q in range(opts.queries):
                x = batch["tokens"][row, n + q].item() - n  # the query names x alone
                walk = [x]
                for _ in range(8):
                    walk.append(f[walk[-1]])
                assert batch["labels"][row, n + q] == walk[depth]
                assert batch["step_labels"][row, n + q].tolist() == walk[1 : r + 1]  # f^t(x), whatever d

    args = ["--out", str(tmp_path), "--depth-given", "loops", "--steps", "4", "--eval-sequences", "2"]
    assert bench.main([*args, "--recurrences", "3"]) == 0  # LOOPS_ROWS by default
    summary = (tmp_path / "summary.md").read_text()
    assert [s.split(":")[0] for s in summary.split("## ")[1:]] == list(bench.LOOPS_ROWS)
    assert "Halting" not in summary and "Loops = depth (the answer to depth d read at r = d): 1: " in summary
    grt = json.loads((tmp_path / "grt_steps" / "result.json").read_text())
    assert list(grt["depths"]) == [str(d) for d in range(1, 7)]  # to 2R (< N): beyond R
    rrt = json.loads((tmp_path / "rrt_steps" / "result.json").read_text())
    assert list(rrt["depths"]) == ["1", "2", "3"]  # a module per step: no deeper than R

    # r = d by hand: the same fresh problems, the saved weights, the answer read after d loops.
    # Four steps leave every r saying the same; weights moved at random make r matter, and a
    # second run scores them (the rows are not trained again).
    model = bench.GRTModel(bench.model_args("grt_steps", opts))
    weights = tmp_path / "grt_steps" / "model.pt"
    torch.manual_seed(0)
    torch.save(
        {k: v + torch.randn_like(v) if v.is_floating_point() else v for k, v in torch.load(weights).items()}, weights
    )
    model.load_state_dict(torch.load(weights))
    model.eval()
    assert bench.main([*args, "--recurrences", "3", "--rows", "grt_steps"]) == 0
    grt = json.loads((tmp_path / "grt_steps" / "result.json").read_text())
    assert any(len(set(e["accuracy"])) > 1 for e in grt["depths"].values())  # r changes the answers
    generator = torch.Generator().manual_seed(opts.seed + 1000)
    for d in range(1, 7):
        problems = bench.problems(opts, 2, generator, d)
        with torch.no_grad():
            said = model(problems["tokens"], num_recurrences=d)[:, n:].argmax(-1)
        expected = (said == problems["labels"][:, n:]).float().mean().item()
        assert grt["depths"][str(d)]["at_loops"] == pytest.approx(expected)
    summary = (tmp_path / "summary.md").read_text()
    overview = [line for line in summary.splitlines() if line.startswith("| grt_steps |")][0].split(" | ")
    assert overview[4] == "r = d" and overview[5 + 3] == f"{grt['depths']['4']['at_loops']:.2f}"

    capsys.readouterr()
    with pytest.raises(SystemExit):
        bench.main([*args, "--rows", "grt", "dense"])
    assert "rows grt, dense have no target at every step" in capsys.readouterr().err


def uneven_model(bench, opts):
    """A grt_steps model whose answers change with r and whose tokens halt unevenly."""
    torch.manual_seed(0)
    model = bench.GRTModel(bench.model_args("grt_steps", opts))
    with torch.no_grad():
        model.init_weights()
        for parameter in model.parameters():
            parameter.add_(0.5 * torch.randn_like(parameter))
    return model.eval()


def test_cached_decoding_answers_as_the_uncached_forwards_do(bench, tmp_path):
    """The exported model, its KV cache fed one query at a time, answers each query as the
    native model's whole-sequence forward does, at each fixed r and under a halting rule (with
    forward_with_halting's steps): with the table prefilled at full depth, its tokens held from
    halting (`may_halt`), and with the table halting too; the learned rule with the probe the
    export holds; the table compares each against fixed r = R."""
    opts = bench.build_parser().parse_args(["--out", str(tmp_path), "--recurrences", "3", "--cached-sequences", "2"])
    model = uneven_model(bench, opts)
    torch.manual_seed(1)
    probe = bench.HaltingProbe(model.model_args.dim).eval()
    rules = [("state", 1.0, "full"), ("argmax", 1, "full"), ("learned", 0.5, "full")]
    rules += [("state", 1.0, "halts"), ("argmax", 1, "halts")]
    rows = bench.cached_answers(model, opts, rules, probe)
    names = ["r = 1", "r = 2", "r = 3", "state 1", "argmax 1", "learned 0.5"]
    names += ["state 1, context halting too", "argmax 1, context halting too"]
    assert [row["decode"] for row in rows] == names
    batch = bench.problems(opts, 3, torch.Generator().manual_seed(opts.seed + 3000))  # the first: untimed
    tokens, answers, n = batch["tokens"][1:], batch["labels"][1:, opts.symbols :], opts.symbols
    with torch.no_grad():
        for r, row in zip((1, 2, 3), rows):
            said = model(tokens, num_recurrences=r)[:, n:].argmax(-1)
            assert row["accuracy"] == (said == answers).float().mean().item() and row["mean_steps"] == r
        assert len({row["accuracy"] for row in rows[:3]}) > 1  # r matters to these weights
        for (rule, x, context), row in zip(rules, rows[3:]):
            may_halt = torch.arange(tokens.shape[1]) >= n if context == "full" else None
            reads = probe if rule == "learned" else None
            logits, steps = model.forward_with_halting(tokens, rule, x, may_halt=may_halt, probe=reads)
            assert row["accuracy"] == (logits[:, n:].argmax(-1) == answers).float().mean().item()
            assert row["mean_steps"] == pytest.approx(steps[:, n:].float().mean().item())
            assert row["seconds_per_answer"] > 0
            assert len(set(steps[:, n:].flatten().tolist())) > 1  # tokens halt at different steps
    lines = bench.cached_lines(rows, opts)
    assert lines[0].startswith("Cached decoding, batch 1, 2 sequences") and "| r = 3 | " in lines[4 + 2]
    assert lines[4 + 2].split(" | ")[5] == "1.00x"  # r = R against itself


def test_each_rule_halts_the_queries_and_context_halts_scores_it_again_with_the_table(bench, tmp_path, monkeypatch):
    """By default each rule (the learned one too) halts the queries alone, the table's tokens
    running every step; --context-halts scores each a second time with the table halting too,
    the rows named apart."""
    monkeypatch.setattr(bench, "HALTING", (("state", float("inf")), ("argmax", 1)))  # inf: all halt at step 1
    args = ["--out", str(tmp_path), "--recurrences", "3", "--eval-sequences", "4", "--probe-steps", "2"]
    opts = bench.build_parser().parse_args([*args, "--context-halts"])
    rows, probe = bench.evaluate_halting(uneven_model(bench, opts), opts)
    assert isinstance(probe, bench.HaltingProbe)  # the cached decode's export holds it
    full = [(r["rule"], r["threshold"]) for r in rows if r["context"] == "full"]
    halts = [(r["rule"], r["threshold"]) for r in rows if r["context"] == "halts"]
    assert full == halts == [*bench.HALTING, *[("learned", x) for x in bench.LEARNED]]
    at_once = {r["context"]: r["every_token_mean_steps"] for r in rows if r["threshold"] == float("inf")}
    table_at_full_depth = (opts.symbols * 3 + opts.queries) / (opts.symbols + opts.queries)  # R = 3
    assert at_once == {"halts": 1.0, "full": pytest.approx(table_at_full_depth)}
    text = "\n".join(bench.halting_lines(rows))
    assert "| state inf |" in text and "| state inf, context halting too |" in text
    assert "| learned 0.1, context halting too |" in text
    default, _ = bench.evaluate_halting(uneven_model(bench, opts), bench.build_parser().parse_args(args))
    assert [r["context"] for r in default] == ["full"] * len(full)


def test_a_halting_rule_that_loses_answers_is_named_under_the_table(bench):
    """The benchmark's halting table says in one line which rule lost answers against the most
    accurate fixed depth (eval-task's summary and line), and counts no saving for it."""
    from grt_titan.analysis.task_eval import halting_summary

    correct = [{1: d == 1, 2: True} for d in (1, 2, 2)]
    rows = [
        {
            **halting_summary([1, 2, 2], [(True, 1.0), (False, 1.0), (True, 2.0)], correct, "learned", 0.1),
            "every_token_mean_steps": 1.2,
        },
        {
            **halting_summary([1, 2, 2], [(True, 1.0), (True, 2.0), (True, 2.0)], correct, "kl", 0.1),
            "every_token_mean_steps": 1.8,
        },
    ]
    lines = bench.halting_lines(rows)
    named = [line for line in lines if "lost answers" in line]
    assert named == [
        "halting learned 0.1 lost answers: 0.667 against 1.000 at fixed r = 2, 0.333 below "
        "(tolerance 0.01, --halting-tolerance); its 1.33 steps are no saving"
    ]
    assert any("| learned 0.1 |" in line and "lost 0.333, no saving" in line for line in lines)
    assert any("| kl 0.1 |" in line and "2 (1.000): 17%" in line for line in lines)
