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
import importlib  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from grt_titan.model import GRTModel, grt_flavors  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SMALL_VOCAB = 512
# Logits of the HF model vs torchtitan's, fp32 on CPU: the two models run the same ops in the
# same order except RoPE (complex multiply vs its real form) and SDPA kernels; observed
# <= 2e-6, 1e-4 leaves headroom.
ATOL = 1e-4


def small_args(block_style: str):
    """The debug flavor (1 + 2x4 + 1, d = 128) with a 512-token vocabulary."""
    args = grt_flavors["debug"].replace(vocab_size=SMALL_VOCAB)
    if block_style == "llama":
        # GQA (4 heads, 2 KV heads) and a small SwiGLU, to exercise the llama code paths.
        args = args.replace(block_style="llama", n_kv_heads=2, multiple_of=32)
    if block_style == "qwen3":
        # llama's plus qk-norm, a head width other than d / heads (48, not 32) and Qwen3's RoPE base.
        args = args.replace(block_style="qwen3", n_kv_heads=2, ffn_dim=192, attention_head_dim=48, rope_theta=1e6)
    return args


def seeded_model(args, seed: int = 0, spread: float = 0.05) -> GRTModel:
    """init_weights, then a seeded perturbation so gates and logits are far from their init."""
    torch.manual_seed(seed)
    model = GRTModel(args)
    with torch.no_grad():
        model.init_weights()
    return perturb(model, spread)


def perturb(model: GRTModel, spread: float = 0.05) -> GRTModel:
    """Add noise (global torch RNG) to every weight, in eval mode: logits far from the init's,
    and RRT's adapters (B = 0 at init) no longer no-ops."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * spread)
        if model.recurrence is not None and hasattr(model.recurrence.step, "gate"):
            # Gate bias from +4 (g ~ 0.98) to ~0: steps then change the state a lot.
            model.recurrence.step.gate.w_out.bias.fill_(0.0)
    return model.eval()


def load_hf(folder, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=True, dtype=dtype).eval()


def prompt(batch=1, seq=10, seed=5):
    return torch.randint(0, SMALL_VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def greedy(model, ids, n=32, **kwargs):
    # No EOS in a 512-token vocabulary (eos_token_id is None), so exactly n tokens.
    return model.generate(ids, max_new_tokens=n, do_sample=False, **kwargs)


def cache_class(model):
    """The GRTCache class of a loaded remote-code model's own module."""
    return importlib.import_module(type(model).__module__).GRTCache


def decode_logits(hf, ids, strategy, r, steps=6):
    """Teacher-forced decoding: prefill ids[:, :-steps], then feed the rest one by one."""
    cache = cache_class(hf)(hf.config, strategy=strategy)
    prefix = ids.shape[1] - steps
    out = [hf(ids[:, :prefix], past_key_values=cache, num_recurrences=r).logits[:, -1]]
    for t in range(prefix, ids.shape[1]):
        out.append(hf(ids[:, t : t + 1], past_key_values=cache, num_recurrences=r).logits[:, -1])
    return torch.stack(out, 1), cache


def static_decode_logits(hf, ids, strategy, prefix, max_cache_len=20):
    """As decode_logits, through a preallocated cache written at explicit slots and positions."""
    cache = cache_class(hf)(hf.config, strategy=strategy, max_cache_len=max_cache_len)
    out = [hf(ids[:, :prefix], past_key_values=cache, cache_slots=torch.arange(prefix)).logits[:, -1]]
    for t in range(prefix, ids.shape[1]):
        out.append(
            hf(
                ids[:, t : t + 1],
                past_key_values=cache,
                cache_slots=torch.tensor([t]),
                position_ids=torch.tensor([[t]]),
            ).logits[:, -1]
        )
    return torch.stack(out, 1), cache


def left_padded(prompts):
    """(ids, attention_mask) of a batch of 1-D prompts, left-padded with 0."""
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = p
        mask[i, width - len(p) :] = 1
    return ids, mask


def assert_left_padded_rows_generate_alone(model, lengths=(4, 9), n=6, **kwargs):
    """A batch of prompts left-padded to one width generates, row by row, exactly what each
    prompt generates alone (`kwargs` go to both generate calls)."""
    prompts = [prompt(seq=k, seed=10 + k)[0] for k in lengths]
    ids, mask = left_padded(prompts)
    batched = greedy(model, ids, n=n, attention_mask=mask, pad_token_id=0, **kwargs)
    for i, p in enumerate(prompts):
        alone = greedy(model, p[None], n=n, **kwargs)
        assert torch.equal(batched[i, ids.shape[1] :], alone[0, len(p) :]), f"row {i}"


def assert_prompt_lookup_is_greedy(model, n: int = 8):
    """Prompt-lookup decoding after the model's own continuation (drafts it accepts) gives
    greedy decoding's tokens, and its cache, cropped back after every draft, goes on exactly
    as recomputing the whole sequence (logits within ATOL). Returns the generate output."""
    ids = greedy(model, prompt(seq=8), n=12)
    out = model.generate(
        ids, max_new_tokens=n, do_sample=False, prompt_lookup_num_tokens=3, return_dict_in_generate=True
    )
    assert torch.equal(out.sequences, greedy(model, ids, n=n))
    with torch.no_grad():
        step = model(out.sequences[:, -1:], past_key_values=out.cache).logits[:, -1]
        full = model(out.sequences, use_cache=False).logits[:, -1]
    assert (step - full).abs().max().item() < ATOL
    return out


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
        yield {
            k: distribute_tensor(make(v.shape), mesh, [Shard(0)]) if v.ndim else v
            for k, v in build_meta_model(args).state_dict().items()
        }
    finally:
        dist.destroy_process_group()
