"""Depth that pays, on one CPU core in minutes: pointer chasing over one table per sequence,
every query answered (docs/tasks.md, "Where depth pays"; docs/results/depth_pays.md).

    python benchmarks/depth_pays_bench.py --out /tmp/depth_pays                      # every row
    python benchmarks/depth_pays_bench.py --rows grt_steps dense --out /tmp/depth_pays

A sequence is the table of f, a random single cycle over N symbols (slot i holds f(i), so a
lookup is "attend to slot i", one attention layer), then K query tokens, each one id for a
pair (x, d); the answer at the query's position is f^d(x), d ~ Uniform{1..R} per query. A
single cycle makes f^a(x) != f^b(x) for a != b < N: an answer one step short is wrong, and
chance is 1/N. Problems are fresh every batch (nothing is memorized) and every query is in
the loss, so a batch of 64 sequences holds 1,024 answers: the signal per token that the
one-answer records of `grt-titan task` lack (docs/results/task_training.md).

Rows, all the project's GRTModel (GPT-2 blocks, learned positions, d 64, no noise), trained in
process through the model's own training forward and loss (`grt_titan.components.loss.grt_loss`,
the depth sampler, `[grt] step_supervision`'s readouts), AdamW, one thread:

- `grt_steps`: 1 + 1 x R + 1 blocks, R = 6, r ~ Uniform{1..R}, per-step supervision (step t's
  readout toward f^min(t, d)(x));
- `grt`: the same, the answer alone at the sampled r;
- `unlooped`: the same blocks trained and scored at r = 1 (the recurrence never iterated);
- `dense`: 8 unshared blocks, the answer alone (the isoFLOP twin of 1 + R + 1 block applications
  at R = 6);
- `poisson_steps`, `mor`, `ouro`, `rrt_steps`: table 1's four rows on the same blocks and R, their
  [grt] parts read from train_configs/paper/small_*.toml (less its depth; RRT's LoRA at rank
  dim / 4), with per-step supervision where the method takes it (Ouro's exit distribution and
  MoR's router do not).

With `--depth-given query` (the default) a depth beyond R cannot be asked: a query's depth is
part of its token, and a depth never trained has an untrained embedding; the columns r > R show
whether an answer holds. With `--depth-given loops` a query names x alone, step t is trained
toward f^t(x) (the rows with per-step supervision: LOOPS_ROWS), and depth d is asked by running
r = d loops, to depths beyond R (extrapolation, up to min(2R, N - 1): f^N(x) = x); no halting
rule is scored there (nothing in the query says when to stop).

The first row's --steps fix the FLOP budget; the others train for as many steps as their
training FLOPs per token allow (`get_nparams_and_flops`). `--align` (default 1, every row
alike) starts table slot i's position embedding as a fixed rotation of symbol i's embedding
and each query's as its symbol's: an initialisation aid so that the lookup is learnable in
minutes; nothing is frozen; `--align 0` turns it off. `--depth-curriculum F` grows the
deepest training problem from 1 to R over the first F of each row's steps. `--gate-bias-init B`
starts every gated row's gate bias at B instead of the paper's +4. Accuracy by problem depth x r = 0..2R
(r = 0: prelude and coda alone) on fresh problems, and each query's arrival step (the first r
from which it stays right); for the recurrent rows, each per-token halting rule of HALTING
(and the `ouro` row's own trained exit, Ouro's Q-exit at OURO_EXIT), and the learned rule at
LEARNED (its probe fitted to the frozen row for `--probe-steps`, grt_titan/model/halting/probe.py),
on a uniform mix of depths against the fixed depths, the queries halting and the table they read
at full depth (`--context-halts`: also with the table halting by the rule); and then, as a deployed model answers, the exported model with its KV
cache taking each query as one decode step (batch 1) at each fixed r and under each rule the
row takes: seconds per answer (`--cached-sequences`). Each row writes `--out/ROW/result.json`
and its weights `model.pt`; a second run with the same --out scores the rows it trained
again without training them; `summary.md` gathers them. It claims nothing beyond the sizes
and budgets it ran.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from depth_task_bench import equal_flop_steps, paper_grt  # noqa: E402

from grt_titan.analysis.task_eval import (  # noqa: E402
    HALTING_TOLERANCE,
    halting_label,
    halting_loss_line,
    halting_summary,
    halting_table,
)
from grt_titan.components.loss import grt_loss  # noqa: E402
from grt_titan.model.args import GRTModelArgs  # noqa: E402
from grt_titan.model.halting.probe import fit_halting_probe  # noqa: E402
from grt_titan.model.halting.rules import LEARNED_RULE, HaltingProbe, never_halts  # noqa: E402
from grt_titan.model.methods.ouro import q_exit  # noqa: E402
from grt_titan.model.model import GRTModel  # noqa: E402

IGNORE = -100
ROWS = ("grt_steps", "grt", "unlooped", "dense", "poisson_steps", "mor", "ouro", "rrt_steps")
# Table 1's rows: the paper TOML whose [grt] parts each takes.
PAPER_ROWS = {"poisson_steps": "small_poisson", "mor": "small_mor", "ouro": "small_ouro", "rrt_steps": "small_rrt"}
# Per-token halting rules scored on a uniform mix of depths (grt_titan/model/halting/rules.py).
HALTING = (
    ("argmax", 1),
    ("argmax", 2),
    ("kl", 0.1),
    ("kl", 0.01),
    ("state", 0.3),
    ("state", 0.1),
    ("state", 0.02),
    ("gate", 0.02),
)
# Ouro's trained rule (the `ouro` row): exit at the first step whose exit CDF reaches q.
OURO_EXIT = (0.5, 0.7, 0.9)
# The learned rule's thresholds: 1 - P(done) below x halts (P(done) >= 0.97, 0.9, 0.7).
LEARNED = (0.03, 0.1, 0.3)
# --depth-given loops: the rows whose every step has a target (loop t toward f^t(x)).
LOOPS_ROWS = ("grt_steps", "poisson_steps", "rrt_steps")
# The options a trained row depends on: a row trained under others is trained again.
TRAINING_OPTIONS = (
    "depth_given",
    "symbols",
    "queries",
    "recurrences",
    "dim",
    "dense_layers",
    "batch",
    "lr",
    "align",
    "depth_curriculum",
    "gate_bias_init",
    "seed",
)


def model_args(row: str, opts) -> GRTModelArgs:
    queries = opts.recurrences if opts.depth_given == "query" else 1  # query ids per symbol
    common = dict(block_style="gpt2", dim=opts.dim, n_heads=4, vocab_size=opts.symbols * (1 + queries))
    common["max_seq_len"] = opts.symbols + opts.queries
    if row == "dense":
        return GRTModelArgs(**common, n_prelude_layers=opts.dense_layers, n_core_layers=0, n_coda_layers=0)
    parts = dict(num_recurrences=opts.recurrences, min_recurrences=1, state_noise_std=0.0, gate_noise_std=0.0)
    if opts.gate_bias_init is not None:
        parts["gate_bias_init"] = opts.gate_bias_init
    if row in PAPER_ROWS:
        parts |= paper_grt(PAPER_ROWS[row])
        if parts.get("step_adapter") == "lora":
            parts["lora_rank"] = max(1, opts.dim // 4)
        if "backprop_recurrences" in parts:
            parts["backprop_recurrences"] = min(parts["backprop_recurrences"], opts.recurrences)
    if row == "unlooped":
        parts |= dict(num_recurrences=1, depth_sampling="fixed")
    args = GRTModelArgs(**common, n_prelude_layers=1, n_core_layers=1, n_coda_layers=1, **parts)
    args.step_supervision = row.endswith("_steps")
    args.validate(f"depth_pays_bench row {row!r}")
    return args


def problems(
    opts, batch: int, generator: torch.Generator, depth: int | None = None, deepest: int | None = None
) -> dict[str, torch.Tensor]:
    """`batch` sequences: tokens [B, N + K], the answers at the query positions (labels [B, S],
    ignore elsewhere), step t's target (step_labels [B, S, R]: f^min(t, d)(x); f^t(x) when the
    loops give the depth) and each query's d (`depth`, else Uniform{1..deepest}, deepest R by
    default)."""
    n, k, r = opts.symbols, opts.queries, opts.recurrences
    deepest = r if deepest is None else deepest
    loops = opts.depth_given == "loops"
    order = torch.argsort(torch.rand(batch, n, generator=generator), dim=1)
    f = torch.empty_like(order).scatter_(1, order, order.roll(-1, dims=1))  # one cycle through all n
    x = torch.randint(0, n, (batch, k), generator=generator)
    d = (
        torch.randint(1, deepest + 1, (batch, k), generator=generator)
        if depth is None
        else torch.full((batch, k), depth)
    )
    orbit = [x]
    for _ in range(max(r, int(d.max()))):
        orbit.append(torch.gather(f, 1, orbit[-1]))
    orbit = torch.stack(orbit, dim=2)  # [B, K, max(R, d) + 1]: f^t(x)
    tokens = torch.cat([f, n + (x if loops else x * r + (d - 1))], dim=1)
    labels = torch.full(tokens.shape, IGNORE)
    labels[:, n:] = torch.gather(orbit, 2, d[..., None])[..., 0]
    step_labels = torch.full((*tokens.shape, r), IGNORE)
    steps = torch.arange(1, r + 1)[None, None].expand(batch, k, r)  # [B, K, R]
    step_labels[:, n:] = torch.gather(orbit, 2, steps if loops else torch.minimum(steps, d[..., None]))
    return {"tokens": tokens, "labels": labels, "step_labels": step_labels, "depth": d}


def align(model: GRTModel, opts) -> None:
    """Slot i's position embedding = a fixed rotation of symbol i's embedding; query (x, d)'s
    (or x's) embedding gains symbol x's (initialisation only)."""
    n, r = opts.symbols, opts.recurrences if opts.depth_given == "query" else 1
    generator = torch.Generator().manual_seed(opts.seed)
    rotation = torch.linalg.qr(torch.randn(opts.dim, opts.dim, generator=generator))[0]
    with torch.no_grad():
        tok = model.tok_embeddings.weight
        model.pos_embeddings.weight[:n] = opts.align * tok[:n] @ rotation
        tok[n:] += tok[:n].repeat_interleave(r, dim=0)


def train(row: str, steps: int, opts) -> tuple[GRTModel, list]:
    torch.manual_seed(opts.seed)
    model = GRTModel(model_args(row, opts))
    with torch.no_grad():
        model.init_weights()
    if opts.align:
        align(model, opts)
    optimizer = torch.optim.AdamW(model.parameters(), lr=opts.lr, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = max(1, min(200, steps // 10))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * s / steps)))
    )
    generator = torch.Generator().manual_seed(opts.seed)
    model.train()
    log, start = [], time.perf_counter()
    ramp = opts.depth_curriculum * steps  # the deepest problem grows from 1 to R over these steps
    for step in range(1, steps + 1):
        deepest = min(opts.recurrences, 1 + int((opts.recurrences - 1) * step / ramp)) if ramp else None
        batch = problems(opts, opts.batch, generator, deepest=deepest)
        out = model(batch["tokens"], step_labels=batch["step_labels"])  # r sampled by the model
        loss = grt_loss(out, batch["labels"]) / (batch["labels"] != IGNORE).sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 100 == 0 or step == steps:
            log.append((step, round(loss.item(), 4), round(time.perf_counter() - start, 1)))
            print(f"{row} step {step} loss {loss.item():.4f} {log[-1][2]:.0f} s", flush=True)
    return model, log


@torch.no_grad()
def evaluate(model: GRTModel, opts) -> dict:
    """Accuracy by depth x r (r = 0..2R, or 0..R for a model with a module per step; the dense
    row: its one depth), mean arrival, and for r = 1..R whether step r's readout says
    f^min(r, d)(x), its per-step target (where a procedure that stalls stops). When the loops
    give the depth: problems of every depth the model can run (to min(2R, N - 1)), each one's
    answer read at r = d (`at_loops`); an answer is no fixed point there, so no arrival."""
    model.eval()
    generator = torch.Generator().manual_seed(opts.seed + 1000)
    deepest = 2 * opts.recurrences if model.model_args.extrapolates else opts.recurrences
    depths = list(range(deepest + 1)) if model.recurrence is not None else [None]
    loops = opts.depth_given == "loops"
    out = {}
    last = min(deepest, opts.symbols - 1) if loops else opts.recurrences  # f^N(x) = x: no deeper than N - 1
    for depth in range(1, last + 1):
        batch = problems(opts, opts.eval_sequences, generator, depth)
        answers, queries = batch["labels"][:, opts.symbols :], slice(opts.symbols, None)
        predicted = torch.stack([model(batch["tokens"], num_recurrences=r)[:, queries].argmax(-1) for r in depths])
        right = (predicted == answers).flatten(1)  # [depths, queries]
        entry = {"accuracy": right.float().mean(1).tolist()}
        if loops:
            entry["at_loops"] = entry["accuracy"][depth]
        elif model.recurrence is not None:
            targets = batch["step_labels"][:, queries].movedim(-1, 0)  # [R, B, K]: f^min(t, d)(x)
            says = predicted[1 : opts.recurrences + 1] == targets[: len(depths) - 1]
            entry["step_accuracy"] = says.flatten(1).float().mean(1).tolist()  # r = 1..R
            # eval-task's arrival: the first r right at every deeper r
            stays = right.flip(0).cumprod(0).flip(0).bool()
            arrived = stays.any(0)
            first = stays.float().argmax(0)
            entry["arrival"] = first[arrived].float().mean().item() if arrived.any() else None
            entry["arrived"] = arrived.float().mean().item()
        out[str(depth)] = entry
    return out


@torch.no_grad()
def evaluate_halting(model: GRTModel, opts) -> tuple[list[dict], HaltingProbe | None]:
    """Each rule of HALTING (and Ouro's Q-exit at each of OURO_EXIT, for a model with an exit
    gate) on fresh problems of depths drawn uniformly from 1..R, at most R steps: accuracy, the
    mean steps of the query positions (by problem depth), and the steps saved against the
    smallest fixed r as accurate (eval-task's halting summary); and the wall-clock of each
    halted forward over the fixed r = R forward's on the same batch (the same process, one
    thread: a ratio, not a speed). Also returns the learned rule's fitted probe (None where not
    fitted), which the cached decode's export holds."""
    model.eval()
    generator = torch.Generator().manual_seed(opts.seed + 2000)
    batch = problems(opts, opts.eval_sequences, generator)
    queries = slice(opts.symbols, None)
    answers, depths = batch["labels"][:, queries].flatten(), batch["depth"].flatten().tolist()
    fixed = {}
    for r in range(1, opts.recurrences + 1):
        start = time.perf_counter()
        predicted = model(batch["tokens"], num_recurrences=r)[:, queries].argmax(-1).flatten()
        fixed_seconds = time.perf_counter() - start  # r = R's, the last, is the one compared
        fixed[r] = (predicted == answers).tolist()
    correct = [{r: fixed[r][q] for r in fixed} for q in range(len(answers))]
    rows = []
    exits = [("ouro-exit", q) for q in OURO_EXIT] if model.exit_gate is not None else []
    probe, fit = learned_probe(model, opts) if opts.probe_steps else (None, None)
    learned = [(LEARNED_RULE, x) for x in LEARNED] if opts.probe_steps else []
    # The queries halt, the table they read runs every step; Ouro's exit has no such mask (None).
    runs = [(rule, x, "full") for rule, x in [*HALTING, *learned]] + [(rule, x, None) for rule, x in exits]
    if opts.context_halts:  # the table's tokens halting by the rule too: what the queries lose
        runs += [(rule, x, "halts") for rule, x in [*HALTING, *learned]]
    for rule, threshold, context in runs:
        may_halt = torch.arange(batch["tokens"].shape[1]) >= opts.symbols if context == "full" else None
        try:
            if probe is None and rule == LEARNED_RULE:
                raise ValueError(fit)  # the model's reason
            start = time.perf_counter()
            logits, steps = halted(model, batch["tokens"], rule, threshold, opts.recurrences, probe, may_halt)
            elapsed = time.perf_counter() - start
        except ValueError as refused:  # the model's own rule: MoR routes itself; `gate` needs a gate
            rows.append({"rule": rule, "threshold": threshold, "context": context, "refused": str(refused)})
            continue
        right = (logits[:, queries].argmax(-1).flatten() == answers).tolist()
        scored = list(zip(right, steps[:, queries].flatten().float().tolist()))
        row = halting_summary(depths, scored, correct, rule, threshold, tolerance=opts.halting_tolerance)
        row["context"] = context
        row["every_token_mean_steps"] = steps.float().mean().item()  # the table's tokens too
        row["time_vs_fixed_R"] = elapsed / fixed_seconds
        if rule == LEARNED_RULE:
            row["probe"] = fit
        rows.append(row)
    return rows, probe


def learned_probe(model: GRTModel, opts) -> tuple[HaltingProbe | None, dict | str]:
    """(the learned rule's probe, fitted to the frozen model for --probe-steps on fresh problems
    of depths 1..R (the query positions' readouts, at R steps), its fit: steps, last loss,
    seconds); or (None, the model's reason for refusing the rule)."""
    generator = torch.Generator().manual_seed(opts.seed + 4000)

    def batches():
        while True:
            tokens = problems(opts, opts.batch, generator)["tokens"]
            positions = torch.zeros(tokens.shape, dtype=torch.bool)
            positions[:, opts.symbols :] = True
            yield tokens, positions

    start = time.perf_counter()
    try:
        with torch.random.fork_rng():  # the probe's initialisation: the same at every scoring of these weights
            torch.manual_seed(opts.seed + 4000)
            probe, log = fit_halting_probe(model, batches(), opts.probe_steps, opts.recurrences)
    except ValueError as refused:  # a model that chooses its own steps (MoR) refuses it before any fitting
        return None, str(refused)
    return probe, {"steps": opts.probe_steps, "loss": log[-1][1], "seconds": round(time.perf_counter() - start, 1)}


@torch.no_grad()
def cached_answers(model: GRTModel, opts, rules: list[tuple[str, float, str]], probe=None) -> list[dict]:
    """Wall-clock per answer as a deployed model answers a stream of queries: the exported
    model (its remote code and KV cache, grt_titan/hf/remote/) prefills each sequence's table,
    then takes its queries one token at a time (batch 1), each answered by that decode step,
    at each fixed r = 1..R and under each of `rules` (rule, threshold, its context: "full" where
    the table is prefilled at full depth, under the rule at its threshold that never halts,
    `never_halts`; "halts": under the rule; the learned rule reads `probe`, which the export
    holds): accuracy, mean steps of the query tokens, and
    seconds per answer (the decode steps only; the first sequence untimed)."""
    from grt_titan.analysis.task_eval import cached_model
    from grt_titan.hf.convert import write_hf_folder
    from grt_titan.hf.remote.modeling_grt import GRTCache

    with tempfile.TemporaryDirectory(prefix="depth_pays_") as folder:
        write_hf_folder(
            Path(folder) / "hf", model.state_dict(), model.model_args, write_tokenizer=False, halting_probe=probe
        )
        hf = cached_model(Path(folder) / "hf")
    batch = problems(opts, opts.cached_sequences + 1, torch.Generator().manual_seed(opts.seed + 3000))
    n, depths = opts.symbols, batch["depth"][1:].flatten().tolist()
    runs = [(f"r = {r}", {"num_recurrences": r}, None) for r in range(1, opts.recurrences + 1)]
    for rule, x, context in rules:
        row, call = {"rule": rule, "threshold": x, "context": context}, {"halting": rule, "halting_threshold": x}
        # The table at full depth: its prefill under the same rule (one cache layout) never halting.
        never = {"halting": rule, "halting_threshold": never_halts(rule)}
        runs.append((halting_label(row), call, never if context == "full" else None))

    def answer(tokens: torch.Tensor, call: dict, prefill: dict | None) -> tuple[list[int], list[int], float]:
        """One sequence: its table prefilled (by `prefill`'s call, else `call`), then each query
        one decode step; (answers, steps, s)."""
        cache = GRTCache(hf.config, "per_step")
        table = tokens[None, :n]
        hf(table, past_key_values=cache, cache_slots=torch.arange(n), logits_to_keep=1, **(prefill or call))
        said, steps, start = [], [], time.perf_counter()
        for t in range(n, n + opts.queries):
            at = torch.tensor([t])
            out = hf(tokens[None, t : t + 1], past_key_values=cache, cache_slots=at, position_ids=at[None], **call)
            said.append(int(out.logits[0, -1].argmax()))
            if out.recurrence_depths is not None:
                steps.append(int(out.recurrence_depths[0, -1]))
        return said, steps, time.perf_counter() - start

    rows = []
    for name, call, prefill in runs:
        answer(batch["tokens"][0], call, prefill)  # a warm-up, untimed
        right, steps, seconds = [], [], 0.0
        for tokens, answers in zip(batch["tokens"][1:], batch["labels"][1:, n:]):
            said, token_steps, elapsed = answer(tokens, call, prefill)
            right += [s == int(a) for s, a in zip(said, answers)]
            steps += token_steps
            seconds += elapsed
        mean = sum(steps) / len(steps) if steps else float(call.get("num_recurrences", 0))
        by_depth = {}
        for d, s in zip(depths, steps):
            by_depth.setdefault(d, []).append(s)
        rows.append(
            {
                "decode": name,
                "accuracy": sum(right) / len(right),
                "mean_steps": mean,
                "steps_by_depth": {str(d): sum(v) / len(v) for d, v in sorted(by_depth.items())},
                "seconds_per_answer": seconds / len(right),
            }
        )
    return rows


def halted(model: GRTModel, tokens: torch.Tensor, rule: str, threshold: float, depth: int, probe=None, may_halt=None):
    """(logits, each token's steps) of a per-token halting rule (only the `may_halt` tokens
    halting, where given), or of Ouro's Q-exit."""
    if rule != "ouro-exit":
        probe = probe if rule == LEARNED_RULE else None
        return model.forward_with_halting(tokens, rule, threshold, probe=probe, may_halt=may_halt)
    h_pre = model.prelude(model.embed(tokens), model.freqs_cis)
    return q_exit(model, model.recurrence(h_pre, model.freqs_cis, depth, all_states=True).step_states, threshold)


def run_row(row: str, steps: int, opts) -> dict:
    """Train and score one row, or reuse `--out/ROW` when it ran these steps under these
    options: its saved weights (model.pt) are scored again."""
    done, weights = opts.out / row / "result.json", opts.out / row / "model.pt"
    finished = json.loads(done.read_text()) if done.exists() else {}
    options = {name: getattr(opts, name) for name in TRAINING_OPTIONS}
    # results of before --depth-given and --gate-bias-init
    saved = finished.get("options") and {"depth_given": "query", "gate_bias_init": None, **finished["options"]}
    if (finished.get("steps"), saved) == (steps, options) and weights.exists():
        model = GRTModel(model_args(row, opts))
        model.load_state_dict(torch.load(weights))
        result = finished
    else:
        start = time.perf_counter()
        model, log = train(row, steps, opts)
        weights.parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), weights)
        elapsed = round(time.perf_counter() - start, 1)
        result = {"row": row, "steps": steps, "options": options, "train_s": elapsed, "log": log}
    nparams, flops = model.model_args.get_nparams_and_flops(model, opts.symbols + opts.queries)
    result |= {"params": nparams, "train_flops_per_token": flops, "depths": evaluate(model, opts)}
    result["eval_r"] = model.model_args.num_recurrences if model.recurrence is not None else None
    if model.recurrence is not None and model.model_args.num_recurrences > 1 and opts.depth_given == "query":
        result["halting"], probe = evaluate_halting(model, opts)
        rules = [(h["rule"], h["threshold"], h["context"]) for h in result["halting"] if "refused" not in h]
        rules = [run for run in rules if run[0] != "ouro-exit"]  # Ouro's exit is the export's own objective
        if opts.cached_sequences and rules:
            result["cached"] = cached_answers(model, opts, rules, probe)
    done.write_text(json.dumps(result, indent=1))
    return result


def table(result: dict) -> list[str]:
    depths = result["depths"]
    columns = len(next(iter(depths.values()))["accuracy"])
    head = ["depth", *(f"r={r}" for r in range(columns))] if columns > 1 else ["depth", "accuracy"]
    arrivals = "arrival" in next(iter(depths.values()))  # none where the loops give the depth
    lines = ["| " + " | ".join(head + (["mean arrival (share arrived)"] if arrivals else [])) + " |"]
    lines.append("|" + "---|" * (len(head) + arrivals))
    for depth, entry in depths.items():
        cells = [f"{a:.2f}" for a in entry["accuracy"]]
        if arrivals:
            arrival = "-" if entry["arrival"] is None else f"{entry['arrival']:.2f}"
            cells.append(f"{arrival} ({entry['arrived']:.2f})")
        lines.append(f"| {depth} | " + " | ".join(cells) + " |")
    return lines


def step_table(result: dict) -> list[str]:
    """Step t's readout against its per-step target f^min(t, d)(x), t = 1..R."""
    depths = result["depths"]
    steps = len(next(iter(depths.values())).get("step_accuracy", []))
    if not steps:  # dense, or a result of before step_accuracy
        return []
    lines = ["Step t's readout says f^min(t, d)(x), its per-step target:", ""]
    lines += ["| depth | " + " | ".join(f"t={t}" for t in range(1, steps + 1)) + " |", "|---|" + "---|" * steps]
    lines += [f"| {d} | " + " | ".join(f"{a:.2f}" for a in e["step_accuracy"]) + " |" for d, e in depths.items()]
    return lines + [""]


def summary(results: dict[str, dict], opts) -> str:
    head = f"N = {opts.symbols} symbols, K = {opts.queries} queries, R = {opts.recurrences}, align {opts.align}"
    head += "" if opts.gate_bias_init is None else f", gate bias {opts.gate_bias_init}"
    lines = [
        head + f", depth curriculum {opts.depth_curriculum}, seed {opts.seed}, depth given by {opts.depth_given}",
        "",
    ]
    for row, result in results.items():
        lines += [f"## {row}: {result['params']:,} parameters, {result['steps']} steps, {result['train_s']:.0f} s", ""]
        lines += table(result) + [""] + step_table(result)
        deep = [e["accuracy"] for d, e in result["depths"].items() if 4 <= int(d) <= opts.recurrences]
        if opts.depth_given == "loops":
            lines += loops_lines(result, opts)
        elif deep and len(deep[0]) > 1:  # none when R < 4
            r1, r_big = (sum(a[r] for a in deep) / len(deep) for r in (1, opts.recurrences))
            lines += [f"depth >= 4: r = 1 {r1:.3f}, r = R {r_big:.3f}, rise {r_big - r1:+.3f}", ""]
        elif deep:
            lines += [f"depth >= 4: {sum(a[0] for a in deep) / len(deep):.3f}", ""]
        if "halting" in result:
            lines += halting_lines(result["halting"])
        if "cached" in result:
            lines += cached_lines(result["cached"], opts)
    return "\n".join(lines[:2] + overview(results, opts) + [""] + lines[2:])


def loops_lines(result: dict, opts) -> list[str]:
    """Each depth's answer read at r = d loops, and the mean beyond R (extrapolation)."""
    at = {int(d): e["at_loops"] for d, e in result["depths"].items()}
    cells = ", ".join(f"{d}{'*' if d > opts.recurrences else ''}: {a:.3f}" for d, a in at.items())
    beyond = [a for d, a in at.items() if d > opts.recurrences]
    mean = f"; depths beyond R = {opts.recurrences} (*): {sum(beyond) / len(beyond):.3f}" if beyond else ""
    return [f"Loops = depth (the answer to depth d read at r = d): {cells}{mean}", ""]


def halting_lines(halting: list[dict]) -> list[str]:
    scored = [h for h in halting if "refused" not in h]
    reasons: dict[str, list[str]] = {}  # one line per refusal, the rules it covers first
    for h in halting:
        if "refused" in h:
            reasons.setdefault(h["refused"], []).append(halting_label(h))
    refused = [f"{', '.join(rules)}: {reason}" for reason, rules in reasons.items()]
    lines = []
    if scored:
        fixed = ", ".join(f"r = {r}: {a:.3f}" for r, a in scored[0]["fixed_accuracy"].items())
        lines += ["Halting on a uniform mix of depths 1..R (at most R steps; steps of the query positions):", ""]
        lines += [halting_table(scored), "", f"Fixed depth on the same queries: {fixed}.", ""]
        losses = [line for line in map(halting_loss_line, scored) if line]
        lines += [*losses, ""] if losses else []
        every = ", ".join(f"{halting_label(h)}: {h['every_token_mean_steps']:.2f}" for h in scored)
        lines += [f"Mean steps of every token (the table's too): {every}.", ""]
        fit = next((h["probe"] for h in scored if "probe" in h), None)  # the learned rule's, one per row
        if all("time_vs_fixed_R" in h for h in scored):  # results of before the timing have none
            times = ", ".join(f"{halting_label(h)}: {h['time_vs_fixed_R']:.2f}x" for h in scored)
            fitted = f"; the learned rule's probe fitted in {fit['seconds']:.0f} s" if fit else ""
            lines += [f"Wall-clock of the halted forward over the fixed r = R forward's: {times}{fitted}.", ""]
        if fit:
            lines += [
                f"The learned rule's probe: fitted for {fit['steps']} steps to the frozen model, "
                f"last loss {fit['loss']:.4f}.",
                "",
            ]
    if refused:
        lines += ["Halting rules the model refuses: " + "; ".join(refused), ""]
    return lines


def cached_lines(rows: list[dict], opts) -> list[str]:
    """The cached decode's table: each fixed r and rule, against fixed r = R and against the
    smallest fixed r at least as accurate."""
    fixed = {int(row["decode"][4:]): row for row in rows if row["decode"].startswith("r = ")}
    deepest = fixed[max(fixed)]
    lines = [
        f"Cached decoding, batch 1, {opts.cached_sequences} sequences (each query one decode step, exported model):",
        "",
        "| decode | accuracy | mean steps | steps by problem depth | ms / answer | / fixed r = R "
        "| fixed r as accurate: its ms / answer, this over it |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        equal = min((r for r, f in fixed.items() if f["accuracy"] >= row["accuracy"]), default=None)
        versus = (
            "none"
            if equal is None
            else (
                f"r = {equal}: {1e3 * fixed[equal]['seconds_per_answer']:.2f}, "
                f"{row['seconds_per_answer'] / fixed[equal]['seconds_per_answer']:.2f}x"
            )
        )
        by_depth = ", ".join(f"{d}: {v:.2f}" for d, v in row["steps_by_depth"].items()) or "-"
        lines.append(
            f"| {row['decode']} | {row['accuracy']:.3f} | {row['mean_steps']:.2f} | {by_depth} "
            f"| {1e3 * row['seconds_per_answer']:.2f} | {row['seconds_per_answer'] / deepest['seconds_per_answer']:.2f}x "
            f"| {versus} |"
        )
    return lines + [""]


def overview(results: dict[str, dict], opts) -> list[str]:
    """One line per row at equal training FLOPs: accuracy by depth at the row's own depth
    (R; unlooped: 1; dense: its one; r = d where the loops give the depth), depth >= 4 there,
    and, where the loops give the depth, beyond R."""
    loops = opts.depth_given == "loops"
    R = opts.recurrences
    depths = range(1, max(int(d) for result in results.values() for d in result["depths"]) + 1)
    head = "| row | parameters | steps | train s | depth at eval | " + " | ".join(f"d={d}" for d in depths)
    head += f" | depth 4..{R} |" + (" beyond R |" if loops else "")
    lines = [head, "|---|---|---|---|---|" + "---|" * (len(depths) + 1 + loops)]
    for row, result in results.items():
        columns = len(result["depths"]["1"]["accuracy"])
        r = result.get("eval_r", R if columns > 1 else None)  # a result of before eval_r
        column = 0 if r is None else r  # the dense row's one column; r = 0 is column 0
        entries = result["depths"]
        acc = {
            d: entries[str(d)]["at_loops"] if loops else entries[str(d)]["accuracy"][column]
            for d in depths
            if str(d) in entries  # a row with a module per step runs no deeper than R
        }
        cells = " | ".join(f"{acc[d]:.2f}" if d in acc else "-" for d in depths)
        means = [[a for d, a in acc.items() if 4 <= d <= R]] + ([[a for d, a in acc.items() if d > R]] if loops else [])
        means = " | ".join(f"{sum(m) / len(m):.3f}" if m else "-" for m in means)
        at = "r = d" if loops else "its own" if r is None else f"r = {r}"
        lines.append(
            f"| {row} | {result['params']:,} | {result['steps']} | {result['train_s']:.0f} | {at} | {cells} | {means} |"
        )
    return lines


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", nargs="+", choices=ROWS, help="default: every row (--depth-given loops: LOOPS_ROWS)")
    parser.add_argument("--steps", type=int, default=3000, help="grt_steps' steps; the FLOP budget of every row")
    parser.add_argument("--symbols", type=int, default=12)
    parser.add_argument("--queries", type=int, default=16)
    parser.add_argument("--recurrences", type=int, default=6)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--dense-layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--align", type=float, default=1.0)
    parser.add_argument(
        "--gate-bias-init",
        type=float,
        default=None,
        help="the gate's last bias at initialisation, every gated row (default: the model's, the paper's +4: "
        "g = 0.98, each step keeps the state); -4 starts the gate near overwriting",
    )
    parser.add_argument(
        "--depth-curriculum",
        type=float,
        default=0.0,
        help="share of each row's steps over which the deepest problem grows from 1 to R (0: off)",
    )
    parser.add_argument(
        "--depth-given",
        choices=("query", "loops"),
        default="query",
        help="query: a query token names (x, d); loops: it names x, step t learns f^t(x), and depth d is "
        f"asked by running r = d loops, beyond R too (rows {', '.join(LOOPS_ROWS)})",
    )
    parser.add_argument("--eval-sequences", type=int, default=256)
    parser.add_argument(
        "--cached-sequences",
        type=int,
        default=32,
        help="sequences whose queries the exported model answers one decode step at a time with its KV cache, "
        "at each fixed r and halting rule: seconds per answer (0: off)",
    )
    parser.add_argument(
        "--probe-steps",
        type=int,
        default=300,
        help="steps fitting the learned halting rule's probe to each trained recurrent row (0: the rule is not scored)",
    )
    parser.add_argument(
        "--context-halts",
        action="store_true",
        help="also score each halting rule with the table's tokens halting by it too (prefilled under the rule in "
        "the cached decode), not only the queries: what the queries lose reading a table that halted early",
    )
    parser.add_argument(
        "--halting-tolerance",
        type=float,
        default=HALTING_TOLERANCE,
        help="accuracy a halting rule may lose against the most accurate fixed r and still count its steps as "
        f"saved (default {HALTING_TOLERANCE:g}, eval-task's); beyond it a line says the rule lost answers",
    )
    parser.add_argument("--parallel", type=int, default=1, help="rows trained at once, one process and thread each")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def plan(opts) -> dict[str, int]:
    """Each row's steps at grt_steps' training FLOPs over --steps."""
    tokens = opts.symbols + opts.queries
    costs = {}
    for row in ROWS:
        with torch.device("meta"):
            model = GRTModel(model_args(row, opts))
        costs[row] = model.model_args.get_nparams_and_flops(model, tokens)
    return equal_flop_steps(costs, "grt_steps", opts.steps, opts.rows)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    opts = parser.parse_args(argv)
    opts.rows = opts.rows or list(LOOPS_ROWS if opts.depth_given == "loops" else ROWS)
    if opts.depth_given == "loops":
        if other := [row for row in opts.rows if row not in LOOPS_ROWS]:
            parser.error(
                f"--depth-given loops: rows {', '.join(other)} have no target at every step (the answer alone, "
                f"or one depth); allowed: --rows among {', '.join(LOOPS_ROWS)}"
            )
        if opts.depth_curriculum:
            parser.error("--depth-given loops takes no --depth-curriculum: every step has its target at every depth")
    torch.set_num_threads(1)
    steps = plan(opts)
    if opts.parallel > 1:  # spawned: a forked torch may hang on its thread pools
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(
            opts.parallel, mp_context=spawn, initializer=torch.set_num_threads, initargs=(1,)
        ) as pool:
            list(pool.map(run_row, opts.rows, [steps[row] for row in opts.rows], [opts] * len(opts.rows)))
    else:
        for row in opts.rows:
            run_row(row, steps[row], opts)
    results = {p.parent.name: json.loads(p.read_text()) for p in sorted(opts.out.glob("*/result.json"))}
    given = {row: r.get("options", {}).get("depth_given", "query") for row, r in results.items()}
    results = {row: r for row, r in results.items() if given[row] == opts.depth_given}  # one way of asking
    text = summary({row: results[row] for row in ROWS if row in results}, opts)
    (opts.out / "summary.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
