"""`[checkpoint] initial_load_path` is loaded, or the run stops: never random weights in silence
(docs/reliability.md, "Starting from other weights").

torchtitan reads `initial_load_path` only with `[checkpoint] enable = true`: a quick trial of a
`grt-titan retrofit` TOML with `--checkpoint.no-enable` trained a random GRT (step-1 loss
10.84 against 6.54 for a GPT-2 retrofit). `GRTCheckpointManager` loads it with checkpointing
off as well and saves nothing; a path that is not a checkpoint stops the run at start-up.

One job: a retrofit of a tiny GPT-2 (transformers' own class), 1 step with checkpointing
off. Its step-1 loss is the source's loss on the trainer's first batch, computed by the
source's transformers forward: the default init makes every depth the source, so the
sampled depth does not matter. The start-up check's messages: tests/test_config_checks.py.
"""

from __future__ import annotations

import re

import pytest
import torch
from torchtitan.protocols.train_spec import get_train_spec

import grt_titan.spec  # noqa: F401  registers the spec
from grt_titan.hf.retrofit import write_retrofit
from grt_titan.job_config import GRTConfigManager

from grt_test_helpers import DEBUG_TOML, one_process, step_losses
from tests.data.data_helpers import make_hf_tokenizer

VOCAB = 512
# The logged loss has 5 decimals (rounding: 5e-6); the GRT's logits at any depth are the
# source's to 3e-7 (tests/hf/test_retrofit.py), i.e. ~1e-6 on the loss. 2e-5 is both with
# headroom; a random GRT is off by far more (measured: 0.058, 6.27273 against 6.33118).
LOSS_TOL = 2e-5
RUN = [
    "--checkpoint.no-enable",
    "--training.steps",
    "1",
    "--training.seq_len",
    "32",
    "--training.local_batch_size",
    "2",
    "--training.global_batch_size",
    "-1",
    "--validation.no-enable",
    "--metrics.no-enable-tensorboard",
    "--metrics.log_freq",
    "1",
]


def gpt2_source(folder):
    """A tiny GPT-2 folder (config, model.safetensors, tokenizer) and the model."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=4, n_head=4, n_positions=64, bos_token_id=0)
    config.eos_token_id = 0
    model = GPT2LMHeadModel(config).float().eval()
    with torch.no_grad():  # weights away from the init, so a random GRT's loss differs clearly
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(folder)
    make_hf_tokenizer(folder, "gpt2")
    return model


def first_batch(args: list[str]):
    """The first (inputs, labels) of the trainer's dataloader on one rank (the spec's builders)."""
    job_config = GRTConfigManager().parse_args(args)
    spec = get_train_spec("grt")
    tokenizer = spec.build_tokenizer_fn(job_config)
    loader = spec.build_dataloader_fn(dp_world_size=1, dp_rank=0, tokenizer=tokenizer, job_config=job_config)
    inputs, labels = next(iter(loader))
    return inputs["input"], labels


@pytest.mark.slow
def test_retrofit_trial_without_checkpointing_starts_from_the_retrofit(tmp_path):
    """`--checkpoint.no-enable` with a retrofit's TOML: the step-1 loss is the source's on the
    first batch (not a random GRT's), the start-up names the retrofit, nothing is saved."""
    source = gpt2_source(tmp_path / "gpt2")
    out = write_retrofit(tmp_path / "gpt2", tmp_path / "grt", prelude=1, core=(1, 3), coda=1, init="every-depth")
    args = ["--job.config_file", str(out / "train.toml"), *RUN]
    proc = one_process(args, timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]

    inputs, labels = first_batch(args)
    with torch.no_grad():
        logits = source(inputs, use_cache=False).logits
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten()).item()
    assert step_losses(log)[1] == pytest.approx(expected, abs=LOSS_TOL), log[-4000:]

    assert f"Loading the checkpoint from {out / 'model'}." in log
    line = re.search(r"Retrofit: loaded .*", log)
    assert line, log[-4000:]
    assert line.group(0) == (
        f"Retrofit: loaded {out / 'model'} ({tmp_path / 'gpt2'}, gpt2, 4 source layers: "
        "prelude 0, core 1-2, coda 3, dropped none; init every-depth)"
    )
    assert "[checkpoint] enable = false" in log  # says it loads without checkpointing
    assert not (out / "outputs" / "checkpoint").exists()


@pytest.mark.slow
def test_missing_initial_load_path_stops_at_start_up(tmp_path):
    """Through the real entry point: one line naming the key and the path, before any model."""
    missing = tmp_path / "no_such_retrofit" / "model"
    proc = one_process(
        [
            "--job.config_file",
            str(DEBUG_TOML),
            "--job.dump_folder",
            str(tmp_path / "run"),
            "--checkpoint.initial_load_path",
            str(missing),
            "--validation.no-enable",
        ]
    )
    log = re.sub(r"^\[rank\d+\]: ?", "", proc.stdout + proc.stderr, flags=re.MULTILINE)  # torch's prefix
    assert proc.returncode != 0 and "Building grt" not in log, log[-3000:]  # before the model
    errors = [line for line in log.splitlines() if line.startswith("ValueError: ")]
    assert errors == [
        f"ValueError: invalid job config: [checkpoint] initial_load_path = {str(missing)!r}: no such folder; "
        "allowed: a torchtitan DCP checkpoint folder (holding .metadata), such as a run's checkpoint/step-N "
        "or the model/ folder `grt-titan retrofit` writes, or no initial_load_path (random weights)"
    ], log[-3000:]
