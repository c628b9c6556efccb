"""What lets the package run where torchtitan does not expect it, apart from the model and the
trainer: CPU training (cpu_support.py), the fake process group of the meta-model checks
(fake_backend.py), torchao's import-time noise held back (quiet_imports.py), and folders and
files written whole or not at all (atomic_dir.py)."""
