"""Drop-in for `python -m torchtitan.train` (same CLI, torchtitan's own Trainer and main).

With an accelerator it is exactly torchtitan.train. Without one it first switches
torchtitan to CPU/gloo (grt_titan/cpu_support.py), for tests, CI and laptops:

    torchrun --nproc_per_node=2 -m grt_titan.train --job.config_file train_configs/grt_debug.toml
"""

from __future__ import annotations


def main() -> None:
    from grt_titan.cpu_support import enable_cpu_training

    enable_cpu_training()
    import grt_titan  # noqa: F401  registers the `grt` train spec
    from torchtitan.train import main as torchtitan_main, Trainer

    torchtitan_main(Trainer)


if __name__ == "__main__":
    main()
