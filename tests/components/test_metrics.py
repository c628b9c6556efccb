"""Training metrics of the recurrence: values against a hand computation, when they are taken."""

import pytest
import torch

from grt_titan.components.metrics import (
    GRTMetricsConfig,
    GRTMetricsProcessor,
    RecurrenceStats,
    console_line,
    find_recurrence,
    metrics_config,
)

from components_helpers import hand_step_stats, job_config, replay_steps, tiny_model
from grt_test_helpers import one_rank_dims, parse_config

# float64 sums of float32 tensors vs float64 recomputation: agreement to ~1e-7 relative;
# 1e-5 leaves room for summation order.
RTOL = 1e-5


def test_recurrence_stats_equal_hand_computation():
    model = tiny_model().train()
    tokens = torch.randint(0, 255, (2, 16), generator=torch.Generator().manual_seed(1))
    stats = RecurrenceStats()
    model.recurrence.observer = stats.observe
    torch.manual_seed(123)
    model(tokens, num_recurrences=3)
    summary = stats.summary()
    expected = [hand_step_stats(*step) for step in replay_steps(model, tokens, 3, seed=123)]
    assert len(summary) == 3 and stats.depths == [3]
    for got, want in zip(summary, expected):
        assert got.keys() == want.keys()
        for key in want:
            assert got[key] == pytest.approx(want[key], rel=RTOL, abs=1e-12), key
    # The fixture is informative: saturation on both sides, and steps differ.
    assert all(0 < s["gate_copy_frac"] < 1 and 0 < s["gate_write_frac"] < 1 for s in summary)
    assert len({round(s["gate_mean"], 6) for s in summary}) == 3


def test_stats_pool_microbatches_of_different_depths():
    model = tiny_model().train()
    a = torch.randint(0, 255, (2, 16), generator=torch.Generator().manual_seed(2))
    b = torch.randint(0, 255, (2, 16), generator=torch.Generator().manual_seed(3))
    stats = RecurrenceStats()
    model.recurrence.observer = stats.observe
    torch.manual_seed(5)
    model(a, num_recurrences=1)
    torch.manual_seed(6)
    model(b, num_recurrences=2)
    steps_a = replay_steps(model, a, 1, seed=5)
    steps_b = replay_steps(model, b, 2, seed=6)
    summary = stats.summary()
    assert stats.depths == [1, 2] and len(summary) == 2
    # Step 1 pools both microbatches; step 2 only exists in the second.
    g1 = torch.cat([steps_a[0][2].flatten(), steps_b[0][2].flatten()]).double()
    assert summary[0]["gate_mean"] == pytest.approx(g1.mean().item(), rel=RTOL)
    assert summary[0]["gate_std"] == pytest.approx(g1.std(unbiased=False).item(), rel=RTOL)
    assert summary[1]["gate_mean"] == pytest.approx(hand_step_stats(*steps_b[1])["gate_mean"], rel=RTOL)


def _processor(tmp_path, **metrics):
    from grt_titan.runtime.cpu_support import enable_cpu_training

    enable_cpu_training()
    jc = job_config(str(tmp_path), log_freq=3, **metrics)
    dims = one_rank_dims()
    model = tiny_model().train()
    processor = GRTMetricsProcessor(jc, dims, model.model_args)
    logged = []
    processor.logger.log = lambda metrics, step: logged.append((step, dict(metrics)))
    processor.num_flops_per_token = 1
    from torchtitan.components.optimizer import build_optimizers

    processor.model_parts = [model]
    processor.optimizers = build_optimizers([model], jc.optimizer, dims)
    return processor, model, logged


def _train(processor, model, steps: int, observed: list):
    """torchtitan's order per step: forward/backward, optimizer step, log on log steps."""
    batches, seeds = {}, {}
    for step in range(1, steps + 1):
        tokens = torch.randint(0, 255, (2, 16), generator=torch.Generator().manual_seed(step))
        seeds[step] = 1000 + step
        batches[step] = (tokens, {k: v.clone() for k, v in model.state_dict().items()})
        processor.optimizers.zero_grad()
        torch.manual_seed(seeds[step])
        observed.append((step, model.recurrence.observer))
        model(tokens).float().logsumexp(-1).mean().backward()
        observed[-1] = (step, processor.stats.sums is not None and processor._stats_step == processor._optimizer_steps)
        processor.optimizers.step()
        if processor.should_log(step):
            processor.ntokens_since_last_log = tokens.numel()
            processor.data_loading_times.append(0.0)
            processor.log(step, 1.0, 1.0, 1.0)
    return batches, seeds


def test_processor_logs_hand_values_only_on_log_steps(tmp_path):
    processor, model, logged = _processor(tmp_path)
    observed = []
    batches, seeds = _train(processor, model, 7, observed)
    assert [s for s, _ in logged] == [1, 3, 6]
    # The observer ran in exactly the logged steps' forwards.
    assert [s for s, armed in observed if armed] == [1, 3, 6]
    for step, metrics in logged:
        r = int(metrics["grt/r"])
        assert metrics["grt/r_last"] == r
        tokens, state = batches[step]
        replica = tiny_model()
        replica.load_state_dict(state)
        replica.train()
        expected = [hand_step_stats(*s) for s in replay_steps(replica, tokens, r, seeds[step])]
        for i, want in enumerate(expected, start=1):
            for key, value in want.items():
                assert metrics[f"grt_{key}/step{i}"] == pytest.approx(value, rel=RTOL, abs=1e-12), (step, key)
        assert f"grt_gate_mean/step{r + 1}" not in metrics
    processor.close()
    assert model.recurrence.observer is None and not model.recurrence._forward_pre_hooks


def test_disabled_metrics_install_nothing(tmp_path):
    processor, model, logged = _processor(tmp_path, enable=False)
    observed = []
    _train(processor, model, 3, observed)
    assert not model.recurrence._forward_pre_hooks
    assert not processor.optimizers._optimizer_step_post_hooks
    assert all(not armed for _, armed in observed)
    assert [s for s, _ in logged] == [1, 3]
    assert not any(k.startswith("grt_") for _, m in logged for k in m)
    assert "grt/r_mean" in logged[0][1]  # the FLOPs bookkeeping is independent of the switch


def test_resumed_run_observes_until_its_first_log(tmp_path):
    """After a resume the processor does not know the step: it observes until the first log."""
    processor, model, logged = _processor(tmp_path)
    observed = []
    # Simulate steps 5..7 of a resumed run: step 6 is the first logged one.
    for step in (5, 6, 7):
        tokens = torch.randint(0, 255, (2, 16))
        processor.optimizers.zero_grad()
        model(tokens).float().logsumexp(-1).mean().backward()
        observed.append(processor._stats_step == processor._optimizer_steps)
        processor.optimizers.step()
        if processor.should_log(step):
            processor.ntokens_since_last_log = 1
            processor.data_loading_times.append(0.0)
            processor.log(step, 1.0, 1.0, 1.0)
    assert observed == [True, True, False]
    assert [s for s, _ in logged] == [6] and "grt_gate_mean/step1" in logged[0][1]


def test_find_recurrence_and_config_defaults():
    assert find_recurrence([tiny_model()]) is not None
    assert find_recurrence([tiny_model(n_core_layers=0)]) is None
    assert metrics_config(object()) == GRTMetricsConfig(enable=True, validation_depths=True)


def test_console_line():
    line = console_line(
        {
            "grt/r": 2.0,
            "grt_gate_mean/step1": 0.97,
            "grt_gate_mean/step2": 0.951,
            "grt_gate_copy_frac/step1": 0.8,
            "grt_gate_copy_frac/step2": 0.7,
            "grt_update_ratio/step1": 0.04,
            "grt_update_ratio/step2": 0.066,
        }
    )
    assert line == "grt  r: 2  gate: .970 .951  copy: .800 .700  rho: .040 .066"


def test_metrics_section_parses_from_toml(tmp_path):
    """The `[grt_metrics]` section merges into torchtitan's JobConfig (job_config.py's route)."""
    toml = tmp_path / "run.toml"
    toml.write_text(
        '[job]\ncustom_config_module = "grt_titan.job_config"\n'
        '[model]\nname = "grt"\nflavor = "debug"\n'
        "[grt_metrics]\nenable = false\n"
    )
    jc = parse_config("--grt_metrics.no_validation_depths", path=toml)
    assert metrics_config(jc) == GRTMetricsConfig(enable=False, validation_depths=False)


@pytest.mark.slow
def test_stats_all_reduce_pools_ranks(tmp_path):
    """2 gloo ranks, different batches: the reduced stats are those of the pooled batches."""
    from grt_test_helpers import worker_result

    result = worker_result(__file__, "stats_reduce_worker", tmp_path)
    assert len(result["got"]) == 3
    for got, want in zip(result["got"], result["want"]):
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=RTOL, abs=1e-12), key


def test_mfu_on_cpu_is_not_applicable(tmp_path, caplog):
    """CPU: no peak-FLOPs lookup or A100 fallback (the shim), `mfu: n/a (CPU)` on the console
    and no `mfu(%)` in TensorBoard; tflops stays."""
    import math

    caplog.set_level("INFO")
    processor, model, _ = _processor(tmp_path)
    assert processor.on_cpu and math.isnan(processor.gpu_peak_flops)
    written = []
    del processor.logger.log  # _processor's capture; record behind the key filter instead
    processor.logger.inner.log = lambda metrics, step: written.append(dict(metrics))
    _train(processor, model, 1, [])
    console = [r.getMessage() for r in caplog.records if "tflops" in r.getMessage()]
    assert len(console) == 1 and "mfu: n/a (CPU)" in console[0] and "nan" not in console[0], console
    assert "mfu(%)" not in written[0] and "tflops" in written[0]
    assert not [r for r in caplog.records if "Peak flops" in r.getMessage() or "lspci" in r.getMessage()]
    processor.close()


def test_fake_backend_says_once_that_its_numbers_are_not_real(tmp_path, caplog):
    """`--comm.mode fake_backend`: one start-up line, `mfu: n/a (fake backend)` and no `mfu(%)`."""
    from torchtitan.components.optimizer import build_optimizers

    from grt_titan.components.metrics import MFU_FAKE_BACKEND, build_grt_metrics_processor
    from grt_titan.runtime.cpu_support import enable_cpu_training
    from grt_titan.runtime.fake_backend import NOTICE

    enable_cpu_training()
    caplog.set_level("INFO")
    jc = job_config(str(tmp_path), log_freq=1)
    jc.comm.mode = "fake_backend"
    jc.job.dump_folder = str(tmp_path / "run")
    dims = one_rank_dims()
    model = tiny_model().train()
    processor = build_grt_metrics_processor(jc, dims, model.model_args)
    assert [r.getMessage() for r in caplog.records].count(NOTICE) == 1
    assert NOTICE.startswith("fake backend: collectives move no data;")
    processor.num_flops_per_token = 1
    processor.model_parts = [model]
    processor.optimizers = build_optimizers([model], jc.optimizer, dims)
    written = []
    processor.logger.inner.log = lambda metrics, step: written.append(dict(metrics))
    _train(processor, model, 2, [])
    console = [r.getMessage() for r in caplog.records if "tflops" in r.getMessage()]
    assert len(console) == 2 and all(MFU_FAKE_BACKEND in line for line in console), console
    assert "mfu(%)" not in written[0] and "tflops" in written[0]
    assert [r.getMessage() for r in caplog.records].count(NOTICE) == 1  # at start-up only
    processor.close()


def test_no_notice_without_the_fake_backend(tmp_path, caplog):
    from grt_titan.components.metrics import build_grt_metrics_processor
    from grt_titan.runtime.fake_backend import NOTICE

    caplog.set_level("INFO")
    processor = build_grt_metrics_processor(job_config(str(tmp_path)), one_rank_dims())
    assert NOTICE not in [r.getMessage() for r in caplog.records] and not processor.fake_backend
    processor.close()
