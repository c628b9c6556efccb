"""Hugging Face export / import of GRT checkpoints, and the `trust_remote_code` model.

- remote/: the transformers model (configuration_grt.py, modeling_grt.py and the files it
  imports), self-contained remote code copied verbatim into every exported folder; it imports
  nothing of grt_titan (docs/hf_export.md, "Remote code"). Everything else here is a converter
  that runs beside grt_titan.
- convert.py: writing (and verifying) an exported folder. Reading checkpoints and exported
  weights is the job of grt_titan/checkpoints/ (shared with `grt-titan analyze`).
- config_map.py: the args <-> HF config.json map (read by `grt-titan analyze` too).
- export.py / importer.py: the `grt-titan export-hf` / `import-hf` commands.
- stock_folders.py: dense models <-> stock GPT-2 / Llama folders (GPT2LMHeadModel, LlamaForCausalLM;
  no remote code): the default export of a dense model, and its import.
- tokenizer_files.py: an export's tokenizer files: a Hugging Face tokenizer folder's, carried with
  its chat templates and generation ids, or GPT-2's, derived from tiktoken ranks.

Importing this package imports nothing heavy; transformers is needed by the modules that
build or load the HF model (`pip install grt-titan[hf]`).
"""
