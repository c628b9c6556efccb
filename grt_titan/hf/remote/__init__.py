"""The remote model: the transformers model that ships inside every Hugging Face export.

Every file here but this one is copied verbatim into each exported folder
(grt_titan/hf/convert.py's `REMOTE_CODE_FILES` is this folder's file list), where
`from_pretrained(folder, trust_remote_code=True)` loads it on a machine that has torch and
transformers but not grt_titan. So a file here imports only torch, transformers, the standard
library and its siblings (relative imports), never grt_titan (tests/test_layers.py); a
function it shares with the training model is a marked copy (tests/hf/test_hf_copies.py).
The converters that write and read exports live one folder up, in grt_titan/hf/.
"""
