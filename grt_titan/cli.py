"""`grt-titan` console script: one entry point, one subcommand per tool."""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module with `main(argv) -> int`, one-line help)
COMMANDS = {
    "prepare": ("grt_titan.data.prepare", "turn local text or prompt/completion records into token shards"),
    "task": ("grt_titan.data.tasks", "write multi-step problems (prompt/completion JSONL) or the task tokenizer"),
    "export-hf": ("grt_titan.hf.export", "export a checkpoint to a Hugging Face folder"),
    "import-hf": ("grt_titan.hf.importer", "convert a Hugging Face folder to a checkpoint"),
    "retrofit": ("grt_titan.hf.retrofit_cli", "split a pretrained GPT-2 / Llama / Qwen3 folder into a GRT"),
    "analyze": ("grt_titan.analysis.cli", "per-recurrence-step plots and numbers of a trained model"),
    "eval-task": ("grt_titan.analysis.task_eval", "exact-match accuracy by problem depth x recurrence, arrival steps"),
    "table": ("grt_titan.analysis.table", "paper table 1 (and figure 5's ladder) from training runs"),
}


def usage() -> str:
    lines = ["usage: grt-titan COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:12s} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines.append("\nTraining: torchrun ... -m grt_titan.train --job.config_file CONFIG.toml")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"grt-titan: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
        return 2
    # transformers imports torchao, which prints CUDA-library and deprecation noise first.
    from grt_titan.runtime.quiet_imports import quiet_torchao_import

    quiet_torchao_import()
    module = importlib.import_module(COMMANDS[command][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
