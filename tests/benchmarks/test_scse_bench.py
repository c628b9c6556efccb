"""benchmarks/scse_bench.py's plan: every row built from its preset, steps at equal training
FLOPs (the GRT's steps x its FLOPs per token / the row's), SCSE's row with SCSE's parts."""

import sys

from grt_test_helpers import REPO


def test_plan_gives_each_row_the_grts_flop_budget(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import scse_bench

    assert scse_bench.main(["--out", str(tmp_path), "--plan", "--steps", "300"]) == 0
    rows = {}
    for line in capsys.readouterr().out.splitlines():
        name, _, rest = line.partition(": ")
        flops = int(rest.split(" training FLOPs")[0].split(", ")[-1].replace(",", ""))
        rows[name] = (flops, int(rest.split(", ")[-1].split()[0]))
    assert set(rows) == {"grt", "scse", "recurrence", "dense"}
    budget = rows["grt"][0] * 300
    assert rows["grt"][1] == 300
    for name, (flops, steps) in rows.items():
        assert steps == round(budget / flops), name
    # SCSE has no W_proj and no gate per step, one anchor per forward: fewer FLOPs, more steps.
    assert rows["scse"][0] < rows["grt"][0] and rows["scse"][1] > 300
    sys.modules.pop("scse_bench", None)
