"""The analysis tests reuse the tiny model, byte tokenizer, dataset and hand statistics of
tests/components/components_helpers.py (the metrics tests' helpers): put that folder on
the import path, as pytest does for the folder of each test module."""

import sys
from pathlib import Path

COMPONENTS = str(Path(__file__).resolve().parents[1] / "components")
if COMPONENTS not in sys.path:
    sys.path.insert(0, COMPONENTS)
