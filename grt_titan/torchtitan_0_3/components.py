"""grt_titan's tokenizer, data loaders and loss as torchtitan 0.3 `Configurable`s.

Each Config builds the same object the 0.2.2 host's spec builds (grt_titan/tokenizer.py,
grt_titan/data/loader.py, grt_titan/components/loss.py), so both hosts read the same tokens
in the same order and score them alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

import torch
import tyro
from torch.distributed.tensor import DTensor
from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.components.loss import BaseLoss, cross_entropy_loss
from torchtitan.components.optimizer import LRSchedulersContainer
from torchtitan.components.tokenizer import BaseTokenizer
from torchtitan.config import CompileConfig

from grt_titan.components.loss import grt_loss
from grt_titan.data.config import DataConfig
from grt_titan.data.loader import _build, open_dataset_split
from grt_titan.model.part import TrainingOutput
from grt_titan.tokenizer import load_tokenizer, resolve_tokenizer_source


@dataclass(kw_only=True, slots=True)
class GRTTokenizerConfig(BaseTokenizer.Config):
    """GPT-2 unless `hf_assets_path` names a `.tiktoken` file or a Hugging Face tokenizer folder."""

    def build(self, *, tokenizer_path: str | None = None, **kwargs):
        return load_tokenizer(resolve_tokenizer_source(tokenizer_path))


@dataclass(kw_only=True, slots=True)
class GRTDataLoaderConfig(BaseDataLoader.Config):
    """A split of a prepared dataset (`grt-titan prepare`) or of the embedded corpus
    `grt_default`: grt_titan's GlobalPositionDataloader, as on the 0.2.2 host."""

    dataset: str = "grt_default"
    split: str = "train"
    """`train` (shuffled per epoch, endless) or `val` (stream order)."""
    infinite: bool = True
    global_batch_size: int = -1
    """Sequences per optimizer step over all ranks; -1: local batch x data-parallel ranks."""
    step_targets: bool = False
    """Per-step targets for `[grt] step_supervision` (set from `[grt]` by the trainer)."""
    data: Annotated[DataConfig, tyro.conf.Suppress] = field(default_factory=DataConfig)
    """The `[data]` section (set from the config's own by the trainer)."""

    def build(self, *, dp_world_size: int, dp_rank: int, tokenizer, seq_len: int, local_batch_size: int, **kwargs):
        section = "training" if self.split == "train" else "validation"
        stream = open_dataset_split(self.dataset, self.dataset_path, self.split, tokenizer, self.data, section)
        train = self.split == "train"
        global_batch = self.global_batch_size if self.global_batch_size > 0 else local_batch_size * dp_world_size
        return _build(
            stream,
            dp_world_size,
            dp_rank,
            seq_len,
            local_batch_size,
            _LoaderWorkers(),
            self.data.seed,
            self.data.shuffle and train,
            self.infinite,
            global_batch,
            self.data.allow_global_batch_change and train,
            self.data.long_records,
            step_targets=self.step_targets and train,
            pack_records=self.data.pack_records,
        )


@dataclass
class _LoaderWorkers:
    """The StatefulDataLoader options of 0.2.2's `[training] dataloader` (defaults: in-process)."""

    num_workers: int = 0
    persistent_workers: bool = False
    pin_memory: bool = False
    prefetch_factor: int | None = None


class GRTLoss(BaseLoss):
    """grt_titan's summed loss (plain logits or a `TrainingOutput`), divided by 0.3's global
    valid-token count as 0.2.2's trainer divides it."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseLoss.Config):
        pass

    def __init__(self, config: Config, *, compile_config: CompileConfig | None = None, **kwargs: Any):
        self.config = config
        self.fn = host_loss
        self._maybe_compile(compile_config)

    def __call__(self, pred, labels: torch.Tensor, global_valid_tokens: torch.Tensor | None = None, **kwargs):
        loss = self.fn(pred, labels)
        if global_valid_tokens is not None:
            loss = loss / global_valid_tokens
        return loss, {}


def host_loss(pred: torch.Tensor | TrainingOutput, labels: torch.Tensor) -> torch.Tensor:
    """`grt_loss` with 0.3's loss parallel. Under TP the LM head's logits are vocabulary-sharded
    DTensors, as 0.3's own heads leave theirs, and 0.3's cross-entropy scores them in place
    (0.2.2's trainer enters torch's `loss_parallel` around forward and backward instead; 0.3's
    loop has no such context). 0.3 has no per-token loss-parallel cross-entropy, so a
    `TrainingOutput`'s per-step terms (Ouro, per-step targets) gather their shards first."""
    if isinstance(pred, DTensor):
        return cross_entropy_loss(pred, labels)
    if isinstance(pred, TrainingOutput):
        pred = TrainingOutput(*(x.full_tensor() if isinstance(x, DTensor) else x for x in pred))
    return grt_loss(pred, labels)


class CrossHostSchedulers(LRSchedulersContainer):
    """0.3's schedulers that save what 0.2.2 saves: the first LambdaLR's whole state_dict,
    which holds the `last_epoch` that 0.3's `load_state_dict` reads. A checkpoint of either
    host then resumes under the other (0.3's own save, `last_epoch` alone, is one that 0.2.2
    cannot load)."""

    def __init__(self, schedulers: list) -> None:  # 0.3's container built them
        self.schedulers = schedulers

    def state_dict(self) -> dict[str, Any]:
        return self.schedulers[0].state_dict()


@dataclass(kw_only=True, slots=True)
class GRTLRSchedulersConfig(LRSchedulersContainer.Config):
    """0.3's warmup / stable / decay schedule, saved as 0.2.2 saves it (CrossHostSchedulers)."""

    def build(self, *, optimizers, training_steps: int) -> CrossHostSchedulers:
        built = LRSchedulersContainer.Config.build(self, optimizers=optimizers, training_steps=training_steps)
        return CrossHostSchedulers(built.schedulers)
