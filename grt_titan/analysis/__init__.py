"""Offline diagnostics of a trained GRT: the paper's appendix-E figures (`grt-titan analyze`).

- `diagnostics`: per-depth loss / KL and per-step gate and update statistics
- `plots`: matplotlib figures (no pyplot, no global backend)
- `load`: a checkpoint (+ config) or an HF export into one process
- `report`: `analyze()`, which writes analysis.json and the PNGs
- `cli`: the `grt-titan analyze` subcommand

Imports nothing heavy at package import (matplotlib only when plotting).
"""
