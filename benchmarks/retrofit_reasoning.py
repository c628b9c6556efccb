"""The recurrent-retrofit study on a real checkpoint: a retrofit taught the iterated-function
task one step per loop, against the source fine-tuned answer-only and with a scratchpad, on
the same problems (arXiv 2608.11233; docs/retrofit.md, "Reasoning in depth: the task recipe";
docs/results/reasoning_in_depth.md).

    python benchmarks/retrofit_reasoning.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf --out /tmp/reason
    python benchmarks/retrofit_reasoning.py --source ~/models/SmolLM2-135M-Instruct --out /tmp/reason --init first-loop

The script fetches nothing (`--gguf` / `--source` as in benchmarks/retrofit_real.py). The data
is `grt-titan task iterated-function --chat` (the source's chat template): training depths
`--depths` (1-8), test depths up to `--test-depth` (12), `--symbols` 13. Every arm is one
process through grt_titan.train (gloo, `--threads` threads) on the same problems in the same
order, `--steps` x `--batch`, AdamW at `--lr` with 1/50 warm-up:

- `recurrent`: `grt-titan retrofit --recurrences R --task-recipe` (`--init`, default
  every-depth)'s task.toml as written:
  the recurrent block trained (`[training] trainable = ["recurrent"]`), loop t supervised
  toward f^t(x) for the first 3/4 of the steps, then the answer alone (the annealing), the
  depth curriculum over the first quarter;
- `parts`: the same with W_proj and the gate alone trained (`trainable = ["parts"]`; RRT's
  per-step LoRA `adapter` is implemented for GPT-2 blocks only, not for this Llama source);
- `dense`: the source itself (`grt-titan import-hf`), every weight trained on the answers;
- `scratchpad`: the same on completions that write every intermediate value, the answer last
  (`grt-titan task --scratchpad`).

Measured per arm, on `--test-per-depth` test problems per depth (disjoint from training):
exact-match accuracy by depth (the recurrent arms at r = 1, r = depth and r = R, each step's
state read out as `forward` would, in one pass; the scratchpad arm by greedy generation, the last
value it writes); persistence (the recurrent arms: whether loop t's readout says f^t(x),
t <= min(depth, R), for loop 1 and loops >= 2 apart, before and after the annealing); wall-clock per answer by greedy cached
generation of each arm's Hugging Face export (`grt-titan export-hf`, batch 1, the first
`--timed` test problems of each depth); loss on held-out text at r = 1 (the embedded corpus's
val split, the source's tokenizer) against the source's own transformers forward. Arms already
run in `--out` are reused (their result.json). It claims nothing beyond the sizes it ran.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time
from pathlib import Path

import tomllib
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.retrofit_bench import run, step_losses  # noqa: E402
from benchmarks.retrofit_real import add_source_arguments, dense_source, source_folder, text_loss  # noqa: E402
from grt_titan.runtime.quiet_imports import quiet_torchao_import  # noqa: E402

quiet_torchao_import()  # before transformers imports torchao (grt_titan/runtime/quiet_imports.py)

ARMS = ("recurrent", "parts", "dense", "scratchpad")
RECURRENT = ("recurrent", "parts")


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "grt_titan.cli", *args]


def task_files(source: Path, out: Path, opts) -> dict[str, Path]:
    """The chat-rendered task folders (train: answers with per-step targets, and scratchpads;
    test: depths 1..--test-depth) written by `grt-titan task` and `grt-titan prepare`."""
    n = opts.steps * opts.batch
    task = ["iterated-function", "--chat", "--symbols", str(opts.symbols), "--seed", str(opts.seed)]
    files = {"answers": out / "task" / "answers.jsonl", "scratchpad": out / "task" / "scratchpad.jsonl"}
    files["test"] = out / "task" / "test.jsonl"
    made = {
        "answers": ["--depths", opts.depths, "--n", str(n)],
        "scratchpad": ["--depths", opts.depths, "--n", str(n), "--scratchpad"],
        "test": [
            "--depths",
            f"1-{opts.test_depth}",
            "--n",
            str(opts.test_per_depth * opts.test_depth),
            "--split",
            "test",
        ],
    }
    for name, extra in made.items():
        if not files[name].is_file():
            run(cli("task", *task, *extra, "--out", str(files[name])), files[name].with_suffix(".log"), 1)
    for name in ("answers", "scratchpad"):
        data = files[name].with_suffix("")
        if not (data / "manifest.json").is_file():
            prepare = ["prepare", str(files[name]), "--tokenizer", str(source), "--out", str(data), "--overwrite"]
            run(cli(*prepare, "--val-fraction", "0.01"), data.with_suffix(".prepare.log"), 1)
        files[f"{name}_data"] = data
    return files


def seq_len_of(source: Path, jsonl: Path) -> int:
    """The longest chat-rendered record, rounded up to 16: one problem per sequence."""
    from grt_titan.data.records import ChatTemplate, read_records
    from grt_titan.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(source)
    longest = 0
    for record in read_records([jsonl]):
        longest = max(longest, len(ChatTemplate.of(tokenizer, record.where).encode(record)[0]))
    return -(-longest // 16) * 16


def arm_toml(name: str, source: Path, out: Path, opts) -> Path:
    """The arm's TOML: the recipe's task.toml (recurrent arms), or the source's dense TOML made
    from it (import-hf's checkpoint, the source's architecture, no step supervision, every
    weight trained)."""
    retrofitted = out / f"retrofit-{opts.init}-r{opts.recurrences}"
    if not (retrofitted / "task.toml").is_file():
        cli_args = ["retrofit", str(source), "--out", str(retrofitted), "--overwrite", "--task-recipe"]
        cli_args += ["--recurrences", str(opts.recurrences), "--init", opts.init]
        run(cli(*cli_args), retrofitted.with_suffix(".log"), 2)
    if name in RECURRENT:
        return retrofitted / "task.toml"
    from grt_titan.hf.retrofit import _toml_tables

    dense = dense_source(source, retrofitted, out / "source")
    recipe = tomllib.loads((retrofitted / "task.toml").read_text())
    recipe["model"]["flavor"] = str(dense / "model_args.json")  # the source's architecture
    recipe["checkpoint"]["initial_load_path"] = str(dense / "model")  # import-hf's checkpoint
    recipe["training"].pop("trainable")  # every weight
    for key in ("step_supervision", "step_supervision_steps", "depth_curriculum_steps"):
        recipe["grt"].pop(key)  # the answers alone
    (dense / "task.toml").write_text("\n".join(_toml_tables(recipe)) + "\n")
    return out / "source" / "task.toml"


def train(name: str, toml: Path, data: Path, seq_len: int, out: Path, opts) -> dict:
    """One arm's run (reused when its result.json exists); a checkpoint at the annealing's start."""
    dump = out / "runs" / name
    if (dump / "result.json").is_file():
        return json.loads((dump / "result.json").read_text())
    anneal = opts.steps - opts.steps // 4
    s, b = str(seq_len), str(opts.batch)
    cmd = [
        *(sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1", "--rdzv-backend=c10d"),
        *("--rdzv-endpoint=localhost:0", "-m", "grt_titan.train", "--job.config_file", str(toml)),
        *("--job.dump_folder", str(dump), "--training.dataset", str(data), "--training.steps", str(opts.steps)),
        *("--training.seq_len", s, "--training.local_batch_size", b, "--training.global_batch_size", b),
        *("--debug.seed", str(opts.seed), "--optimizer.lr", str(opts.lr), "--compile.no-enable"),
        *("--lr_scheduler.warmup_steps", str(max(1, opts.steps // 50)), "--checkpoint.interval", str(anneal)),
        *("--metrics.log_freq", "10", "--validation.no-enable", "--grt_metrics.no-enable"),
        *("--activation_checkpoint.mode", "none"),
    ]
    if name in RECURRENT:
        cmd += ["--grt.depth_curriculum_steps", str(opts.steps // 4), "--grt.step_supervision_steps", str(anneal)]
        cmd += ["--training.trainable", name]
    text, seconds = run(cmd, out / "runs" / f"{name}.log", opts.threads, timeout=4 * 3600)
    trained = re.search(r"trainable = .*?: ([\d,]+) of ([\d,]+) parameters", text)
    result = {"losses": step_losses(text), "seconds": seconds, "anneal_step": anneal}
    result["trained_params"] = trained.group(1) if trained else "all"
    (dump / "result.json").write_text(json.dumps(result))
    return json.loads(json.dumps(result))


@torch.no_grad()
def score_by_step(
    model, encoded: list[tuple[list[int], int]], step_tokens: list[list[int]], readouts: list[set[int]]
) -> list[dict]:
    """Per problem i, from one pass (the prelude once, the core iterated to the batch's last
    readout, the states after the steps in `readouts[i]` read out through the coda and head as
    `forward(num_recurrences=r)` would): {"answer": {r: greedy completion exact}, "step": {t:
    loop t's first answer token is the t-th intermediate value}} for r, t in readouts[i] (t up
    to len(step_tokens[i])); a dense model (no core) gives {"answer": {"dense": exact}}.
    Reading out only the steps reported, and the head only at the scored positions, is what
    keeps the measuring inside the benchmark's time (the coda is as deep as the core here)."""
    from grt_titan.analysis.task_eval import _batches, answered

    out = [{"answer": {}, "step": {}} for _ in encoded]
    device = next(model.parameters()).device
    for batch, ids in _batches(encoded, 16, device, group=lambda i: tuple(sorted(readouts[i]))):
        inputs, first = ids[:, :-1], ids.shape[1] - 1 - max(encoded[i][1] for i in batch)
        if model.recurrence is None:
            readout = [("dense", model(inputs)[:, first:])]
        else:
            wanted = readouts[batch[0]]  # one set per batch (the grouping)
            h_pre = model.prelude(model.embed(inputs), model.freqs_cis)
            states = model.recurrence(h_pre, model.freqs_cis, max(wanted), all_states=True).step_states
            hidden = lambda r: model.final_hidden(states[r - 1])[:, first:]  # noqa: E731
            readout = ((r, model.output(hidden(r))) for r in sorted(wanted))
        for r, logits in readout:
            predicted = logits.argmax(-1)  # position p of the window is position first + p
            for row, i in enumerate(batch):
                n = encoded[i][1]
                at = answered(ids, n)
                out[i]["answer"][r] = torch.equal(predicted[row, at.start - first : at.stop - first], ids[row, -n:])
                if r != "dense" and r <= len(step_tokens[i]):
                    out[i]["step"][r] = predicted[row, at.start - first].item() == step_tokens[i][r - 1]
    return out


def step_first_tokens(tokenizer, record, n_completion: int, ids: list[int]) -> list[int]:
    """The first answer token of each intermediate value f^t(x), rendered as the answer."""
    from grt_titan.analysis.task_eval import encode

    first = len(ids) - n_completion
    tokens = []
    for value in record.meta.get("steps", []):
        turns = [*record.messages[:-1], {"role": "assistant", "content": value}]
        step_record = dataclasses.replace(record, messages=turns)
        tokens.append(encode(tokenizer, step_record, 1 << 30, 1 << 30)[0][first])
    return tokens


def evaluate(loaded, records, opts, persistence_only: bool = False) -> list[dict]:
    """`score_by_step` of a loaded run (grt_titan.analysis.load) on the test records, read out
    at what the report shows: loops t <= min(depth, R) (persistence; r = 1), and unless
    `persistence_only`, r = depth and r = R (accuracy)."""
    from grt_titan.analysis.task_eval import encode

    args, R = loaded.args, opts.recurrences
    encoded = [encode(loaded.tokenizer, r, args.vocab_size, args.max_seq_len) for r in records]
    steps = [step_first_tokens(loaded.tokenizer, r, n, ids)[:R] for r, (ids, n) in zip(records, encoded)]
    readouts = []
    for record in records:
        depth = record.meta["depth"]
        readouts.append(set(range(1, min(depth, R) + 1)) | (set() if persistence_only else {depth, R}))
    return score_by_step(loaded.model, encoded, steps, readouts)


def generation_timing(export: Path, source: Path, records, loops_of, opts) -> list[dict]:
    """Greedy cached generation at batch 1 of the export (transformers), at `loops_of(depth)`
    recurrences (None: the model's own depth): per record, its seconds, tokens, and whether
    the value it writes last is the answer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32, trust_remote_code=True).eval()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    out = []
    for record in records:
        prompt = tokenizer.apply_chat_template(record.messages[:-1], add_generation_prompt=True, return_tensors="pt")
        prompt = getattr(prompt, "input_ids", prompt)
        depth = record.meta["depth"]
        kwargs = {} if loops_of is None else {"num_recurrences": loops_of(depth)}
        start = time.perf_counter()
        with torch.no_grad():
            new = model.generate(
                prompt, max_new_tokens=2 * opts.test_depth + 4, do_sample=False, eos_token_id=end, **kwargs
            )[0, prompt.shape[1] :]
        seconds = time.perf_counter() - start
        text = tokenizer.decode(new, skip_special_tokens=True).split()
        answer = record.meta["steps"][-1] if "steps" in record.meta else record.messages[-1]["content"].split()[-1]
        out.append({"depth": depth, "seconds": seconds, "tokens": len(new), "right": bool(text) and text[-1] == answer})
    return out


def export(name: str, out: Path) -> Path:
    dump, folder = out / "runs" / name, out / "exports" / name
    if not (folder / "config.json").is_file():
        checkpoint = ["--checkpoint", str(dump / "checkpoint"), "--config", str(dump / "grt_run.json")]
        run(cli("export-hf", *checkpoint, "--out", str(folder), "--overwrite"), folder.with_suffix(".log"), 2)
    return folder


def measure(name: str, source: Path, out: Path, records, batches, opts) -> dict:
    """The arm's scores (reused when its eval.json exists)."""
    from grt_titan.analysis.load import load_model

    dump = out / "runs" / name
    if (dump / "eval.json").is_file():
        return json.loads((dump / "eval.json").read_text())
    final = max((dump / "checkpoint").glob("step-*"), key=lambda p: int(p.name.split("-")[1]))
    result = {"checkpoint": final.name}
    loaded = load_model(final, dump / "grt_run.json")
    recurrent = loaded.model.recurrence is not None
    result["text_loss_r1"] = text_loss(loaded.model, batches, **({"num_recurrences": 1} if recurrent else {}))
    by_depth = {}
    for record in records:
        by_depth.setdefault(record.meta["depth"], []).append(record)
    timed = [r for depth in sorted(by_depth) for r in by_depth[depth][: opts.timed]]
    folder = export(name, out)
    if name == "scratchpad":
        result["generated"] = generation_timing(folder, source, records, None, opts)
    else:
        result["scores"] = evaluate(loaded, records, opts)
        loops = (lambda depth: depth) if recurrent else None
        result["generated"] = generation_timing(folder, source, timed, loops, opts)
    if recurrent:
        result["generated_at_R"] = generation_timing(folder, source, timed, lambda depth: opts.recurrences, opts)
        before = dump / "checkpoint" / f"step-{opts.steps - opts.steps // 4}"
        if before != final and before.is_dir():
            before_run = load_model(before, dump / "grt_run.json")
            result["scores_before_annealing"] = evaluate(before_run, records, opts, persistence_only=True)
    (dump / "eval.json").write_text(json.dumps(result))
    return json.loads(json.dumps(result))


def accuracy(records, right) -> dict[int, float]:
    """{depth: fraction right} of (record, bool) pairs."""
    totals: dict[int, list[int]] = {}
    for record, ok in zip(records, right):
        totals.setdefault(record.meta["depth"], []).append(int(ok))
    return {d: sum(v) / len(v) for d, v in sorted(totals.items())}


def persistence(scores: list[dict]) -> str:
    """`loop 1 / loops >= 2`: the share of (problem, loop t <= min(depth, R)) whose loop-t
    readout says f^t(x), for t = 1 (one lookup, which the source can do) and for t >= 2."""
    cells = [[ok for s in scores for t, ok in s["step"].items() if (str(t) == "1") == first] for first in (True, False)]
    return " / ".join(f"{sum(c) / len(c):.2f}" if c else "-" for c in cells)


def accuracy_rows(results: dict, records, opts) -> list[tuple[str, dict[int, float]]]:
    rows = []
    for name, res in results.items():
        if name == "scratchpad":
            rows.append((f"{name} (generated, last value)", accuracy(records, [g["right"] for g in res["generated"]])))
            continue
        scores = res["scores"]
        if name not in RECURRENT:
            rows.append((name, accuracy(records, [s["answer"]["dense"] for s in scores])))
            continue
        at = lambda r: [s["answer"][str(r)] for s in scores]  # noqa: E731
        by_depth = [s["answer"][str(rec.meta["depth"])] for s, rec in zip(scores, records)]
        rows.append((f"{name}, r = depth", accuracy(records, by_depth)))
        rows.append((f"{name}, r = R = {opts.recurrences}", accuracy(records, at(opts.recurrences))))
        rows.append((f"{name}, r = 1", accuracy(records, at(1))))
    return rows


def report(results: dict, records, source_loss: float, opts) -> str:
    trained = range(int(opts.depths.split("-")[0]), int(opts.depths.split("-")[1]) + 1)
    depths = sorted({r.meta["depth"] for r in records})
    lines = [
        "| arm | "
        + " | ".join(f"d={d}" + ("*" if d not in trained else "") for d in depths)
        + " | mean trained | mean beyond |",
        "|---|" + "---|" * (len(depths) + 2),
    ]
    for label, acc in accuracy_rows(results, records, opts):
        inside = [acc[d] for d in depths if d in trained]
        beyond = [acc[d] for d in depths if d not in trained]
        mean = lambda v: f"{sum(v) / len(v):.2f}" if v else "-"  # noqa: E731
        lines.append(
            f"| {label} | " + " | ".join(f"{acc[d]:.2f}" for d in depths) + f" | {mean(inside)} | {mean(beyond)} |"
        )
    lines += ["", f"d=N*: beyond the trained depths {opts.depths}", ""]
    lines += [
        f"| arm | trained params | train s | last loss | loop t says f^t(x), t = 1 / t >= 2: before; after annealing | text loss r = 1 (source {source_loss:.4f}) | s / answer | s / answer at R | tokens / answer |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, res in results.items():
        losses = res["train"]["losses"]
        last = losses[max(losses, key=int)] if losses else float("nan")
        kept = "-"
        if name in RECURRENT:
            kept = f"{persistence(res.get('scores_before_annealing', []))}; {persistence(res['scores'])}"
        generated = res["generated"]
        per = sum(g["seconds"] for g in generated) / len(generated)
        tokens = sum(g["tokens"] for g in generated) / len(generated)
        at_r = res.get("generated_at_R")
        at_r = f"{sum(g['seconds'] for g in at_r) / len(at_r):.3f}" if at_r else "-"
        lines.append(
            f"| {name} | {res['train']['trained_params']} | {res['train']['seconds']:.0f} | {last:.4f} | {kept} | "
            f"{res['text_loss_r1']:.4f} | {per:.3f} | {at_r} | {tokens:.1f} |"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_source_arguments(parser)
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument(
        "--recurrences", type=int, default=8, help="R of the retrofit (>= the deepest training problem)"
    )
    parser.add_argument(
        "--init", default="every-depth", choices=("every-depth", "first-loop", "damped"), help="the retrofit's --init"
    )
    parser.add_argument("--depths", default="1-8", help="A-B: training depths")
    parser.add_argument("--test-depth", type=int, default=12, help="test depths 1..N (and r up to N)")
    parser.add_argument("--test-per-depth", type=int, default=25)
    parser.add_argument("--symbols", type=int, default=13)
    parser.add_argument("--timed", type=int, default=2, help="test problems per depth generated for wall-clock")
    parser.add_argument("--text-tokens", type=int, default=2048, help="held-out text scored at r = 1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    opts = parser.parse_args(argv)
    out = opts.out.resolve()
    arms = [a for a in opts.arms.split(",") if a]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        parser.error(f"--arms {unknown[0]!r} is unknown; allowed: {', '.join(ARMS)}")
    if opts.symbols < opts.test_depth + 1:
        parser.error(f"--symbols {opts.symbols}: test depth {opts.test_depth} needs >= {opts.test_depth + 1} symbols")
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    source = source_folder(parser, opts)
    from transformers import AutoModelForCausalLM

    from grt_titan.analysis.task_eval import task_records
    from grt_titan.hf.retrofit_plan import sample_batches

    files = task_files(source, out, opts)
    records = task_records(files["test"])
    batches = sample_batches(source, "grt_default", opts.text_tokens, 256)
    stock = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    source_loss = text_loss(stock, batches)
    del stock
    seq_lens = {kind: seq_len_of(source, files[kind]) for kind in ("answers", "scratchpad")}
    results = {}
    for name in arms:
        kind = "scratchpad" if name == "scratchpad" else "answers"
        trained = train(name, arm_toml(name, source, out, opts), files[f"{kind}_data"], seq_lens[kind], out, opts)
        print(f"{name}: {opts.steps} steps in {trained['seconds']:.0f} s", flush=True)
        measuring = time.perf_counter()
        results[name] = {"train": trained, **measure(name, source, out, records, batches, opts)}
        print(f"{name}: measured in {time.perf_counter() - measuring:.0f} s", flush=True)
    text = report(results, records, source_loss, opts)
    text += f"\n\nThis invocation: {time.perf_counter() - started:.0f} s (arms reused from --out take none)"
    print("\n" + text)
    (out / "summary.md").write_text(text + "\n")
    (out / "results.json").write_text(json.dumps({"source_text_loss": source_loss, "arms": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
