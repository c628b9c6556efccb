"""The exported folder works with lm-eval-harness's Hugging Face model (offline)."""

import math

import pytest
import torch


@pytest.mark.slow
def test_lm_eval_loglikelihood(debug_export, debug_checkpoint):
    pytest.importorskip("lm_eval")
    pytest.importorskip("accelerate")  # lm-eval's HF model needs it (lm-eval[hf])
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    lm = HFLM(pretrained=str(debug_export), trust_remote_code=True, device="cpu", batch_size=2, dtype="float32")
    pairs = [
        ("The capital of France is", " Paris"),
        ("It is a truth universally acknowledged,", " that a single man"),
        ("1, 2, 3,", " 4"),
    ]
    requests = [Instance(request_type="loglikelihood", doc={}, arguments=pair, idx=i) for i, pair in enumerate(pairs)]
    results = lm.loglikelihood(requests)
    assert len(results) == len(pairs)

    # Reference: the same log-probabilities from the torchtitan model.
    from grt_titan.tokenizer import GPT2_4K_TIKTOKEN_PATH, GPT2Tokenizer

    tok = GPT2Tokenizer(GPT2_4K_TIKTOKEN_PATH)  # grt_debug's
    _, native = debug_checkpoint
    for (context, continuation), (logprob, is_greedy) in zip(pairs, results):
        ctx, cont = tok.encode(context), tok.encode(continuation)
        ids = torch.tensor([ctx + cont])
        with torch.no_grad():
            logp = torch.log_softmax(native(ids)[0, :-1].double(), -1)
        expected = sum(logp[len(ctx) - 1 + i, t].item() for i, t in enumerate(cont))
        assert math.isfinite(logprob) and isinstance(is_greedy, bool)
        # fp32 logits of two implementations (<1e-4) summed over a few tokens.
        assert abs(logprob - expected) < 1e-3
