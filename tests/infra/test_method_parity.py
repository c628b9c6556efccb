"""The baselines' parts under the parallel plans: a 2-rank FSDP run (SCSE: TP) with compile
(and AC) against one eager rank from the same seed checkpoint, with no recompile (the helpers and
tolerances of test_parallel_parity.py; a module of its own so CI spreads the runs)."""

import pytest

from grt_test_helpers import LOGGED_GRAD_NORM_REL, MOR_PARTS, SCSE_PARTS, parts_overrides
from infra.test_parallel_parity import STEPS, layout_args, make_seed_checkpoint, scalars, train
from tests.cases import ONE_RANK, PARITY_LAYOUTS

# The baselines' parts (docs/architecture.md, "Methods as parts"). Heavy-tail Poisson's random
# initial state is drawn per rank like the training noise, so, like the noise, it is off here;
# its depth law, truncated backprop and overwrite update stay on.
PARTS = {
    "poisson": [
        "--grt.update",
        "overwrite",
        "--grt.depth_sampling",
        "poisson_lognormal",
        "--grt.backprop_recurrences",
        "2",
    ],
    "rrt": [
        "--grt.injection",
        "none",
        "--grt.update",
        "overwrite",
        "--grt.depth_sampling",
        "fixed",
        "--grt.step_adapter",
        "lora",
        "--grt.lora_rank",
        "4",
    ],
    "scse": parts_overrides(SCSE_PARTS),  # the anchor outside the compiled step, its mask inside
}
# SCSE on TP 2: its zero-deviation mask sums over the whole sequence, which TP shards (the
# deviation step's sequence-sharded DTensor inputs all-reduce it), and A, B act per token. It
# trains under FSDP 2 in tests/reliability/test_method_resume.py (exact resume; A and B are plain
# linears to FSDP); 4 ranks of FSDP x TP cost three times this run on two cores.
LAYOUTS = {"scse": (2, PARITY_LAYOUTS["tp2"][1])}


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(PARTS))
def test_method_parts_compiled_sharded_with_ac_match_one_rank_without_recompiles(method, run_torchrun, tmp_path):
    parts = PARTS[method]
    seed = make_seed_checkpoint(tmp_path / "seed", parts)
    ref_losses, _ = train(run_torchrun, tmp_path, seed, "one_rank", 1, {**ONE_RANK, "args": parts})
    # The reference trains: a later step's loss below the first. Not the last step's alone: the
    # depth laws sample another r for every step, and one deep last step may sit above the first.
    assert min(ref_losses[1:]) < ref_losses[0], ref_losses
    run_dir = tmp_path / "sharded_compile_ac"
    nproc, layout = LAYOUTS.get(method, (2, {}))
    # aot_eager_decomp_partition: dynamo's graphs and guards (what a recompile is), AOTAutograd,
    # decompositions and the partitioner as inductor has them, without inductor's C++ code
    # generation (inductor compiles the GRT step in the GPU suite, benchmarks/gpu/suite.py).
    args = layout_args(
        run_dir,
        seed,
        nproc,
        {
            **layout,
            "args": [
                *parts,
                "--compile.enable",
                "--compile.backend",
                "aot_eager_decomp_partition",
                "--activation_checkpoint.mode",
                "selective",
                "--activation_checkpoint.selective_ac_option",
                "op",
            ],
        },
    )
    proc = run_torchrun(nproc, args, tmp_path / "compile-log", env={"TORCH_LOGS": "recompiles"})
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "Compiled the recurrence step once" in output
    # Sampled depths and step indices reuse one graph. Truncated backprop (Poisson) runs its
    # early steps without autograd: that graph is compiled once more, on the grad-mode guard.
    recompiles = output.count("Recompiling function")
    grad_mode = output.count("GLOBAL_STATE changed: grad_mode")
    assert recompiles == grad_mode <= (1 if method == "poisson" else 0), output[-3000:]
    assert scalars(run_dir, "loss_metrics/global_avg_loss") == pytest.approx(ref_losses, rel=1e-4)


# MoR's two routers ([grt] router): expert choice's top-k per step, token choice's one depth per
# token. Token choice's balancing loss R sum_j P_j f_j is a product of the local batch's means
# (docs/mor.md, "Token choice"): 2 ranks of 2 rows and 1 rank of 4 rows train different
# functions (measured: grad norms 1e-3 apart), so it is off here; its per-token z-loss, like
# expert choice's per-row BCE, sums over tokens the same on any layout, and is on.
TOKEN_CHOICE = {"router_balance_weight": 0.0, "router_z_loss_weight": 0.01}
ROUTERS = {
    router: parts_overrides({**MOR_PARTS, "router": router, **extra})
    for router, extra in (("expert_choice", {}), ("token_choice", TOKEN_CHOICE))
}


@pytest.mark.slow
@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_mixture_of_recursions_fsdp_compiled_matches_one_rank(router, run_torchrun, tmp_path):
    """MoR ([grt] router, either router): one 2-rank FSDP run with compile (and the per-step
    router metrics of every logged step) against a 1-rank eager run from the same seed checkpoint."""
    overrides = ROUTERS[router]
    # A seeded initialisation: which depths token choice's router picks by step 5 depends on it.
    seed = make_seed_checkpoint(tmp_path / "seed", [*overrides, "--debug.seed", "11"])
    ref_losses, ref_norms = train(run_torchrun, tmp_path, seed, "one_rank", 1, {**ONE_RANK, "args": overrides})
    assert len(ref_losses) == STEPS and ref_losses[-1] < ref_losses[0]
    run_dir = tmp_path / "fsdp2_compile"
    # aot_eager_decomp_partition, as above: the routed step's graph (its gathers and scatters of
    # k_i tokens per step), its guards and its AOTAutograd joint graph are what this test checks;
    # inductor's C++ code generation of them would prove no more than the GRT's inductor
    # compile in the GPU suite (benchmarks/gpu/suite.py).
    backend = "aot_eager_decomp_partition"
    proc = run_torchrun(
        2,
        layout_args(run_dir, seed, 2, {"args": [*overrides, "--compile.enable", "--compile.backend", backend]}),
        tmp_path / "fsdp2-compile-log",
        env={"TORCH_LOGS": "recompiles"},
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "Compiled the recurrence step once" in output
    assert "Recompiling function" not in output  # every k (k_i, token choice's k_max) and every step: one graph
    # The decompositions reorder fp32 reductions: compiled and eager runs agree to ~1e-6 per step.
    assert scalars(run_dir, "loss_metrics/global_avg_loss") == pytest.approx(ref_losses, rel=1e-4)
    assert scalars(run_dir, "grad_norm") == pytest.approx(ref_norms, rel=LOGGED_GRAD_NORM_REL)
    copy_step1, copy_step4 = (scalars(run_dir, f"grt_gate_copy_frac/step{i}") for i in (1, 4))
    if router == "expert_choice":
        # The observer sees the routed steps: the copy share of step 4 (capacity 1/4) is >= 3/4.
        assert all(v >= 0.75 for v in copy_step4) and len(copy_step4) == STEPS
    else:
        # Every token runs step 1 with g = its largest router probability >= 1/R, never a copy
        # (1 - g <= 3/4); step 4 copies the tokens that chose fewer steps.
        assert copy_step1 == [0.0] * STEPS and all(v > 0 for v in copy_step4), (copy_step1, copy_step4)
