"""Helpers of the metrics / validation / analysis tests: tiny models, data, configs
(tests/analysis/conftest.py puts this folder on the import path)."""

import json
import math
from pathlib import Path

import numpy as np
import torch

from grt_titan.components.metrics import GRTMetricsConfig
from grt_titan.data.config import DataConfig
from grt_titan.model import GRTModel
from grt_titan.model.args import GRTModelArgs

from grt_test_helpers import build_model, write_token_dataset

VOCAB = 256


class ByteTokenizer:
    """Bytes as tokens: enough of the tokenizer interface for the data path and prompts."""

    name = "bytes"
    sha256 = "b" * 64
    eos_id = VOCAB - 1

    def get_vocab_size(self) -> int:
        return VOCAB

    def encode(self, text: str, **kwargs) -> list[int]:
        return [min(b, VOCAB - 2) for b in text.encode()]

    def decode(self, ids, **kwargs) -> str:
        return bytes(int(i) for i in ids).decode(errors="replace")


def tiny_args(**changes) -> GRTModelArgs:
    """1 + 1x3 + 1 at d = 32; gate noise wide enough that both saturation shares are > 0."""
    args = GRTModelArgs(
        block_style="gpt2",
        dim=32,
        n_heads=4,
        vocab_size=VOCAB,
        max_seq_len=64,
        n_prelude_layers=1,
        n_core_layers=1,
        n_coda_layers=1,
        num_recurrences=3,
        gate_bias_init=1.0,
        gate_noise_std=3.0,
        state_noise_std=0.1,
    )
    return args.replace(**changes)


def tiny_model(seed: int = 0, **changes) -> GRTModel:
    model = build_model(tiny_args(**changes), seed)
    with torch.no_grad():
        # Larger weights than the init so that gates and updates differ per step.
        gate = model.recurrence.step.gate if model.recurrence is not None else torch.nn.Module()
        for p in gate.parameters():
            if p.ndim == 2:
                p.mul_(20)
    return model


def make_dataset(root: Path, tokens: int = 4000, seed: int = 0) -> Path:
    """A prepared dataset of random byte ids (train and val splits)."""
    rng = np.random.default_rng(seed)
    splits = {split: rng.integers(0, VOCAB - 1, size=tokens, dtype=np.int64) for split in ("train", "val")}
    return write_token_dataset(root, ByteTokenizer(), splits, tokens, val_fraction=0.5)


def job_config(dataset: str, seq_len: int = 32, batch_size: int = 2, log_freq: int = 3, val_steps: int = 3, **metrics):
    from torchtitan.config import JobConfig

    jc = JobConfig()
    jc.training.dataset = jc.validation.dataset = dataset
    jc.training.seq_len = jc.validation.seq_len = seq_len
    jc.training.local_batch_size = jc.validation.local_batch_size = batch_size
    jc.training.dataloader.num_workers = jc.validation.dataloader.num_workers = 0
    jc.validation.steps = val_steps
    jc.metrics.log_freq = log_freq
    jc.metrics.enable_tensorboard = False
    jc.data = DataConfig()
    jc.grt_metrics = GRTMetricsConfig(**metrics)
    return jc


def hand_step_stats(h, h_new, g, o) -> dict[str, float]:
    """The training metrics of one recurrence step, computed directly (float64)."""
    g, h, h_new, o = (t.detach().double() for t in (g, h, h_new, o))
    return {
        "gate_mean": g.mean().item(),
        "gate_std": g.std(unbiased=False).item(),
        "gate_copy_frac": (g > 0.95).double().mean().item(),
        "gate_write_frac": (g < 0.05).double().mean().item(),
        "update_ratio": ((h_new - h).norm() / (o - h).norm()).item(),
    }


def replay_steps(model: GRTModel, tokens: torch.Tensor, depth: int, seed: int):
    """(h, h_new, g, o) of every step of a forward at `depth`, recomputed from the model's
    own modules; in training mode with the same noise draws (the RNG seeded as before the
    forward), in eval mode without noise."""
    rec = model.recurrence
    torch.manual_seed(seed)
    with torch.no_grad():
        h_pre = model.prelude(model.embed(tokens), model.freqs_cis)
        h, out = h_pre, []
        for _ in range(depth):
            state_noise = torch.randn_like(h) * rec.state_noise_std if model.training else None
            gate_noise = torch.randn_like(h) * rec.gate_noise_std if model.training else None
            h_new, g, o = rec.step(h, h_pre, model.freqs_cis, state_noise, gate_noise, return_parts=True)
            out.append((h, h_new, g, o))
            h = h_new
    return out


FIGURE_KEYS = {
    "early_exit": {"depths", "loss", "layer_depth", "forward_flops_per_token"},
    "convergence": {"depths", "loss", "kl_to_final", "final_depth"},
    "gate": {
        "steps",
        "gate_mean",
        "gate_std",
        "gate_q05",
        "gate_q25",
        "gate_q50",
        "gate_q75",
        "gate_q95",
        "gate_copy_frac",
        "gate_write_frac",
        "update_ratio",
    },
    "updates": {"steps", "update_norm", "proposal_norm", "state_cosine", "proposal_cosine", "relative_update"},
    "gate_heatmaps": {"depth", "prompts"},
}


def _numbers(tree):
    if isinstance(tree, dict):
        for v in tree.values():
            yield from _numbers(v)
    elif isinstance(tree, list):
        for v in tree:
            yield from _numbers(v)
    elif isinstance(tree, (int, float)) and not isinstance(tree, bool):
        yield tree


def check_analysis_output(out, num_recurrences: int, max_depth: int):
    """Every plot written, the JSON has the expected keys, finite numbers, KL(final) = 0."""
    from grt_titan.analysis.report import JSON_NAME, PLOTS

    for name in PLOTS.values():
        png = out / name
        assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    result = json.loads((out / JSON_NAME).read_text())
    for section, keys in FIGURE_KEYS.items():
        assert keys <= set(result[section]), section
    assert all(math.isfinite(x) for x in _numbers(result))
    conv = result["convergence"]
    assert conv["depths"] == list(range(max_depth + 1)) and len(conv["loss"]) == max_depth + 1
    assert conv["final_depth"] == num_recurrences
    assert conv["kl_to_final"][num_recurrences] == 0.0
    assert all(k > 0 for r, k in enumerate(conv["kl_to_final"]) if r != num_recurrences)
    for key in FIGURE_KEYS["gate"] | FIGURE_KEYS["updates"]:
        assert len(result["gate" if key in FIGURE_KEYS["gate"] else "updates"][key]) == max_depth
    gate = result["gate"]  # figure 10a's bands: ordered quantiles of g, inside [0, 1]
    for i in range(max_depth):
        bands = [gate[f"gate_q{q:02d}"][i] for q in (5, 25, 50, 75, 95)]
        assert 0.0 <= bands[0] and bands == sorted(bands) and bands[-1] <= 1.0, (i, bands)
    for prompt in result["gate_heatmaps"]["prompts"]:
        assert len(prompt["gate_mean"]) == num_recurrences
        assert all(len(row) == len(prompt["tokens"]) for row in prompt["gate_mean"])
    return result
