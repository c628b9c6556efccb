"""torchrun worker: a training job (grt_titan.train's main and GRTTrainer) that, after its last
step, writes each parameter's gradient norm in float64 to OUT.json.

torchtitan's logged grad_norm is torch's CPU fp32 norm, ~1e-4 off on tensors of GPT-2's 50257 x 128
(grt_test_helpers.LOGGED_GRAD_NORM_REL says why); these norms come from each gradient's full
tensor in float64, so layouts can be compared tightly. The last step's gradients are still
on the parameters when the loop ends (the next step would zero them), so the job that logs
the losses also gives the gradients: no second run per layout.
Usage: torchrun ... -m tests.infra.grad_norm_worker OUT.json <torchtitan CLI args>
"""

import json
import sys

from grt_titan.train import main as train_main


def gradient_norms_trainer(out_path: str) -> type:
    import torch

    from grt_titan.components.trainer import GRTTrainer

    class GradientNormsTrainer(GRTTrainer):
        def train(self):
            super().train()
            norms = {}
            for name, param in self.model_parts[0].named_parameters():
                grad = param.grad
                grad = grad.full_tensor() if hasattr(grad, "full_tensor") else grad  # a collective: every rank
                # The name without the wrappers AC and compile add, as in a checkpoint.
                name = name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")
                norms[name] = grad.double().norm().item()
            if torch.distributed.get_rank() == 0:
                with open(out_path, "w") as f:
                    json.dump(norms, f)

    return GradientNormsTrainer


if __name__ == "__main__":
    train_main(sys.argv[2:], trainer_class=gradient_norms_trainer(sys.argv[1]))
