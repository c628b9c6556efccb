"""The baselines' parts under the parallel plans: a 2-rank FSDP run with compile (and AC)
against one eager rank from the same seed checkpoint, with no recompile (the helpers and
tolerances of test_parallel_parity.py; a module of its own so CI spreads the runs)."""

import pytest

from grt_test_helpers import MOR_OVERRIDES
from infra.test_parallel_parity import ONE_RANK, STEPS, layout_args, make_seed_checkpoint, scalars, train

# The baselines' parts (docs/architecture.md, "Methods as parts"). Heavy-tail Poisson's random
# initial state is drawn per rank like the training noise, so, like the noise, it is off here;
# its depth law, truncated backprop and overwrite update stay on.
PARTS = {
    "poisson": ["--grt.update", "overwrite", "--grt.depth_sampling", "poisson_lognormal",
                "--grt.backprop_recurrences", "2"],
    "rrt": ["--grt.injection", "none", "--grt.update", "overwrite", "--grt.depth_sampling", "fixed",
            "--grt.step_adapter", "lora", "--grt.lora_rank", "4"],
}


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(PARTS))
def test_method_parts_compiled_fsdp_with_ac_match_one_rank_without_recompiles(method, run_torchrun, tmp_path):
    parts = PARTS[method]
    seed = make_seed_checkpoint(tmp_path / "seed", parts)
    ref_losses, _ = train(run_torchrun, tmp_path, seed, "one_rank", 1, {**ONE_RANK, "args": parts})
    assert ref_losses[-1] < ref_losses[0]
    run_dir = tmp_path / "fsdp2_compile_ac"
    args = layout_args(run_dir, seed, 2, {"args": [*parts, "--compile.enable", "--activation_checkpoint.mode",
                                                   "selective", "--activation_checkpoint.selective_ac_option", "op"]})
    proc = run_torchrun(2, args, tmp_path / "compile-log", env={"TORCH_LOGS": "recompiles"})
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "Compiled the recurrence step once" in output
    # Sampled depths and step indices reuse one graph. Truncated backprop (Poisson) runs its
    # early steps without autograd: that graph is compiled once more, on the grad-mode guard.
    recompiles = output.count("Recompiling function")
    grad_mode = output.count("GLOBAL_STATE changed: grad_mode")
    assert recompiles == grad_mode <= (1 if method == "poisson" else 0), output[-3000:]
    assert scalars(run_dir, "loss_metrics/global_avg_loss") == pytest.approx(ref_losses, rel=1e-4)


@pytest.mark.slow
def test_mixture_of_recursions_fsdp_compiled_matches_one_rank(run_torchrun, tmp_path):
    """MoR ([grt] router): one 2-rank FSDP run with compile (and the per-step router metrics
    of every logged step) against a 1-rank eager run from the same seed checkpoint."""
    seed = make_seed_checkpoint(tmp_path / "seed", MOR_OVERRIDES)
    ref_losses, ref_norms = train(run_torchrun, tmp_path, seed, "one_rank", 1, {**ONE_RANK, "args": MOR_OVERRIDES})
    assert len(ref_losses) == STEPS and ref_losses[-1] < ref_losses[0]
    run_dir = tmp_path / "fsdp2_compile"
    proc = run_torchrun(2, layout_args(run_dir, seed, 2, {"args": [*MOR_OVERRIDES, "--compile.enable"]}),
                        tmp_path / "fsdp2-compile-log", env={"TORCH_LOGS": "recompiles"})
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "Compiled the recurrence step once" in output
    assert "Recompiling function" not in output  # every k_i and every step: one graph
    # Inductor reorders fp32 reductions: compiled and eager runs agree to ~1e-6 per step.
    assert scalars(run_dir, "loss_metrics/global_avg_loss") == pytest.approx(ref_losses, rel=1e-4)
    assert scalars(run_dir, "grad_norm") == pytest.approx(ref_norms, rel=5e-4)
    # The observer sees the routed steps: the copy share of step 4 (capacity 1/4) is >= 3/4.
    assert all(v >= 0.75 for v in scalars(run_dir, "grt_gate_copy_frac/step4")) and len(ref_losses) == STEPS
