"""The torchtitan 0.3 adapter: grt_titan's model and data on 0.3's `Trainer.Config` surface.

    torchrun --nproc_per_node=2 -m torchtitan.train --module grt_titan --config grt_debug

torchtitan 0.3 resolves `--module grt_titan` to grt_titan/config_registry.py, whose functions
(one per preset in train_configs/) build a `GRTTrainer.Config` from the same TOML that
torchtitan 0.2.2 reads (recipe.py), so one recipe per scale serves both hosts. What 0.3 does
not run yet is refused at start-up in one line naming the setting and the host
(docs/training.md, "torchtitan 0.2.2 and 0.3").

| module | holds |
|---|---|
| host.py | the version check and the CPU/gloo switch |
| recipe.py | TOML -> `GRTTrainer.Config`, and the 0.2.2-shaped view of a config our components read |
| model.py | the GRT as a 0.3 `BaseModel`, its parallelize function and model spec |
| components.py | tokenizer, data loaders and loss as 0.3 `Configurable`s |
| trainer.py | `GRTTrainer`: 0.3's Trainer with grt_titan's config sections |
"""
