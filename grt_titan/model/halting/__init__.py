"""Per-token halting at inference (docs/generation.md): the rules that stop a token's
recurrence (rules.py) and the learned probe that one of them reads (probe.py)."""
