"""grt_titan: the Gated Recurrent Transformer (arXiv 2608.15062) as a torchtitan model.

Importing the package loads no torchtitan, so that the `grt-titan` tools start at once. Each
torchtitan finds its adapter (docs/training.md, "torchtitan 0.2.2 and 0.3"):
- 0.2.2 imports `grt_titan` through the TOML's `custom_import`, after loading itself; the
  train spec `grt` is then registered here (grt_titan/spec.py).
- 0.3 resolves `--module grt_titan` to grt_titan/config_registry.py.
"""

import sys

__version__ = "0.1.0"

# Loaded only by torchtitan 0.2.2 (0.3 has no train-spec registry): the host importing us.
TORCHTITAN_0_2_REGISTRY = "torchtitan.protocols.train_spec"

if TORCHTITAN_0_2_REGISTRY in sys.modules:
    import grt_titan.spec  # noqa: F401  registers the train spec `grt`
