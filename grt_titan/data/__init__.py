"""grt_titan's data path: `grt-titan prepare` token shards and the resumable loaders.

- ``prepare``: text -> uint16 token shards + manifest.json (CLI ``grt-titan prepare``)
- ``loader``: ``build_dataloader`` / ``build_validation_dataloader`` for the train spec
- ``default_corpus``: the embedded corpus ``grt_default``
- ``checks``: the start-up checks of the datasets and the tokenizer's vocabulary
See docs/data.md.
"""
