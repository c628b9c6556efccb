"""Named architectures (the spec's `model_args`). Run recipes live in train_configs/*.toml.

`dense_X` is the isoFLOP twin of `X`: the same code with no core, p + n R + c layers.

A flavor may also be a JSON file of GRTModelArgs fields (`[model] flavor =
"<folder>/model_args.json"`): the architecture of a model retrofitted from a Hugging Face
source (`grt-titan retrofit`, docs/retrofit.md), whose widths no named flavor has.
"""

import dataclasses
import json
from pathlib import Path

from .args import GRTModelArgs

FLAVOR_FILE_SUFFIX = ".json"


def flavor_from_file(name: str) -> GRTModelArgs | None:
    """The args of a flavor named by a `.json` file of GRTModelArgs fields; None for other
    names. ValueError naming the file when it is missing, unreadable or holds unknown fields."""
    if not name.endswith(FLAVOR_FILE_SUFFIX):
        return None
    path = Path(name)
    if not path.is_file():
        raise ValueError(f"[model] flavor = {name!r}: no such file (a flavor file holds GRTModelArgs fields)")
    try:
        fields = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"[model] flavor = {name!r}: cannot be read as JSON: {e}") from e
    known = {f.name for f in dataclasses.fields(GRTModelArgs)}
    unknown = sorted(set(fields) - known) if isinstance(fields, dict) else ["(not an object)"]
    if unknown:
        raise ValueError(f"[model] flavor = {name!r}: unknown GRTModelArgs field {unknown[0]!r}")
    return GRTModelArgs(**fields)


# The debug presets' tokenizer, gpt2_4k.tiktoken (GPT-2's first 4,096 ranks) and its
# <|endoftext|>: GPT-2's 50,257 rows would be 88% of a debug model's parameters and most of a
# CPU step's time.
DEBUG_VOCAB_SIZE = 4097


def _gpt2(*, dim: int, n_heads: int, prelude: int, core: int, recurrences: int, coda: int, **kwargs) -> GRTModelArgs:
    """The paper's layout `prelude + core x recurrences + coda` with GPT-2 blocks."""
    return GRTModelArgs(
        block_style="gpt2",
        dim=dim,
        n_heads=n_heads,
        n_prelude_layers=prelude,
        n_core_layers=core,
        num_recurrences=recurrences,
        n_coda_layers=coda,
        **kwargs,
    )


def _dense(*, layers: int, block_style: str = "gpt2", **kwargs) -> GRTModelArgs:
    return GRTModelArgs(
        block_style=block_style,
        n_prelude_layers=layers,
        n_core_layers=0,
        n_coda_layers=0,
        **kwargs,
    )


# >= 1B stored parameters, llama blocks, for multi-node runs: 4 + 10x4 + 4 at d = 2048.
_LLAMA_1B = dict(dim=2048, n_heads=16, n_kv_heads=4, max_seq_len=4096, rope_theta=500000.0)

grt_flavors: dict[str, GRTModelArgs] = {
    # CPU-sized: 1 + 2x4 + 1 at d = 128 over gpt2_4k.tiktoken's vocabulary (1.5M parameters).
    "debug": _gpt2(dim=128, n_heads=4, prelude=1, core=2, recurrences=4, coda=1, vocab_size=DEBUG_VOCAB_SIZE),
    "dense_debug": _dense(layers=10, dim=128, n_heads=4, vocab_size=DEBUG_VOCAB_SIZE),
    # Figure 5's "recurrence alone" rung: no prelude, no coda, the core from the embeddings.
    "debug_core_only": _gpt2(dim=128, n_heads=4, prelude=0, core=2, recurrences=5, coda=0, vocab_size=DEBUG_VOCAB_SIZE),
    # Multi-step tasks (docs/tasks.md): 1 + 1x8 + 1 at d = 128 over the GPT-2 vocabulary, or
    # over `grt-titan task vocab`'s word-level one (135 ids; 256 rows): 7.2M and 0.84M parameters.
    "task_debug": _gpt2(dim=128, n_heads=4, prelude=1, core=1, recurrences=8, coda=1),
    "task_debug_words": dataclasses.replace(
        _gpt2(dim=128, n_heads=4, prelude=1, core=1, recurrences=8, coda=1), vocab_size=256
    ),
    # Its isoFLOP twin at R: 10 unshared layers (benchmarks/depth_task_bench.py's dense row).
    "dense_task_debug_words": _dense(layers=10, dim=128, n_heads=4, vocab_size=256),
    # Paper table 1 / table 5 (GPT-2 blocks, learned positions, tied embeddings).
    "small": _gpt2(dim=768, n_heads=12, prelude=1, core=1, recurrences=10, coda=1),
    "medium": _gpt2(dim=1024, n_heads=16, prelude=2, core=5, recurrences=4, coda=2),
    "large": _gpt2(dim=1280, n_heads=20, prelude=1, core=5, recurrences=6, coda=5),
    "medium_isoparams": _gpt2(dim=1024, n_heads=16, prelude=2, core=20, recurrences=4, coda=2),
    "large_isoparams": _gpt2(dim=1280, n_heads=20, prelude=3, core=30, recurrences=6, coda=3),
    "small_core_only": _gpt2(dim=768, n_heads=12, prelude=0, core=1, recurrences=12, coda=0),
    "dense_small": _dense(layers=12, dim=768, n_heads=12),
    "dense_medium": _dense(layers=24, dim=1024, n_heads=16),
    "dense_large": _dense(layers=36, dim=1280, n_heads=20),
    # llama-style blocks (our copy of torchtitan 0.2.2's, model/blocks/llama.py), for real multi-node scale.
    "llama_1b": GRTModelArgs(
        block_style="llama",
        n_prelude_layers=4,
        n_core_layers=10,
        num_recurrences=4,
        n_coda_layers=4,
        **_LLAMA_1B,
    ),
    "dense_llama_1b": _dense(layers=48, block_style="llama", **_LLAMA_1B),
}
