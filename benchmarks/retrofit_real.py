"""Retrofit a real pretrained model and heal it: which init and split keep the source, what depth
buys, on the same tokens (docs/retrofit.md, docs/results/retrofit_real.md).

    python benchmarks/retrofit_real.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf --out /tmp/rr
    python benchmarks/retrofit_real.py --source ~/models/SmolLM2-135M-Instruct --out /tmp/rr --steps 40

The script fetches nothing. `--source` is a stock Hugging Face folder (Llama, Qwen3, GPT-2);
`--gguf` a GGUF file, which transformers dequantizes (the `gguf` package) into a float32 stock
folder under `--out` (docs/retrofit.md, "A real model offline", says where one comes from).

First, before any training: the default retrofit's Hugging Face export (`grt-titan export-hf`
of its model/ checkpoint, remote code) against the source's transformers forward, the loss on
`--export-tokens` tokens at r = 1, 2, 4, 8. Then every arm is one process (gloo, `--threads`
threads) from the written train.toml of `grt-titan retrofit`, the same steps, sequences, seed
and data order (the embedded corpus tokenized with the source's tokenizer), `[checkpoint]`
saving the last step:

- `source`: the dense source itself continued-trained (`grt-titan import-hf`, the retrofit
  TOML with the source's architecture as its flavor and no depth curriculum);
- `every-depth`, `first-loop`, `damped`: the default split (every layer kept, a mid-stack core)
  under each `--init`;
- `drop-middle`: McLeish et al.'s split (prelude p, core the 2p layers before the last p, coda
  p, the middle dropped) under the default init;
- `every-depth+kd`, `first-loop+kd`: the same with the source as the distillation teacher
  (`--distill.alpha`, docs/distillation.md).

The written recipe is used as written (its learning rate; its curriculum and warm-up shares of
`--steps`). Arms already run in `--out` are reused (their result.json). Validation scores the
same sequences at every depth r = 0..R and R + 2 (`--val-every`); training FLOPs are the model's count at each step's sampled depth
(retrofit_bench.training_flops), plus the teacher's forward for the KD arms. `--arms` picks arms.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.retrofit_bench import depth_losses, run, step_losses, training_flops, val_losses  # noqa: E402
from grt_titan.runtime.quiet_imports import quiet_torchao_import  # noqa: E402

quiet_torchao_import()  # before transformers imports torchao (grt_titan/runtime/quiet_imports.py)

ARMS = ("source", "every-depth", "first-loop", "damped", "drop-middle", "every-depth+kd", "first-loop+kd")


def stock_from_gguf(gguf: Path, out: Path) -> Path:
    """A float32 stock folder of the GGUF model (its tokenizer and chat template beside it)."""
    if (out / "config.json").is_file():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = model.config
    if hasattr(config, "quantization_config"):  # save_pretrained refuses a "gguf-quantized" model
        del config.quantization_config
    fresh = type(model)(config)
    fresh.load_state_dict(model.state_dict())
    fresh.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def source_folder(parser: argparse.ArgumentParser, opts) -> Path:
    """The stock folder of `--source DIR`, or of `--gguf FILE` dequantized into `--out`/stock
    (each script declares the three: the docs checker reads a script's own flags); a missing
    file or the gguf package is a parser error."""
    if opts.gguf is None:
        return opts.source.resolve()
    import importlib.util

    if importlib.util.find_spec("gguf") is None:
        parser.error("--gguf needs the gguf package to dequantize: pip install gguf==0.19.0")
    if not opts.gguf.is_file():
        parser.error(f"--gguf {opts.gguf}: no such file")
    return stock_from_gguf(opts.gguf.resolve(), opts.out.resolve() / "stock")


def retrofit(source: Path, out: Path, init: str, split: list[str], recurrences: int) -> Path:
    if not (out / "train.toml").is_file():
        cli = [sys.executable, "-m", "grt_titan.cli", "retrofit", str(source), "--out", str(out), "--overwrite"]
        run([*cli, "--init", init, "--recurrences", str(recurrences), *split], out.with_suffix(".log"), 2)
    return out


def export_at_init(source: Path, retrofitted: Path, out: Path, tokens: int, depths=(1, 2, 4, 8)) -> dict:
    """The retrofit's Hugging Face export before any training (`grt-titan export-hf` of its
    model/ checkpoint) against the source's own transformers forward: mean loss on `tokens`
    tokens of the embedded corpus's val split (the source's tokenizer) at each depth."""
    import torch
    from transformers import AutoModelForCausalLM

    from grt_titan.hf.retrofit_plan import sample_batches

    if not (out / "config.json").is_file():
        cli = [sys.executable, "-m", "grt_titan.cli", "export-hf", "--checkpoint", str(retrofitted / "model")]
        run(
            [*cli, "--config", str(retrofitted / "train.toml"), "--out", str(out), "--overwrite"],
            out.with_suffix(".log"),
            2,
        )
    batches = sample_batches(source, "grt_default", tokens, 256)
    models = {"source": AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)}
    models["export"] = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, trust_remote_code=True)

    result = {"tokens": sum(b[:, 1:].numel() for b in batches), "source": text_loss(models["source"].eval(), batches)}
    result["export"] = {r: text_loss(models["export"].eval(), batches, num_recurrences=r) for r in depths}
    return result


def text_loss(model, batches, **kwargs) -> float:
    """Mean next-token loss of `model` on `batches` ([b, length] token ids): a transformers model
    (its `.logits`) or a torchtitan GRTModel (its logits, the padding rows of
    `vocab_multiple_of` cut off); `kwargs` go to the forward (`num_recurrences=r`)."""
    import torch
    import torch.nn.functional as F

    args = getattr(model, "model_args", None)
    vocab = args.vocab_size if args is not None else model.config.vocab_size
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            output = model(batch[:, :-1], **kwargs)
            logits = getattr(output, "logits", output)[..., :vocab].float()
            total += F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="sum").item()
            count += batch[:, 1:].numel()
    return total / count


def dense_source(source: Path, retrofitted: Path, out: Path) -> Path:
    """The source as a dense torchtitan run: import-hf's checkpoint, the retrofit's TOML with
    the source's architecture (`source_args`) as its flavor and no depth curriculum."""
    import dataclasses

    from grt_titan.hf.stock_folders import read_stock_config, source_args

    out.mkdir(parents=True, exist_ok=True)
    args = source_args(read_stock_config(source))
    (out / "model_args.json").write_text(json.dumps(dataclasses.asdict(args), indent=2) + "\n")
    if not (out / "model").is_dir():
        cli = [sys.executable, "-m", "grt_titan.cli", "import-hf", "--hf-dir", str(source), "--out", str(out / "model")]
        run(cli, out / "import.log", 2)
    toml = (retrofitted / "train.toml").read_text()
    toml = toml.replace(str(retrofitted / "model_args.json"), str(out / "model_args.json"))
    toml = toml.replace(str(retrofitted / "model"), str(out / "model"))
    (out / "train.toml").write_text(toml)
    return out


def train(toml: Path, dump: Path, opts, *extra: str) -> dict:
    """One arm: `opts.steps` steps from `toml`; its losses, depth-wise validation and FLOPs."""
    s, b = str(opts.seq_len), str(opts.batch)
    cmd = [
        *(sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1", "--rdzv-backend=c10d"),
        *("--rdzv-endpoint=localhost:0", "-m", "grt_titan.train", "--job.config_file", str(toml)),
        *("--job.dump_folder", str(dump), "--training.steps", str(opts.steps), "--training.seq_len", s),
        *("--training.local_batch_size", b, "--training.global_batch_size", b, "--debug.seed", str(opts.seed)),
        *("--lr_scheduler.warmup_steps", str(max(1, opts.steps // 50)), "--compile.no-enable"),
        *("--checkpoint.interval", str(opts.steps), "--metrics.log_freq", "1", "--metrics.enable-tensorboard"),
        *("--validation.freq", str(opts.val_every), "--validation.seq_len", s, "--validation.local_batch_size", b),
        *("--validation.steps", str(opts.val_steps), "--grt_metrics.no-enable"),
        *extra,
    ]
    if (dump / "result.json").is_file():
        return json.loads((dump / "result.json").read_text())
    if dump.exists():
        shutil.rmtree(dump)
    start = time.perf_counter()
    text, _ = run(cmd, dump.with_suffix(".log"), opts.threads, timeout=3 * 3600)
    flops, mean_depth = training_flops(dump, opts.steps, opts.seq_len * opts.batch, opts.seq_len)
    result = {
        "steps": step_losses(text),
        "depth": depth_losses(text),
        "val": val_losses(text),
        "flops": flops,
        "mean_depth": mean_depth,
        "seconds": time.perf_counter() - start,
    }
    (dump / "result.json").write_text(json.dumps(result))
    return json.loads(json.dumps(result))  # keys as strings, as a reused arm's


def arm_commands(name: str, source: Path, out: Path, opts) -> tuple[Path, list[str]]:
    """(the arm's TOML, its extra options)."""
    curriculum = ["--grt.depth_curriculum_steps", str(max(1, opts.steps // 4))]
    init = name.removesuffix("+kd")
    kd = ["--distill.teacher", str(source), "--distill.alpha", str(opts.alpha)] if name.endswith("+kd") else []
    if name == "source":
        retrofitted = retrofit(source, out / "every-depth", "every-depth", [], opts.recurrences)
        return dense_source(source, retrofitted, out / "source") / "train.toml", ["--grt.depth_curriculum_steps", "0"]
    if name == "drop-middle":
        from grt_titan.hf.stock_folders import n_dense_layers, read_stock_config, source_args

        layers = n_dense_layers(source_args(read_stock_config(source)))
        p = max(1, layers // 8)
        split = ["--prelude", str(p), "--core", f"{layers - 3 * p}:{layers - p}", "--coda", str(p)]
        return retrofit(source, out / name, "every-depth", split, opts.recurrences) / "train.toml", curriculum
    return retrofit(source, out / init, init, [], opts.recurrences) / "train.toml", curriculum + kd


def report(results: dict[str, dict], opts, teacher_flops: float) -> None:
    tokens = opts.seq_len * opts.batch
    print("\n| arm | step-1 loss | steps | tokens | mean r | training FLOPs | seconds |")
    print("|---|---|---|---|---|---|---|")
    for name, res in results.items():
        flops = res["flops"] + (teacher_flops * opts.steps * tokens if name.endswith("+kd") else 0)
        r = "" if res["mean_depth"] is None else f"{res['mean_depth']:.2f}"
        row = [name, f"{res['steps']['1']:.4f}", str(opts.steps), f"{opts.steps * tokens:,}", r, f"{flops:.3e}"]
        print("| " + " | ".join(row) + f" | {res['seconds']:.0f} |")
    depths = sorted({int(r) for res in results.values() for by_r in res["depth"].values() for r in by_r})
    print("\nValidation loss by depth, the same sequences each time (the dense source: its loss under r = 1)\n")
    print("| arm | step | " + " | ".join(f"r = {r}" for r in depths) + " |")
    print("|---|---|" + "---|" * len(depths))
    for name, res in results.items():
        by_step = res["depth"] or {step: {"1": loss} for step, loss in res["val"].items()}
        for step, by_r in sorted(by_step.items(), key=lambda kv: int(kv[0])):
            cells = [f"{by_r[str(r)]:.4f}" if str(r) in by_r else "" for r in depths]
            print(f"| {name} | {step} | " + " | ".join(cells) + " |")


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """--source | --gguf and --out, which `source_folder` reads (both real-model benchmarks)."""
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--source", type=Path, help="a stock Hugging Face folder (Llama, Qwen3, GPT-2)")
    where.add_argument("--gguf", type=Path, help="a GGUF file (dequantized to a float32 stock folder in --out)")
    parser.add_argument("--out", type=Path, required=True, help="work folder (arms already run are reused)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_source_arguments(parser)
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--recurrences", type=int, default=4)
    parser.add_argument("--val-every", type=int, default=30)
    parser.add_argument("--val-steps", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.5, help="[distill] alpha of the +kd arms")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--export-tokens", type=int, default=2048, help="tokens scored at init (0: skip that stage)")
    parser.add_argument("--threads", type=int, default=2)
    opts = parser.parse_args(argv)
    out = opts.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    source = source_folder(parser, opts)
    arms = [a for a in opts.arms.split(",") if a]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        parser.error(f"--arms {unknown[0]!r} is unknown; allowed: {', '.join(ARMS)}")
    init = {}
    if opts.export_tokens:
        retrofitted = retrofit(source, out / "every-depth", "every-depth", [], opts.recurrences)
        init = export_at_init(source, retrofitted, out / "every-depth-export", opts.export_tokens)
        print(
            f"\nAt init, {init['tokens']} tokens: source {init['source']:.4f}; the default retrofit's export "
            + "  ".join(f"r={r}: {v:.4f} ({v - init['source']:+.1e})" for r, v in init["export"].items()),
            flush=True,
        )
    results = {}
    for name in arms:
        toml, extra = arm_commands(name, source, out, opts)
        results[name] = train(toml, out / "runs" / name, opts, *extra)
        print(f"{name}: {opts.steps} steps in {results[name]['seconds']:.0f} s", flush=True)
    from grt_titan.hf.stock_folders import read_stock_config, source_args

    teacher = source_args(read_stock_config(source)).forward_flops_per_token(opts.seq_len)
    report(results, opts, teacher)
    (out / "results.json").write_text(json.dumps({"export_at_init": init, "arms": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
