"""Hugging Face export / import of GRT checkpoints, and the `trust_remote_code` model.

- configuration_grt.py, modeling_grt.py: the transformers model (self-contained; copied
  into every exported folder).
- convert.py: writing (and verifying) an exported folder. Reading checkpoints, exported
  weights and the args <-> HF config map is grt_titan/model/checkpoint.py's (shared with
  `grt-titan analyze`).
- export.py / importer.py: the `grt-titan export-hf` / `import-hf` commands.
- tokenizer_files.py: GPT-2 tokenizer files from the tiktoken ranks.

Importing this package imports nothing heavy; transformers is needed by the modules that
build or load the HF model (`pip install grt-titan[hf]`).
"""
