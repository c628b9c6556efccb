"""Start-up checks of the job's data: the datasets it reads and the tokenizer's vocabulary
(docs/reliability.md).

A missing dataset folder would otherwise fail in the loader's first read, and a flavor
whose vocabulary is smaller than the tokenizer's would index past its embedding on the
first out-of-range id. grt_titan/config_checks.py runs these in its order; the teacher's
check reads the student's tokenizer through `tokenizer_path` (grt_titan/teacher.py).
"""

from __future__ import annotations

from pathlib import Path

from grt_titan.data.default_corpus import NAME as DEFAULT_DATASET
from grt_titan.data.shards import find_manifest
from grt_titan.tokenizer import GPT2_VOCAB_SIZE, load_tokenizer, resolve_tokenizer_source


def tokenizer_path(job_config) -> Path | None:
    """The job's tokenizer: `[model] tokenizer_path`, else the one `hf_assets_path` selects;
    None for the shipped GPT-2 ranks."""
    model = job_config.model
    return resolve_tokenizer_source(getattr(model, "tokenizer_path", None)) or resolve_tokenizer_source(
        getattr(model, "hf_assets_path", None)
    )


def _tokenizer_vocab_size(job_config) -> int:
    path = tokenizer_path(job_config)
    return GPT2_VOCAB_SIZE if path is None else load_tokenizer(path).get_vocab_size()


def vocab_problems(job_config, args) -> list[str]:
    """The flavor's vocabulary holds every id the tokenizer makes (and the tokenizer exists)."""
    try:
        vocab = _tokenizer_vocab_size(job_config)
    except (FileNotFoundError, ValueError) as e:  # a set hf_assets_path without one tokenizer
        return [str(e)]
    if args.vocab_size < vocab:
        return [
            f"[model] flavor = {job_config.model.flavor!r} has vocab_size = {args.vocab_size}, "
            f"smaller than the tokenizer's {vocab} ([model] hf_assets_path = "
            f"{job_config.model.hf_assets_path!r}); allowed: a flavor with vocab_size >= {vocab} "
            "or the tokenizer it was made for"
        ]
    return []


def dataset_problems(job_config) -> list[str]:
    """The training (and validation) dataset is the embedded corpus or a prepared folder with
    its manifest."""
    problems = []
    sections = [("training", job_config.training)]
    if job_config.validation.enable:
        sections.append(("validation", job_config.validation))
    for name, cfg in sections:
        if cfg.dataset == DEFAULT_DATASET:
            continue  # prepared on first use, at dataset_path or in the cache
        key, value = (
            (f"[{name}] dataset_path", cfg.dataset_path) if cfg.dataset_path else (f"[{name}] dataset", cfg.dataset)
        )
        if not value:
            problems.append(f"{key} is empty; allowed: {DEFAULT_DATASET!r} or a folder made by `grt-titan prepare`")
            continue
        try:
            find_manifest(value, key)
        except FileNotFoundError as e:
            problems.append(f"{e}; allowed: {DEFAULT_DATASET!r} or a folder made by `grt-titan prepare`")
    return problems
