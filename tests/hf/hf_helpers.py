"""Helpers of the Hugging Face export tests (fixtures live in conftest.py).

Importing this module first switches the hub off and sends transformers' copies of the
remote code to a temporary module cache, before transformers is imported anywhere.
"""

import atexit
import os
import shutil
import tempfile

_MODULES = tempfile.mkdtemp(prefix="grt_hf_modules_")
atexit.register(shutil.rmtree, _MODULES, ignore_errors=True)
for _key, _value in {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_MODULES_CACHE": _MODULES,
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(_key, _value)

import contextlib  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from grt_titan.model import GRTModel, grt_flavors  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SMALL_VOCAB = 512


def small_args(block_style: str):
    """The debug flavor (1 + 2x4 + 1, d = 128) with a 512-token vocabulary."""
    args = grt_flavors["debug"].replace(vocab_size=SMALL_VOCAB)
    if block_style == "llama":
        # GQA (4 heads, 2 KV heads) and a small SwiGLU, to exercise the llama code paths.
        args = args.replace(block_style="llama", n_kv_heads=2, multiple_of=32)
    return args


def seeded_model(args, seed: int = 0, spread: float = 0.05) -> GRTModel:
    """init_weights, then a seeded perturbation so gates and logits are far from their init."""
    torch.manual_seed(seed)
    model = GRTModel(args)
    with torch.no_grad():
        model.init_weights()
        for p in model.parameters():
            p.add_(torch.randn_like(p) * spread)
        if model.recurrence is not None:
            # Gate bias from +4 (g ~ 0.98) to ~0: steps then change the state a lot.
            model.recurrence.step.gate.w_out.bias.fill_(0.0)
    return model.eval()


def load_hf(folder, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=True, dtype=dtype).eval()


@contextlib.contextmanager
def sharded_state_dict(args, store_dir: Path, make=torch.empty):
    """GRTModel(args)'s state dict as DTensors sharded on dim 0 (the vocabulary of the
    embedding and head) over a 1-rank gloo mesh, as torchtitan hands it to the adapter."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from grt_titan.model.model import build_meta_model

    dist.init_process_group("gloo", init_method=f"file://{store_dir}/store", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        yield {k: distribute_tensor(make(v.shape), mesh, [Shard(0)]) if v.ndim else v
               for k, v in build_meta_model(args).state_dict().items()}
    finally:
        dist.destroy_process_group()
