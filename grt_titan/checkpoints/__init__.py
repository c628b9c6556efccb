"""Reading and writing a trained GRT in one process: checkpoint folders, HF weights, and what
a start or a resume would load.

Why here, outside model/: model/ is the single-device model package (args, modules, the
recurrence, the HF key map), as torchtitan's `models/<name>/model/`, and imports nothing
from torch.distributed or torchtitan's config manager. Reading DCP folders is I/O: it sits
one layer above model/ and below components/, hf/ and analysis/ (docs/architecture.md,
"Layer order"), as torchtitan keeps its checkpoint code out of its model packages
(`components/checkpoint.py`, the conversion scripts). Every tool that reads a trained GRT
outside torchrun goes through here: `grt-titan export-hf` / `import-hf`, `grt-titan analyze` /
`table`, benchmarks and tests; so does the start-up check of a resume, and the checkpoint
manager takes its steps from here. It imports nothing that only torchtitan 0.2.2 has: it
serves either host.

One module per job (import the module; this package re-exports nothing):

- folders.py: a checkpoint folder's files and its latest complete step.
- start_load.py: what a start or a resume would load, checked at start-up, and the line
  naming the initial weights.
- job_files.py: torchtitan 0.2.2's whole JobConfig of a training TOML or run record.
- hf_weights.py: reading Hugging Face safetensors and checking them against the args.
- load.py: a step folder or HF weights into a native state dict or a model; saving one.

The GRTModelArgs and settings of a training TOML or a run record (`load_model_args`,
`OverridesParser`, `CheckpointError`) are grt_titan/run_reader.py's, the host-neutral reader.
"""
