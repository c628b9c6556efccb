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
| presets.py | preset names -> train_configs/ TOMLs (no torchtitan: the docs' checks read it) |
| recipe.py | TOML -> `GRTTrainer.Config`, key by key |
| refusals.py | what 0.3 does not run yet, in one line each (TOML keys and command-line overrides) |
| view.py | the 0.2.2-shaped view of a 0.3 config that host-neutral code reads |
| model.py | the GRT as a 0.3 `BaseModel`, its parallelize function and model spec |
| components.py | tokenizer, data loaders, loss and LR schedule as 0.3 `Configurable`s |
| metrics.py | the gate metrics and r-aware FLOPs (components/metrics.py's mixin) on 0.3's processor |
| validate.py | the depth-wise validation (components/validate.py's `DepthwiseValidation`) on 0.3's Validator |
| checkpoint.py | `GRTCheckpointManager`: 0.3's CheckpointManager with grt_titan's checksums |
| optimizer.py | `GRTOptimizersContainer`: 0.3's optimizers with the non-finite step guard (components/nonfinite.py) |
| checks.py | 0.2.2's start-up checks (config_checks' shared ones) on a 0.3 config |
| trainer.py | `GRTTrainer`: 0.3's Trainer with grt_titan's config sections and the loss-spike rewind |
"""
