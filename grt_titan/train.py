"""Drop-in for `python -m torchtitan.train` (same CLI, torchtitan's own main and train loop).

It runs torchtitan's Trainer as `GRTTrainer` (grt_titan/components/trainer.py), which adds
checksummed checkpoints, layout-independent data resume of old checkpoints and the
loss-spike rewind (docs/reliability.md). Without an accelerator it first switches
torchtitan to CPU/gloo (grt_titan/cpu_support.py), for tests, CI and laptops:

    torchrun --nproc_per_node=2 -m grt_titan.train --job.config_file train_configs/grt_debug.toml
"""

from __future__ import annotations


def main() -> None:
    from grt_titan.cpu_support import enable_cpu_training

    enable_cpu_training()
    import grt_titan  # noqa: F401  registers the `grt` train spec
    from torchtitan.train import main as torchtitan_main

    from grt_titan.components.trainer import GRTTrainer

    torchtitan_main(GRTTrainer)


if __name__ == "__main__":
    main()
