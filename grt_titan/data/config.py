"""The `[data]` section of the job config: options of grt_titan's token-shard data path."""

from dataclasses import dataclass
from typing import Literal


@dataclass
class DataConfig:
    """Options read by grt_titan.data (see docs/data.md)."""

    seed: int = 0
    """Seed of the per-epoch shuffle of training sequences; identical on every rank.
    Epoch e uses the permutation drawn from (seed, e); the validation split is never
    shuffled."""

    shuffle: bool = True
    """Shuffle training sequences each epoch; false reads them in stream order (ablations,
    debugging)."""

    cache_dir: str | None = None
    """Where the embedded corpus `grt_default` is prepared on first use. None uses
    $GRT_TITAN_CACHE, else $XDG_CACHE_HOME/grt_titan, else ~/.cache/grt_titan."""

    default_val_fraction: float = 0.05
    """Share of the embedded corpus's chapters (evenly spread) held out as its val split."""

    allow_global_batch_change: bool = False
    """Resume a checkpoint saved with another global batch size. The data continues at the
    saved global sequence position; the step counter, LR schedule and depth sequence continue
    by step, so every remaining step of the schedule now takes the new number of sequences
    (the tokens per schedule step change). False refuses such a resume at start-up."""

    long_records: Literal["error", "drop"] = "error"
    """Prompt/completion data (docs/data.md): a record longer than seq_len + 1 tokens fits no
    training sequence. "error" stops at start-up naming its file and line; "drop" leaves such
    records out and logs how many."""

    pack_records: bool = True
    """Prompt/completion data: true packs whole records in order into each sequence (a record
    attends to the records before it in its sequence); false gives every record a sequence of
    its own, the rest padding, so no record sees another's tokens: what a task whose records
    reuse one set of symbols needs (docs/tasks.md), at the cost of the padding."""
