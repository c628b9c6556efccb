"""`grt-titan analyze`: per-depth numbers against independent forwards, files it writes,
command-line errors. (Analyzing a trained checkpoint / HF export: the end-to-end run in
tests/components/test_observability_e2e.py.)"""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from grt_titan.analysis.diagnostics import COUNT_RULES, DepthAnalysis, gate_heatmap, halting_thresholds
from grt_titan.analysis.report import JSON_NAME, analyze
from grt_titan.cli import main as cli_main
from grt_titan.data.config import DataConfig
from grt_titan.data.loader import TokenSequenceDataset, open_dataset_split
from grt_titan.model.halting.rules import HALTING_RULES

from components_helpers import ByteTokenizer, check_analysis_output, hand_step_stats, make_dataset, tiny_model


def test_depth_analysis_equals_independent_forwards():
    model = tiny_model().eval()
    tokens = torch.randint(0, 255, (3, 24), generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, 255, (3, 24), generator=torch.Generator().manual_seed(1))
    acc = DepthAnalysis(max_depth=5, final_depth=3)
    acc.add_batch(model, tokens, labels)
    result = acc.result()
    with torch.no_grad():
        logp = {r: F.log_softmax(model(tokens, num_recurrences=r), -1) for r in range(6)}
    for r in range(6):
        loss = F.nll_loss(logp[r].flatten(0, 1), labels.flatten()).item()
        kl = (logp[3].exp() * (logp[3] - logp[r])).sum(-1).mean().item()
        # Same ops on the same state; coda/head on a captured state vs inside forward: 1e-5.
        assert result["loss"][r] == pytest.approx(loss, rel=1e-5)
        assert result["kl_to_final"][r] == pytest.approx(kl, rel=1e-4, abs=1e-6)
    assert result["kl_to_final"][3] == 0.0

    # Per-step statistics against the same quantities computed from step outputs directly.
    rec = model.recurrence
    with torch.no_grad():
        h_pre = model.prelude(model.embed(tokens), None)
        h = h_pre
        for i in range(5):
            h_new, g, o = rec.step(h, h_pre, None, return_parts=True)
            want = hand_step_stats(h, h_new, g, o)
            for key, value in want.items():
                assert result[key][i] == pytest.approx(value, rel=1e-5), (i, key)
            assert result["update_norm"][i] == pytest.approx((h_new - h).norm(dim=-1).mean().item(), rel=1e-5)
            assert result["proposal_norm"][i] == pytest.approx(o.norm(dim=-1).mean().item(), rel=1e-5)
            assert result["state_cosine"][i] == pytest.approx(
                F.cosine_similarity(h_new, h, dim=-1).mean().item(), rel=1e-5
            )
            assert result["proposal_cosine"][i] == pytest.approx(
                F.cosine_similarity(o, h, dim=-1).mean().item(), rel=1e-4, abs=1e-6
            )
            assert result["relative_update"][i] == pytest.approx(((h_new - h).norm() / h.norm()).item(), rel=1e-5)
            # Figure 10a's bands: a histogram quantile lies between the two order statistics
            # around q (where quantile definitions differ), give or take one bin (1e-3).
            ordered = g.flatten().double().sort().values
            for q in (0.05, 0.25, 0.5, 0.75, 0.95):
                k = math.ceil(q * ordered.numel())
                low, high = ordered[max(k - 1, 0)].item(), ordered[min(k, ordered.numel() - 1)].item()
                got = result[f"gate_q{round(100 * q):02d}"][i]
                assert low - 1e-3 <= got <= high + 1e-3, (i, q, low, got, high)
                # The sample is dense enough here that the gap is small: the test can fail.
                assert high - low < 0.01, (i, q, low, high)
            h = h_new


def test_gate_heatmap_is_the_feature_mean_of_each_step():
    model = tiny_model().eval()
    ids = [5, 17, 200, 3]
    rows = gate_heatmap(model, ids, depth=3)
    with torch.no_grad():
        h_pre = model.prelude(model.embed(torch.tensor([ids])), None)
        h = h_pre
        for i in range(3):
            h, g, _ = model.recurrence.step(h, h_pre, None, return_parts=True)
            assert rows[i] == pytest.approx(g.mean(-1)[0].tolist(), rel=1e-6)


def test_analyze_writes_every_plot_and_the_json(tmp_path):
    model = tiny_model()
    data = make_dataset(tmp_path / "data")
    stream = open_dataset_split(str(data), None, "val", ByteTokenizer(), DataConfig(), "analyze")
    dataset = TokenSequenceDataset(stream, 32, dp_rank=0, dp_world_size=1, seed=0, shuffle=False)
    result = analyze(
        model,
        ByteTokenizer(),
        dataset,
        tmp_path / "out",
        num_sequences=6,
        batch_size=4,
        prompts=["The old man sat by the", "def f(x):"],
        progress=False,
    )
    out = tmp_path / "out"
    check_analysis_output(out, num_recurrences=3, max_depth=5)  # every PNG of PLOTS
    assert result["data"] == {"sequences": 6, "seq_len": 32, "tokens": 6 * 32}
    assert result["early_exit"]["forward_flops_per_token"] == [
        model.model_args.forward_flops_per_token(32, r) for r in range(6)
    ]
    assert result["early_exit"]["layer_depth"] == [2 + r for r in range(6)]
    assert {"halting", "step_dynamics"} <= set(result["plots"])
    assert json.loads((out / JSON_NAME).read_text())["halting"] == result["halting"]

    # Per-token halting: every rule (the tiny model has a gate), on its grid, from a = 1 to b = 5.
    halting, loss = result["halting"], result["early_exit"]["loss"]
    assert (halting["min_depth"], halting["max_depth"], halting["skipped"]) == (1, 5, {})
    assert list(halting["rules"]) == list(HALTING_RULES)
    for rule, curve in halting["rules"].items():
        assert set(curve) == {
            "thresholds",
            "loss",
            "mean_depth",
            "forward_flops_per_token",
            "fixed_depth_flops_per_token",
        }
        assert curve["thresholds"] == halting_thresholds(rule, 5)
        assert all(len(curve[key]) == len(curve["thresholds"]) for key in curve), rule
        assert all(1 <= d <= 5 for d in curve["mean_depth"]), rule
        # The grid's point that runs every token to b: the fixed-depth loss at b.
        deepest = curve["thresholds"].index(max(curve["thresholds"]) if rule in COUNT_RULES else 0.0)
        assert curve["loss"][deepest] == pytest.approx(loss[5], rel=1e-6), rule
        assert curve["mean_depth"][deepest] == 5, rule

    dynamics = result["step_dynamics"]
    assert set(dynamics) == {"steps", "decision_margin", "angle_degrees", "radial_share", "anchor_response"}
    assert all(a > 0 for a in dynamics["anchor_response"])  # GRT re-injects h_pre: its anchor moves
    assert dynamics["steps"] == [1, 2, 3, 4, 5] and all(len(v) == 5 for v in dynamics.values())
    assert all(0 < a < 180 for a in dynamics["angle_degrees"])
    assert all(0 < r < 1 for r in dynamics["radial_share"])
    assert all(m > 0 for m in dynamics["decision_margin"])


def test_analyze_rejects_a_dense_model(tmp_path):
    with pytest.raises(ValueError, match="no recurrence"):
        analyze(tiny_model(n_core_layers=0), ByteTokenizer(), [None], tmp_path, progress=False)


def test_analyze_cli_errors(tmp_path, capsys):
    assert cli_main(["analyze", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert cli_main(["analyze", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "needs --config" in capsys.readouterr().err
