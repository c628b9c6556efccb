"""Offline diagnostics of a trained GRT: the paper's appendix-E figures (`grt-titan analyze`),
and table 1 / figure 5 over training runs (`grt-titan table`).

- `diagnostics`: per-depth loss / KL, per-step gate and update statistics and step dynamics,
  per-token halting's quality-compute sweep
- `plots`: matplotlib figures (no pyplot, no global backend)
- `load`: a checkpoint (+ config) or an HF export into one process
- `report`: `analyze()`, which writes analysis.json and the PNGs
- `cli`: the `grt-titan analyze` subcommand
- `runs`: a training run's record (grt_run.json) and last validation loss
- `table`: `grt-titan table`, table 1's rows (Markdown, CSV) and figure 5's ladder

Imports nothing heavy at package import (matplotlib only when plotting).
"""
