"""The depth curriculum (`[grt] depth_curriculum_steps`, docs/training.md): the ramp of each
depth law against an independent computation, the same depths on every rank and on resume,
the step count converted from the job's gradient accumulation, FLOPs that follow the
realised depths, the start-up line, and the refusals."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from grt_titan.model import grt_flavors
from grt_titan.model.methods.poisson import heavy_tail_depth
from grt_titan.model.recurrence import DepthSampler

from grt_test_helpers import build_model, one_rank_dims, parse_config


def curriculum(law: str = "uniform", steps: int = 6, per_step: int = 3, **changes):
    settings = dict(num_recurrences=8, min_recurrences=2, depth_seed=5)
    return grt_flavors["debug"].replace(
        **{**settings, **changes},
        depth_sampling=law,
        depth_curriculum_steps=steps,
        forwards_per_step=per_step,
    )


def seed_of(index: int) -> int:
    return 5 * 1_000_003 + index  # DepthSampler's draw seed for depth_seed = 5


def test_uniform_maximum_ramps_linearly_by_optimizer_step():
    args = curriculum()
    args.validate()
    sampler = DepthSampler(args)
    for t in range(40):
        step = t // 3  # 3 forwards per optimizer step
        # Independent: ceil(2 + 6 step / 6) in integers, R = 8 from step 6 on.
        high = 2 + -(-6 * step // 6) if step < 6 else 8
        assert sampler.law_at(t)[:2] == (2, high), t
        assert sampler.depth_at(t) == random.Random(seed_of(t)).randint(2, high), t
    # Every microbatch of a step draws from the same bounds; the first step runs at r_min only.
    assert {sampler.depth_at(t) for t in range(3)} == {2}


def test_one_minus_sqrt_shape_by_hand():
    args = curriculum(steps=4, per_step=1, min_recurrences=1, num_recurrences=9, depth_curriculum_shape="1-sqrt")
    sampler = DepthSampler(args)
    # p = 0, 1/4, 1/2, 3/4: 8 (1 - sqrt(1 - p)) = 0, 1.07, 2.34, 4 -> rounded up -> 1 + (0, 2, 3, 4); then R.
    assert [sampler.law_at(t)[1] for t in range(6)] == [1, 3, 4, 5, 9, 9]


def test_fixed_depth_ramps():
    sampler = DepthSampler(curriculum("fixed", steps=3, per_step=2))
    # ceil(2 + 6 step / 3) = 2, 4, 6, then 8.
    assert [sampler.depth_at(t) for t in range(10)] == [2, 2, 4, 4, 6, 6, 8, 8, 8, 8]


def test_poisson_mean_ramps():
    args = curriculum("poisson_lognormal", steps=4, per_step=2, depth_mean=6.0)
    args.validate()
    sampler = DepthSampler(args)
    for t in range(14):
        step = t // 2
        mean = 2 + (6.0 - 2) * step / 4 if step < 4 else 6.0
        assert sampler.law_at(t)[2] == pytest.approx(mean, abs=1e-12)
        assert sampler.depth_at(t) == heavy_tail_depth(np.random.default_rng(seed_of(t)), mean), t


def test_no_curriculum_keeps_the_draws():
    args = curriculum(steps=0)
    sampler = DepthSampler(args)
    assert [sampler.depth_at(t) for t in range(50)] == [random.Random(seed_of(t)).randint(2, 8) for t in range(50)]


def test_ranks_agree_a_pure_function_of_the_index():
    """Two ranks: separately built samplers, different global RNG states, any call order."""
    args = curriculum("uniform", steps=10, per_step=2)
    torch.manual_seed(0)
    random.seed(0)
    rank0 = DepthSampler(args)
    sequence = [rank0.sample() for _ in range(40)]
    torch.manual_seed(1)
    random.seed(1)
    np.random.seed(1)
    rank1 = DepthSampler(args)
    assert [rank1.depth_at(t) for t in reversed(range(40))][::-1] == sequence
    assert [rank1.sample() for _ in range(40)] == sequence


@pytest.mark.parametrize("law", ["uniform", "fixed", "poisson_lognormal"])
@pytest.mark.parametrize("stop", [0, 7, 12, 30])  # before, mid-step, on a step boundary, after the ramp
def test_a_restored_sampler_continues_identically(law, stop):
    args = curriculum(law, steps=8, per_step=3)
    straight = DepthSampler(args)
    expected = [straight.sample() for _ in range(40)]
    first = DepthSampler(args)
    head = [first.sample() for _ in range(stop)]
    state = {k: v.clone() for k, v in first.state_dict().items()}
    resumed = DepthSampler(args)
    resumed.load_state_dict(state)
    assert head + [resumed.sample() for _ in range(40 - stop)] == expected


def test_the_toml_counts_optimizer_steps(monkeypatch):
    """`depth_curriculum_steps` is in optimizer steps; the args hold the job's forwards per
    step (global 8 / (local 2 x 1 rank) = 4)."""
    monkeypatch.setenv("WORLD_SIZE", "1")
    config = parse_config(
        "--grt.depth_curriculum_steps", "5", "--training.global_batch_size", "8", "--training.local_batch_size", "2"
    )
    from grt_titan.spec import JobModelArgs  # the 0.2.2 host's args, which take the job's forwards per step

    args = JobModelArgs.of(grt_flavors["debug"])
    args.update_from_config(config)
    assert (args.depth_curriculum_steps, args.forwards_per_step) == (5, 4)
    sampler = DepthSampler(args)
    assert [sampler.law_at(t)[1] for t in (0, 3, 4, 19, 20)] == [1, 1, 2, 4, 4]


def test_flops_follow_the_realised_depths(tmp_path):
    """The logged FLOPs per token are the mean training count over the depths the ramp drew,
    and the start-up line says the curriculum is on."""
    from grt_titan.components.metrics import GRTMetricsProcessor, depth_line
    from grt_titan.runtime.cpu_support import enable_cpu_training

    enable_cpu_training()
    model = build_model("debug", depth_curriculum_steps=4, depth_seed=2)
    args = model.model_args
    config = parse_config("--metrics.log_freq", "1", "--training.seq_len", "16", "--job.dump_folder", str(tmp_path))
    config.metrics.enable_tensorboard = config.metrics.enable_wandb = False
    processor = GRTMetricsProcessor(config, one_rank_dims(), args)
    processor.logger.log = lambda metrics, step: None
    processor.model_parts = [model]
    sampler = model.recurrence.depth_sampler
    tokens = torch.randint(0, 255, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for _ in range(3):
            model(tokens)
    realised = [sampler.depth_at(t) for t in range(3)]
    # Steps 0..2 of a 4-step ramp from r_min = 1 to R = 4: r_max = ceil(1 + 3 s / 4) = 1, 2, 3.
    assert sampler.history == realised and all(r <= high for r, high in zip(realised, (1, 2, 3)))
    processor.ntokens_since_last_log = tokens.numel()
    processor.data_loading_times.append(0.0)
    processor.log(1, 1.0, 1.0, 1.0)
    assert processor.num_flops_per_token == int(sum(args.train_flops_per_token(16, r) for r in realised) / 3)
    line = depth_line(args, 16)
    assert "depth curriculum on: the largest depth ramps 1 -> 4 (linear) over the first 4 optimizer steps" in line
    assert "depth curriculum" not in depth_line(args.replace(depth_curriculum_steps=0), 16)
    processor.close()


@pytest.mark.parametrize(
    "flavor,changes,message",
    [
        ("debug", {"depth_curriculum_steps": -1}, "depth_curriculum_steps = -1 is invalid; must be >= 0"),
        ("dense_debug", {"depth_curriculum_steps": 10}, "a dense model (n_core_layers = 0) has no depth to ramp"),
        (
            "debug",
            {
                "depth_curriculum_steps": 10,
                "depth_sampling": "poisson_lognormal",
                "min_recurrences": 3,
                "depth_mean": 2.0,
            },
            "depth_mean = 2.0 is invalid; the depth curriculum ramps the mean up from min_recurrences = 3",
        ),
        (
            "debug",
            {
                "depth_curriculum_steps": 10,
                "router": "expert_choice",
                "depth_sampling": "fixed",
                "injection": "none",
                "update": "overwrite",
                "state_noise_std": 0.0,
            },
            "router = 'expert_choice' routes per step of the fixed depth R",
        ),
        ("debug", {"depth_curriculum_shape": "cosine"}, "depth_curriculum_shape"),
    ],
)
def test_bad_values_are_refused_in_one_line(flavor, changes, message):
    with pytest.raises(ValueError) as error:
        grt_flavors[flavor].replace(**changes).validate()
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_ramp_shapes_rise_to_R():
    """Both shapes rise monotonically from r_min to R; 1-sqrt stays shallow longer (cheaper)."""
    spent = {}
    for shape in ("linear", "1-sqrt"):
        sampler = DepthSampler(curriculum(steps=1000, per_step=1, depth_curriculum_shape=shape))
        highs = [sampler.law_at(t)[1] for t in range(1001)]
        assert highs == sorted(highs) and highs[0] == 2 and highs[-1] == 8
        spent[shape] = sum(highs)
    assert spent["1-sqrt"] < spent["linear"]
