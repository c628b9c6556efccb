"""`grt-titan analyze`'s per-token halting sweep and step dynamics: the sweep's end points
against the fixed-depth loss and FLOPs, the step dynamics against states and logits of
independent forwards, the rules a model refuses, the command-line flags. (The JSON keys and
PNGs of a default run: test_analysis.py.)"""

import json
import math

import pytest
import torch

from grt_titan.analysis.cli import build_parser
from grt_titan.analysis.diagnostics import (
    COUNT_RULES,
    HALTING_GRIDS,
    DepthAnalysis,
    HaltingSweep,
    best_against_fixed_depth,
    fixed_depth_flops_at,
    halting_thresholds,
)
from grt_titan.analysis.report import JSON_NAME, NOT_ASKED, PLOTS
from grt_titan.cli import main as cli_main
from grt_titan.model.halting.rules import HALTING_RULES, READOUT_RULES

from components_helpers import ByteTokenizer, make_dataset, tiny_args, tiny_model
from grt_test_helpers import MOR_PARTS, build_model, nonzero_biases

MIN_DEPTH, MAX_DEPTH = 2, 5


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, 255, (3, 24), generator=torch.Generator().manual_seed(seed))
    labels = torch.randint(0, 255, (3, 24), generator=torch.Generator().manual_seed(seed + 1))
    return tokens, labels


def test_every_halting_rule_has_a_threshold_grid():
    assert set(HALTING_RULES) <= set(HALTING_GRIDS), set(HALTING_RULES) - set(HALTING_GRIDS)
    for rule in HALTING_RULES:
        grid = halting_thresholds(rule, MAX_DEPTH)
        assert grid == sorted(grid) and len(set(grid)) == len(grid) >= 4, (rule, grid)
        if rule in COUNT_RULES:  # step counts from 0 (halts at a) up to b - 1 (runs to b)
            assert grid == [0, 1, 2, 3, 4] and all(isinstance(n, int) for n in grid)
        else:  # 0 = the fixed depth b, then a geometric run of measures
            assert grid[0] == 0.0 and all(b / a <= 3.5 for a, b in zip(grid[1:], grid[2:])), (rule, grid)
    with pytest.raises(ValueError, match="no threshold grid"):
        halting_thresholds("no_such_rule", MAX_DEPTH)


@pytest.mark.parametrize("rule", HALTING_RULES)
def test_halting_sweep_ends_at_the_fixed_depths(rule):
    """The threshold that never halts gives the fixed-depth loss at b and F(b), the one that
    halts at once the loss at a and F(a), on the same batches as `DepthAnalysis`."""
    model = tiny_model().eval()
    never, at_once = (MAX_DEPTH, 0) if rule in COUNT_RULES else (0.0, math.inf)
    fixed = DepthAnalysis(max_depth=MAX_DEPTH, final_depth=3)
    sweep = HaltingSweep(MIN_DEPTH, MAX_DEPTH, rules=[rule], grids={rule: [never, at_once]})
    for seed in (0, 2):  # two batches: the sums and the token weighting add up alike
        tokens, labels = batch(seed)
        fixed.add_batch(model, tokens, labels)
        sweep.add_batch(model, tokens, labels)
    loss = fixed.result()["loss"]
    args = model.model_args
    curve = sweep.result(args, 24)["rules"][rule]
    assert curve["thresholds"] == [never, at_once]
    assert curve["mean_depth"] == [MAX_DEPTH, MIN_DEPTH]
    assert curve["loss"] == pytest.approx([loss[MAX_DEPTH], loss[MIN_DEPTH]], rel=1e-6)
    # A readout rule also read out each earlier step: coda (one block) and head.
    readout = (2 * 12 * args.dim**2 + 4 * 24 * args.dim + 2 * args.dim * args.padded_vocab_size) * (
        rule in READOUT_RULES
    )
    assert args.n_coda_layers == 1 and args.block_style == "gpt2" and args.ffn_hidden_dim == 4 * args.dim
    assert curve["forward_flops_per_token"] == pytest.approx(
        [
            args.forward_flops_per_token(24, MAX_DEPTH) + (MAX_DEPTH - 1) * readout,
            args.forward_flops_per_token(24, MIN_DEPTH) + (MIN_DEPTH - 1) * readout,
        ],
        rel=1e-12,
    )
    # The two ends differ (by 5e-7 relative on torch 2.11's init of this tiny model).
    assert loss[MAX_DEPTH] != loss[MIN_DEPTH]


def test_halting_sweep_between_the_ends_counts_realised_depths():
    """A threshold in between: some tokens halt early, and the FLOPs are those of the depths
    `forward_with_halting` returns, averaged over the tokens of both batches."""
    model = tiny_model().eval()
    sweep = HaltingSweep(1, MAX_DEPTH, rules=["state"], grids={"state": [0.2]})
    depths = []
    for seed in (0, 2):
        tokens, labels = batch(seed)
        sweep.add_batch(model, tokens, labels)
        with torch.no_grad():
            depths.append(model.forward_with_halting(tokens, "state", 0.2, num_recurrences=MAX_DEPTH)[1].flatten())
    depths = torch.cat(depths)
    assert 1 < depths.float().mean() < MAX_DEPTH and len(set(depths.tolist())) > 1  # a mix of depths
    curve = sweep.result(model.model_args, 24)["rules"]["state"]
    assert curve["mean_depth"] == [pytest.approx(depths.double().mean().item(), rel=1e-12)]
    want = sum(model.model_args.forward_flops_per_token(24, int(d)) for d in depths) / depths.numel()
    assert curve["forward_flops_per_token"] == [pytest.approx(want, rel=1e-12)]


def test_fixed_depth_flops_at_reads_figure_3s_curve():
    """The FLOPs a fixed depth needs for a loss: the first depth reaching it, interpolated with
    the depth before (by hand: loss 5.3 lies half-way from 5.4 at r = 1 to 5.2 at r = 2)."""
    fixed_loss, flops = [7.0, 5.4, 5.2, 5.25], [10.0, 11.0, 12.0, 13.0]
    assert fixed_depth_flops_at(5.3, fixed_loss, flops) == pytest.approx(11.5)
    assert fixed_depth_flops_at(5.2, fixed_loss, flops) == pytest.approx(12.0)  # exactly r = 2
    assert fixed_depth_flops_at(5.25, fixed_loss, flops) == pytest.approx(11.75)  # r = 3 is worse than r = 2
    assert fixed_depth_flops_at(7.5, fixed_loss, flops) == 10.0  # r = 0 already reaches it
    assert fixed_depth_flops_at(5.1, fixed_loss, flops) is None  # below every fixed depth
    curve = {"forward_flops_per_token": [12.0, 11.0, 9.0], "fixed_depth_flops_per_token": [12.0, 12.1, None]}
    assert best_against_fixed_depth(curve) == 1  # 11 / 12.1; the point no fixed depth reaches is left out
    assert best_against_fixed_depth({**curve, "fixed_depth_flops_per_token": [None] * 3}) is None


def test_step_dynamics_equal_independent_forwards():
    model = tiny_model().eval()
    tokens, labels = batch()
    acc = DepthAnalysis(max_depth=4, final_depth=3)
    acc.add_batch(model, tokens, labels)
    result = acc.result()
    V = model.model_args.vocab_size
    with torch.no_grad():
        h_pre = model.prelude(model.embed(tokens), model.freqs_cis)
        state = {s: model.recurrence(h_pre, model.freqs_cis, s).state.double() for s in range(5)}
        for s in range(1, 5):
            top = model(tokens, num_recurrences=s)[..., :V].topk(2, dim=-1).values
            margin = (top[..., 0] - top[..., 1]).double().mean().item()
            h, prev = state[s], state[s - 1]
            unit = prev / prev.norm(dim=-1, keepdim=True)
            # angle from the parallel and perpendicular parts of h_s (atan2, not arccos of a cosine)
            parallel = (h * unit).sum(-1)
            perpendicular = (h - parallel[..., None] * unit).norm(dim=-1)
            angle = torch.atan2(perpendicular, parallel).mean().item() * 180 / math.pi
            # radial share: the displacement's part along h_{s-1}, from its perpendicular part
            step = h - prev
            across = (step - (step * unit).sum(-1, keepdim=True) * unit).norm(dim=-1)
            radial = (1 - (across / step.norm(dim=-1)) ** 2).sqrt().mean().item()
            assert result["decision_margin"][s - 1] == pytest.approx(margin, rel=1e-4, abs=1e-6), s
            assert result["angle_degrees"][s - 1] == pytest.approx(angle, rel=1e-6), s
            assert result["radial_share"][s - 1] == pytest.approx(radial, rel=1e-6), s
    # Not constant across steps (the checks above could not pass by a per-token constant).
    for key in ("decision_margin", "angle_degrees", "radial_share"):
        assert len({round(v, 6) for v in result[key]}) == 4, (key, result[key])


def test_anchor_response_is_one_step_from_the_anchor_and_zero_for_scse():
    """||T_s(a; e) - a|| / ||e|| per token, by hand: the GRT's step from a = e = h_pre (W_proj
    [e ; e], the core, the gate), nonzero; SCSE's from a = h*, exactly 0 (the mask and G(0) = 0),
    also with GPT-2 blocks."""
    tokens, labels = batch()
    grt = tiny_model().eval()
    acc = DepthAnalysis(max_depth=3, final_depth=3)
    acc.add_batch(grt, tokens, labels)
    with torch.no_grad():
        e = grt.prelude(grt.embed(tokens), grt.freqs_cis)
        moved = grt.recurrence.step(e, e, grt.freqs_cis)
        want = ((moved - e).double().norm(dim=-1) / e.double().norm(dim=-1)).mean().item()
    response = acc.result()["anchor_response"]
    assert response == pytest.approx([want] * 3, rel=1e-9) and want > 0.01
    from grt_titan.model.methods.table import SCSE

    scse = build_model(tiny_args(**{**SCSE.parts, "gate_noise_std": 0.0}), 0).eval()
    nonzero_biases(scse.recurrence.step.core)  # GPT-2 blocks as trained: G(0) != 0, the mask holds h*
    acc = DepthAnalysis(max_depth=3, final_depth=3)
    acc.add_batch(scse, tokens, labels)
    assert acc.result()["anchor_response"] == [0.0, 0.0, 0.0]


def test_halting_skips_the_rules_a_model_refuses():
    no_gate = build_model(tiny_args(update="overwrite"), 0).eval()
    sweep = HaltingSweep(1, 3)
    sweep.skip(no_gate)
    assert sweep.skipped == {"gate": "no gate (update = 'overwrite')"}
    assert sweep.rules == [rule for rule in HALTING_RULES if rule != "gate"]
    mor = build_model(tiny_args(**MOR_PARTS), 0).eval()  # the router chooses each token's steps
    sweep = HaltingSweep(1, 3)
    sweep.skip(mor)
    assert sweep.rules == [] and set(sweep.skipped) == set(HALTING_RULES)
    assert all("router" in reason or "gate" in reason for reason in sweep.skipped.values()), sweep.skipped
    with pytest.raises(ValueError, match="halting rules"):
        HaltingSweep(1, 3, rules=["state", "no_such_rule"])
    with pytest.raises(ValueError, match="min depth"):
        HaltingSweep(4, 3)


def test_analyze_cli_halting_flags(tmp_path, monkeypatch, capsys):
    """--halting-rules and --halting-min-depth reach the sweep; the rules left out are named."""
    import grt_titan.analysis.load as load

    model = tiny_model()
    loaded = load.LoadedModel(model, model.model_args, ByteTokenizer(), None, {"kind": "test"})
    monkeypatch.setattr(load, "load_model", lambda *args, **kwargs: loaded)
    data, out = make_dataset(tmp_path / "data"), tmp_path / "out"
    argv = ["analyze", "model", "--data", str(data), "--seq-len", "32", "--out", str(out)]
    argv += ["--num-sequences", "2", "--no-progress", "--prompt", "def f(x):"]
    assert cli_main([*argv, "--halting-rules", "state", "--halting-min-depth", "2"]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}/{JSON_NAME}" in printed
    result = json.loads((out / JSON_NAME).read_text())
    halting, early_exit = result["halting"], result["early_exit"]
    # Each swept point against figure 3's curve of the same run, and the best of them printed.
    state = halting["rules"]["state"]
    assert state["fixed_depth_flops_per_token"] == [
        fixed_depth_flops_at(x, early_exit["loss"], early_exit["forward_flops_per_token"]) for x in state["loss"]
    ]
    best = best_against_fixed_depth(state)
    assert best is not None  # the never-halting end has the loss of r = b, which r = b reaches
    ratio = state["forward_flops_per_token"][best] / state["fixed_depth_flops_per_token"][best]
    assert f"halting 'state': at best {ratio:.3f}x the forward FLOPs of a fixed depth at the same loss" in printed
    assert (halting["min_depth"], halting["max_depth"], list(halting["rules"])) == (2, 5, ["state"])
    assert halting["rules"]["state"]["mean_depth"][0] == 5 and min(halting["rules"]["state"]["mean_depth"]) >= 2
    assert halting["skipped"] == {rule: NOT_ASKED for rule in HALTING_RULES if rule != "state"}
    assert (out / PLOTS["halting"]).is_file()
    parse = build_parser().parse_args
    assert parse(["model", "--out", "o", "--no-halting"]).no_halting
    for bad in (["--halting-rules", "no_such_rule"], ["--no-halting", "--halting-rules", "state"]):
        with pytest.raises(SystemExit):
            parse(["model", "--out", "o", *bad])
