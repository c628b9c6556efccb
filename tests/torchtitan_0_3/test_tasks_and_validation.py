"""torchtitan 0.3 validates by depth and trains on `grt-titan task` data as torchtitan 0.2.2 does.

The depth-wise validation (`[grt_metrics] validation_depths`) runs on 0.3 through
grt_titan/torchtitan_0_3/validate.py, the 0.2.2 host's `DepthwiseValidation` on 0.3's Validator:
in process, each logged depth's loss is that of independent forwards, reduced as 0.2.2 reduces
validation. One 2-rank run of the task preset (masked prompt/completion data, `[grt]
step_supervision`, the depth-wise validation on, as the preset leaves it) then logs the losses
that the same job logs on 0.2.2, under the same tags and console lines.
"""

import contextlib
import math
import re

import pytest

pytest.importorskip("torchtitan.trainer", reason="torchtitan 0.3's Trainer (the 0.3 lane)")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torchtitan.components.loss import IGNORE_INDEX  # noqa: E402
from torchtitan.config import ConfigManager, ParallelismConfig  # noqa: E402
from torchtitan.distributed import ParallelDims  # noqa: E402

from grt_titan import config_registry  # noqa: E402
from grt_titan.cli import main as cli  # noqa: E402
from grt_titan.components.validate import validation_depths  # noqa: E402
from grt_titan.data.config import DataConfig  # noqa: E402
from grt_titan.model.args import GRTModelArgs  # noqa: E402
from grt_titan.tokenizer import GPT2_TIKTOKEN_PATH  # noqa: E402
from grt_titan.torchtitan_0_3.components import GRTDataLoaderConfig, GRTLoss, GRTTokenizerConfig  # noqa: E402
from grt_titan.torchtitan_0_3.recipe import trainer_config  # noqa: E402
from grt_titan.torchtitan_0_3.refusals import refusals  # noqa: E402
from grt_titan.torchtitan_0_3.trainer import wire_sections  # noqa: E402
from grt_titan.torchtitan_0_3.validate import GRTValidator  # noqa: E402

from grt_test_helpers import ANSI, build_model, torchrun  # noqa: E402

# The job both hosts ran: the task preset at 2 sequences a rank, 3 steps, validation at steps 1
# and 3 on one batch a rank (the data: `task_data` below).
JOB_0_3 = [
    *("--training.steps", "3", "--training.local_batch_size", "2", "--lr_scheduler.warmup_steps", "1"),
    *("--validator.freq", "3", "--validator.steps", "1", "--metrics.log_freq", "1", "--checkpoint.no-enable"),
    *("--debug.seed", "0", "--grt.step_supervision", "True"),
]
# Its losses on torchtitan 0.2.2 (torch 2.13; TensorBoard's values), from the same data and
# arguments in 0.2.2's names:
#   torchrun --nproc_per_node=2 -m grt_titan.train --job.config_file train_configs/grt_task_debug.toml
#     --training.dataset DATA --validation.dataset DATA --validation.local_batch_size 2
#     --validation.freq 3 --validation.steps 1 (the other flags as JOB_0_3)
TRAIN_LOSSES_0_2 = [10.933012, 9.4774237, 9.3982248]
VALIDATION_0_2 = {  # step -> the loss at r = 0..8, 10
    1: [9.5308628, 9.5311565, 9.5314999, 9.5318909, 9.5323296, 9.5328140, 9.5333424, 9.5339127, 9.5345268, 9.5358734],
    3: [9.2197819, 9.2250433, 9.2302198, 9.2353106, 9.2403145, 9.2452307, 9.2500601, 9.2548027, 9.2594624, 9.2685375],
}
# The validation tags 0.2.2 writes (besides the loss, its throughput and memory), and its image.
DEPTH_TAGS = {f"validation_metrics/{name}_r{r}" for name in ("loss", "flops_per_token") for r in [*range(9), 10]}
HOST_REL = 1e-4  # as tests/torchtitan_0_3/test_train.py holds the plain preset


@pytest.fixture(scope="module")
def task_data(module_tmp):
    """A small iterated-function problem set, prepared as docs/tasks.md prepares it."""
    root = module_tmp("task_data")
    jsonl, folder = root / "if-train.jsonl", root / "iterated-function"
    assert cli(["task", "iterated-function", "--depths", "1-6", "--n", "60", "--seed", "0", "--out", str(jsonl)]) == 0
    assert cli(["prepare", str(jsonl), "--out", str(folder), "--val-fraction", "0.2"]) == 0
    return folder


def test_the_presets_validate_by_depth_unless_switched_off(tmp_path):
    """On by default as on 0.2.2, off from the TOML or the command line, never refused."""
    config = config_registry.grt_task_debug()
    assert type(config.validator) is GRTValidator.Config and config.grt_metrics.validation_depths
    assert config.validator.enable and refusals(config) == []
    args = ["--module", "grt_titan", "--config", "grt_task_debug", "--grt_metrics.no_validation_depths"]
    parsed = ConfigManager().parse_args(args)
    wire_sections(parsed)
    assert type(parsed.validator) is GRTValidator.Config and parsed.validator.validation_depths is False
    toml = tmp_path / "off.toml"
    toml.write_text(
        '[model]\nflavor = "debug"\n[validation]\nenable = true\n[grt_metrics]\nvalidation_depths = false\n'
    )
    assert trainer_config(toml).grt_metrics.validation_depths is False


class Recording:
    """What a validator uses of 0.3's MetricsProcessor (no TensorBoard: no image)."""

    logger = None

    def __init__(self):
        self.ntokens_since_last_log = 0
        self.calls: list[dict] = []

    def log_validation(self, loss, step, extra_metrics=None):
        self.calls.append({"loss": loss, "step": step, **(extra_metrics or {})})


def _validate(data, model, depths: bool) -> tuple[GRTValidator, Recording]:
    """One validation by 0.3's build of grt_titan's validator on one rank, over the whole split:
    12 task records in batches of 7 and 5, which hold different numbers of completion tokens."""
    loader = GRTDataLoaderConfig(dataset=str(data), split="val", infinite=False, data=DataConfig())
    metrics = Recording()
    validator = GRTValidator.Config(dataloader=loader, steps=-1, validation_depths=depths).build(
        parallelism=ParallelismConfig(),
        dp_world_size=1,
        dp_rank=0,
        tokenizer=GRTTokenizerConfig().build(tokenizer_path=str(GPT2_TIKTOKEN_PATH)),
        parallel_dims=ParallelDims.from_config(ParallelismConfig(), world_size=1),
        loss_fn=GRTLoss(GRTLoss.Config()),
        validation_context=contextlib.nullcontext,
        metrics_processor=metrics,
        seq_len=64,
        local_batch_size=7,
    )
    validator.validate([model.train()], step=5)
    assert model.training  # restored
    return validator, metrics


def _by_batch(validator, model, r) -> list[tuple[float, int]]:
    """(summed CE, valid tokens) of each validation batch at depth r, by plain forwards."""
    out = []
    with torch.no_grad():
        for x, labels in validator.validation_dataloader:
            logits = model.eval()(x["input"], num_recurrences=r)
            ce = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum")
            out.append((ce.item(), int((labels != IGNORE_INDEX).sum())))
    return out


def test_each_depth_is_scored_as_independent_forwards_reduced_as_on_0_2_2(task_data):
    """With the depths on, every r in {0..R, R+2}; off, the eval depth alone: each loss the mean
    over batches of each batch's loss per valid token (0.2.2's reduction), not 0.3's pooled one."""
    args = GRTModelArgs(block_style="gpt2", dim=32, n_heads=4, vocab_size=50257, max_seq_len=64, num_recurrences=1)
    model = build_model(args, 0)
    validator, metrics = _validate(task_data, model, depths=True)
    (call,) = metrics.calls
    depths = validation_depths(1)  # 0, 1 and 3
    assert sorted(k for k in call if "_r" in k) == sorted(
        f"validation_metrics/{name}_r{r}" for name in ("loss", "flops_per_token") for r in depths
    )
    batches = {r: _by_batch(validator, model, r) for r in depths}
    for r in depths:
        assert call[f"validation_metrics/loss_r{r}"] == pytest.approx(
            sum(ce / n for ce, n in batches[r]) / len(batches[r]), rel=1e-6
        )
        assert call[f"validation_metrics/flops_per_token_r{r}"] == model.model_args.forward_flops_per_token(64, r)
    assert call["loss"] == call["validation_metrics/loss_r1"] and call["step"] == 5  # the eval depth R
    assert metrics.ntokens_since_last_log == 12 * 64
    counts = [n for _, n in batches[1]]
    pooled = sum(ce for ce, _ in batches[1]) / sum(counts)
    assert len(set(counts)) > 1 and not math.isclose(call["loss"], pooled, rel_tol=1e-6)

    _, metrics = _validate(task_data, model, depths=False)
    (call_off,) = metrics.calls
    assert set(call_off) == {"loss", "step"} and call_off["loss"] == pytest.approx(call["loss"], rel=1e-6)


def _depth_line(log: str, step: int) -> dict[int, float]:
    """The `validate step N  loss by depth r: ...` console line of step N, as {r: loss}."""
    (line,) = re.findall(rf"validate step\s+{step}  loss by depth r: (.*)", ANSI.sub("", log))
    return {int(r): float(v) for r, v in re.findall(r"(\d+): ([0-9.]+)", line)}


def _tensorboard(dump) -> tuple[dict[str, dict[int, float]], dict[str, list[int]]]:
    """{tag: {step: value}} of the run's scalars and {tag: steps} of its images."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = list((dump / "tb").rglob("events.out.tfevents.*"))
    acc = EventAccumulator(str(events.parent), size_guidance={"images": 0, "scalars": 0})
    acc.Reload()
    scalars = {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
    return scalars, {tag: [e.step for e in acc.Images(tag)] for tag in acc.Tags()["images"]}


@pytest.mark.slow
def test_the_task_preset_with_step_supervision_logs_0_2_2s_losses(task_data, module_tmp):
    """2 ranks of `--config grt_task_debug` on 0.3: masked task data, per-step targets and the
    depth-wise validation, against the same job's losses, tags and console lines on 0.2.2."""
    dump = module_tmp("task_run_0_3") / "run"
    data = ("--dataloader.dataset", str(task_data), "--validator.dataloader.dataset", str(task_data))
    args = ["--module", "grt_titan", "--config", "grt_task_debug", *JOB_0_3, *data, "--dump_folder", str(dump)]
    proc = torchrun(2, args, dump.parent, module="torchtitan.train", env={"OMP_NUM_THREADS": "1"}, log_name="run.log")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "per-step targets of 6 steps ([grt] step_supervision)" in log and "loss on completions" in log
    scalars, images = _tensorboard(dump)
    losses = scalars["loss_metrics/global_avg_loss"]
    assert [losses[s] for s in (1, 2, 3)] == pytest.approx(TRAIN_LOSSES_0_2, rel=HOST_REL)
    depths = validation_depths(8)  # the preset's R = 8
    for step, expected in VALIDATION_0_2.items():
        logged = [scalars[f"validation_metrics/loss_r{r}"][step] for r in depths]
        assert logged == pytest.approx(expected, rel=HOST_REL)
        assert scalars["validation_metrics/loss"][step] == logged[depths.index(8)]
        assert _depth_line(log, step) == pytest.approx(dict(zip(depths, logged)), abs=5e-5)  # printed to 4 places
    assert {t for t in scalars if re.search(r"_r\d+$", t)} == DEPTH_TAGS
    assert images == {"validation_metrics/depth_curve": [1, 3]}
