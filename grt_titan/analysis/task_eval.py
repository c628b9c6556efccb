"""`grt-titan eval-task MODEL --data FILE.jsonl`: exact-match accuracy of greedy completions
by problem depth x recurrence r, and each problem's arrival step (docs/tasks.md).

A greedy completion equals the reference exactly when, fed the reference, the model's argmax
at every completion position is the reference's next token (greedy decoding follows the
reference until its first miss, and there it leaves it). So one forward per record and depth
scores it: the prompt and the completion, at ``num_recurrences = r``, for r = 0..max depth
(default 2R where the model extrapolates, else R; a dense model has its one depth). The
arrival step of a problem is the first r from which it is right at every deeper r scored:
its distribution by depth is the ignition curve (arXiv 2608.03263). A record of many answers
(``turns``) is scored answer by answer, each after the reference answers before it (`answers`).

`--halting RULE:THRESHOLD` scores the same completions with the positions that predict them
halting by a per-token rule (grt_titan/model/halting/rules.py, at most R steps) and the context
they read (every position before) at full depth, as a deployed model prefills it: accuracy and
the steps the completion's tokens ran, by problem depth, beside the smallest fixed r that is as
accurate. `--context-halts` also scores each rule with every token halting by it.
`learned:THRESHOLD` is the learned rule: its probe is first fitted to the frozen model on the
completions of `--probe-data` (grt_titan/model/halting/probe.py; no answer is read, the
model's own readouts are the targets).
`--wall-clock N` (MODEL an export) decodes the first N records as a user would, greedily with
the export's model and KV cache, one at a time, at each fixed r and under each rule: seconds
per answer.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from grt_titan.data.records import ChatTemplate, Record, ordinary_batch, read_records
from grt_titan.model.halting.rules import HALTING_RULES, LEARNED_RULE
from grt_titan.run_reader import OverridesParser, check_overrides_have_config

# The learned rule's fitted probe, written to `--out` for `grt-titan export-hf --halting-probe`.
HALTING_PROBE_FILE = "halting_probe.pt"
# `--halting RULE:THRESHOLD`: the exported model's rules and the learned one (`--probe-data`).
EVAL_RULES = (*HALTING_RULES, LEARNED_RULE)

DENSE = "dense"


def answers(record: Record) -> list[Record]:
    """The answers a record asks for, each scored alone: the record itself, or each turn of a
    record of many answers as a record whose prompt is all the text before its completion (the
    turns before it answered by their references, as teacher forcing reads them)."""
    if record.turns is None:
        return [record]
    out, before = [], ""
    for turn in record.turns:
        out.append(Record(before + turn.prompt, turn.completion, turn.where, turn.meta))
        before += turn.prompt + turn.completion
    return out


def task_records(path: Path) -> list[Record]:
    """The file's answers (`answers`); each must carry its problem depth."""
    out = [answer for record in read_records([path]) for answer in answers(record)]
    if not out:
        raise ValueError(f"{path}: no prompt/completion record")
    for record in out:
        if "depth" not in record.meta:
            raise ValueError(
                f"{record.where}: no 'depth' field; eval-task reports accuracy by problem depth "
                "(`grt-titan task` writes it)"
            )
    return out


def encode(tokenizer, record: Record, vocab_size: int, max_len: int) -> tuple[list[int], int]:
    """(prompt + completion ids, completion length), or ValueError when the model's tokenizer
    does not read the record back, or the model cannot hold it. A chat record is rendered by
    the tokenizer's chat template; its completion is the last assistant turn (with its end)."""
    if record.messages is None:
        prompt, completion = ordinary_batch(tokenizer, [record.prompt, record.completion])
        ids, n = prompt + completion, len(completion)
        reads_back = tokenizer.decode(ids) == record.prompt + record.completion
    else:
        template = ChatTemplate.of(tokenizer, record.where)
        ids, mask = template.encode(record)
        end = max(i for i, counted in enumerate(mask) if counted) + 1  # the last assistant turn's end
        start = end
        while start > 0 and mask[start - 1]:
            start -= 1
        ids, n = ids[:end], end - start  # the turns after it are not scored
        reads_back = template.render(record.messages, False).startswith(tokenizer.decode(ids))
    if not reads_back or max(ids) >= vocab_size:
        raise ValueError(
            f"{record.where}: the model's tokenizer {getattr(tokenizer, 'name', '?')!r} does not read this record "
            f"back (decodes to {tokenizer.decode(ids)[:60]!r}); allowed: data written for the tokenizer the model "
            "was trained with ([model] hf_assets_path)"
        )
    if len(ids) - 1 > max_len:  # the last token is only predicted, never read
        raise ValueError(
            f"{record.where}: {len(ids) - 1} tokens read (the prompt and the completion less its last token) exceed "
            f"the model's max_seq_len = {max_len} (its positions / RoPE table)"
        )
    return ids, n


def depths_to_score(args, max_depth: int | None) -> list[int | None]:
    """r = 0..max depth (default 2R, or R for a model without depths above R); [None] for
    a dense model (its one depth)."""
    if args.n_core_layers == 0:
        if max_depth is not None:
            raise ValueError(f"--max-depth {max_depth}: a dense model (no core) has one depth")
        return [None]
    R = args.num_recurrences
    limit = None if args.extrapolates else R
    if max_depth is None:
        max_depth = 2 * R if limit is None else R
    if max_depth < 0 or (limit is not None and max_depth > limit):
        allowed = f"0 to {limit} (this model holds a module per step up to R)" if limit is not None else ">= 0"
        raise ValueError(f"--max-depth {max_depth}: r beyond what the model can run; allowed: {allowed}")
    return list(range(max_depth + 1))


@torch.no_grad()
def score(model, encoded: list[tuple[list[int], int]], depths, batch_size: int, bar=None) -> list[dict]:
    """Per record, per depth: whether the greedy completion is exact."""
    device = next(model.parameters()).device
    correct = [{} for _ in encoded]
    for batch, ids in _batches(encoded, batch_size, device):
        for r in depths:
            predicted = model(ids[:, :-1], num_recurrences=r).argmax(-1)  # at position t: token t + 1
            for row, i in enumerate(batch):
                correct[i][r] = torch.equal(predicted[row, answered(ids, encoded[i][1])], ids[row, -encoded[i][1] :])
        if bar is not None:
            bar.update(len(batch))
    return correct


def answered(ids: torch.Tensor, n: int) -> slice:
    """The positions whose next-token predictions are the last `n` tokens of `ids` [b, length]."""
    length = ids.shape[1]
    return slice(length - n - 1, length - 1)


def answering_positions(ids: torch.Tensor, batch: list[int], encoded) -> torch.Tensor:
    """Where each row of `ids` [b, length] (records `batch` of `encoded`) predicts its
    completion, as a bool mask over the inputs `ids[:, :-1]`."""
    positions = torch.zeros(ids[:, :-1].shape, dtype=torch.bool, device=ids.device)
    for row, i in enumerate(batch):
        positions[row, answered(ids, encoded[i][1])] = True
    return positions


def _batches(encoded: list[tuple[list[int], int]], batch_size: int, device, group=None):
    """(record indices, ids [b, length]) of records of one length (and one `group(i)`, where
    given) at a time."""
    by_length = defaultdict(list)
    for i, (ids, _) in enumerate(encoded):
        by_length[len(ids), None if group is None else group(i)].append(i)
    for _, indices in sorted(by_length.items(), key=lambda item: item[0][0]):
        for start in range(0, len(indices), batch_size):
            batch = indices[start : start + batch_size]
            yield batch, torch.tensor([encoded[i][0] for i in batch], device=device)


def parse_halting(text: str) -> tuple[str, float]:
    """`--halting RULE:THRESHOLD`."""
    rule, _, value = text.partition(":")
    try:
        threshold = float(value)
    except ValueError:
        threshold = None
    if rule not in EVAL_RULES or threshold is None:
        raise ValueError(f"--halting {text!r}; allowed: RULE:THRESHOLD with RULE one of {', '.join(EVAL_RULES)}")
    return rule, threshold


def fit_probe(model, encoded, steps: int, batch_size: int) -> tuple[Any, list]:
    """The learned rule's probe, fitted for `steps` batches (cycling through `encoded`) on the
    positions that predict each completion, at the eval depth (the halting calls' maximum; a
    dense model is refused by the fit)."""
    from grt_titan.model.halting.probe import fit_halting_probe

    device = next(model.parameters()).device

    def batches():
        while True:
            for batch, ids in _batches(encoded, batch_size, device):
                yield ids[:, :-1], answering_positions(ids, batch, encoded)

    return fit_halting_probe(model, batches(), steps)


def learned_probe(model, fitting, opts) -> tuple[Any, dict]:
    """(the learned rule's probe fitted on `fitting`, its fit: data, steps, last loss), printed;
    a model that refuses per-token halting (dense, MoR) says so before any fitting."""
    probe, log = fit_probe(model, fitting, opts.probe_steps, opts.batch_size)
    fit = {"data": str(opts.probe_data), "steps": opts.probe_steps, "loss": log[-1][1]}
    print(f"The {LEARNED_RULE} rule's probe: fitted for {opts.probe_steps} steps, last loss {fit['loss']:.4f}")
    return probe, fit


def score_halting(
    model, encoded, rule: str, threshold: float, batch_size: int, probe=None, context: str = "full"
) -> list[tuple[bool, float]]:
    """Per record: whether the greedy completion is exact when the positions that predict it
    halt by `rule` (at most the eval depth; the learned rule reads `probe`) and the positions
    before them run every step (`context` "full"; "halts": they halt by the rule too), and the
    mean steps of the positions that predict it."""
    device = next(model.parameters()).device
    scored: list = [None] * len(encoded)
    for batch, ids in _batches(encoded, batch_size, device):
        may_halt = answering_positions(ids, batch, encoded) if context == "full" else None
        logits, steps = model.forward_with_halting(ids[:, :-1], rule, threshold, probe=probe, may_halt=may_halt)
        predicted = logits.argmax(-1)
        for row, i in enumerate(batch):
            at = answered(ids, encoded[i][1])
            right = torch.equal(predicted[row, at], ids[row, -encoded[i][1] :])
            scored[i] = (right, float(steps[row, at].float().mean()))
    return scored


# How far below the most accurate fixed depth a halting rule may read and still count its steps
# as a saving (`--halting-tolerance`): beyond it the rule lost answers, and says so.
HALTING_TOLERANCE = 0.01


def halting_summary(
    depths: list[int], scored, correct: list[dict], rule: str, threshold: float, tolerance: float = HALTING_TOLERANCE
) -> dict:
    """A halting rule's accuracy and mean steps, overall and by problem depth (`depths`, one per
    scored problem), and the steps it saves against the smallest fixed r >= 1 whose accuracy
    (`correct`: per problem, r -> right) is at least as high, and against the most accurate
    fixed r (which a rule that beats every fixed depth is still measured against). A rule more
    than `tolerance` below that most accurate r saves nothing against it: it lost answers
    (`lost_accuracy`, and `halting_loss_line` says so)."""
    by_depth = defaultdict(list)
    for depth, result in zip(depths, scored):
        by_depth[str(depth)].append(result)
    accuracy = sum(right for right, _ in scored) / len(scored)
    steps = sum(n for _, n in scored) / len(scored)
    fixed = {r: sum(c[r] for c in correct) / len(correct) for r in correct[0] if r}
    equal = min((r for r, a in fixed.items() if a >= accuracy), default=None)
    best = min(fixed, key=lambda r: (-fixed[r], r))  # the smallest r of the highest accuracy
    lost = fixed[best] - accuracy
    return {
        "rule": rule,
        "threshold": threshold,
        "accuracy": accuracy,
        "mean_steps": steps,
        "by_depth": {
            d: {"accuracy": sum(r for r, _ in v) / len(v), "mean_steps": sum(n for _, n in v) / len(v)}
            for d, v in sorted(by_depth.items(), key=lambda item: int(item[0]))
        },
        "fixed_accuracy": {str(r): a for r, a in fixed.items()},
        "fixed_r_as_accurate": equal,
        "steps_saved": None if equal is None else 1 - steps / equal,
        "most_accurate_fixed_r": best,
        "steps_saved_vs_most_accurate": None if lost > tolerance else 1 - steps / best,
        "lost_accuracy": lost if lost > tolerance else None,
        "tolerance": tolerance,
    }


def halting_label(row: dict) -> str:
    """A halting row's name: its rule and threshold, and whether the context its answers read
    halted by the rule too (by default it runs every step)."""
    context = ", context halting too" if row.get("context") == "halts" else ""
    return f"{row['rule']} {row['threshold']:g}{context}"


def halting_loss_line(row: dict) -> str | None:
    """The one line that says a rule lost answers (None if it did not): its accuracy against
    the most accurate fixed depth's, beyond the tolerance, so its steps are no saving."""
    if row.get("lost_accuracy") is None:
        return None
    best = row["most_accurate_fixed_r"]
    return (
        f"halting {halting_label(row)} lost answers: {row['accuracy']:.3f} against "
        f"{row['fixed_accuracy'][str(best)]:.3f} at fixed r = {best}, {row['lost_accuracy']:.3f} below "
        f"(tolerance {row['tolerance']:g}, --halting-tolerance); its {row['mean_steps']:.2f} steps are no saving"
    )


def halting_table(rows: list[dict]) -> str:
    lines = [
        "| halting | accuracy | mean steps | steps by problem depth | fixed r as accurate | steps saved "
        "| most accurate fixed r (accuracy): steps saved |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        depths = ", ".join(f"{d}: {v['mean_steps']:.2f}" for d, v in row["by_depth"].items())
        saved = "-" if row["steps_saved"] is None else f"{row['steps_saved']:.0%}"
        equal = "none" if row["fixed_r_as_accurate"] is None else str(row["fixed_r_as_accurate"])
        best = row["most_accurate_fixed_r"]
        versus = f"{best} ({row['fixed_accuracy'][str(best)]:.3f}): " + (
            f"{row['steps_saved_vs_most_accurate']:.0%}"
            if row.get("lost_accuracy") is None
            else f"lost {row['lost_accuracy']:.3f}, no saving"
        )
        lines.append(
            f"| {halting_label(row)} | {row['accuracy']:.3f} | {row['mean_steps']:.2f} | {depths} "
            f"| {equal} | {saved} | {versus} |"
        )
    return "\n".join(lines)


def cached_model(folder: str | Path, device: str = "cpu"):
    """The transformers model of an export folder (its remote code: the model and KV cache a
    user decodes with), quietly (no loading bar)."""
    from transformers.utils import logging as transformers_logging

    from grt_titan.hf.remote.modeling_grt import GRTForCausalLM

    transformers_logging.disable_progress_bar()
    return GRTForCausalLM.from_pretrained(folder).to(device).eval()


def wall_clock(hf_model, encoded, depths: list, rules: list[tuple[str, float]]) -> list[dict]:
    """Each record's greedy completion decoded with the KV cache, batch 1, at each fixed r of
    `depths` and under each halting rule (at most the eval depth; the context before the
    answering positions prefilled at full depth, `Generator`'s): accuracy, the mean steps of
    the positions that predict the completion (under a rule), and seconds per answer (one
    untimed decode first)."""
    from grt_titan.analysis.decode import Generator

    device = next(hf_model.parameters()).device

    def decoded(ids: list[int], n: int, halting: dict, r: int | None):
        prompt = torch.tensor([ids[:-n]], device=device)
        decode = Generator(
            hf_model, "per_step", False, 1, prompt.shape[1], n, str(device), halting=halting, num_recurrences=r
        )
        return decode, *decode.run(prompt)

    runs = [("dense" if r is None else f"r = {r}", {}, r) for r in depths]
    runs += [(f"{rule} {x:g}", {"halting": rule, "halting_threshold": x}, None) for rule, x in rules]
    decoded(*encoded[0], *runs[0][1:])  # a warm-up, untimed
    rows = []
    for name, halting, r in runs:
        right, seconds, steps = 0, 0.0, []
        for ids, n in encoded:
            decode, tokens, elapsed = decoded(ids, n, halting, r)
            right += tokens[0].tolist() == ids[-n:]
            seconds += elapsed
            if decode.depths:  # the prompt's last position, then each decoded token but the last
                steps += [decode.depths[0][0, -1].item()] + [d.item() for d in decode.depths[1:]]
        rows.append(
            {
                "decode": name,
                "accuracy": right / len(encoded),
                "mean_steps": sum(steps) / len(steps) if steps else (r if r is not None else None),
                "seconds_per_answer": seconds / len(encoded),
            }
        )
    return rows


def wall_clock_table(rows: list[dict], records: int) -> str:
    fixed = [row for row in rows if row["decode"].startswith("r = ")]
    base = fixed[-1] if fixed else rows[0]  # the deepest fixed r (R), or the dense model
    lines = [
        f"Cached greedy decoding, batch 1, the first {records} records:",
        "",
        f"| decode | accuracy | mean steps | s / answer | / {base['decode']} |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        steps = "-" if row["mean_steps"] is None else f"{row['mean_steps']:.2f}"
        lines.append(
            f"| {row['decode']} | {row['accuracy']:.3f} | {steps} | {row['seconds_per_answer']:.4f} "
            f"| {row['seconds_per_answer'] / base['seconds_per_answer']:.2f}x |"
        )
    return "\n".join(lines)


def arrival_step(correct: dict, depths: list) -> int | None:
    """The first r from which the answer is right at every deeper r scored (None: wrong at the last)."""
    arrival = None
    for r in reversed(depths):
        if not correct[r]:
            break
        arrival = r
    return arrival


def summarize(records: list[Record], correct: list[dict], depths: list, args) -> dict[str, Any]:
    accuracy, arrival, counts = defaultdict(dict), defaultdict(list), defaultdict(int)
    for record, right in zip(records, correct):
        d = str(record.meta["depth"])
        counts[d] += 1
        arrival[d].append(arrival_step(right, depths))
        for r in depths:
            key = DENSE if r is None else str(r)
            accuracy[d][key] = accuracy[d].get(key, 0) + int(right[r])
    for d in accuracy:
        accuracy[d] = {r: n / counts[d] for r, n in accuracy[d].items()}
    order = sorted(accuracy, key=int)
    result = {
        "accuracy": {d: accuracy[d] for d in order},
        "arrival": {d: arrival[d] for d in order},
        "counts": {d: counts[d] for d in order},
        "depths": [DENSE if r is None else r for r in depths],
        "num_recurrences": args.num_recurrences if args.n_core_layers else None,
    }
    if any(record.meta.get("depth_given") == "loops" for record in records):
        # The query does not name its depth: the answer to depth d is the one read after d steps.
        result["at_loops"] = {d: accuracy[d][d] for d in order if d in accuracy[d]}
    return result


def table(result: dict, trained_depths: range | None) -> str:
    R = result["num_recurrences"]
    header = [
        ("dense" if r == DENSE else f"r={r}" + ("*" if R is not None and r > R else "")) for r in result["depths"]
    ]
    lines = [
        "| depth | n | " + " | ".join(header) + " | mean arrival |",
        "|---|---|" + "---|" * len(header) + "---|",
    ]
    for d, row in result["accuracy"].items():
        arrived = [a for a in result["arrival"][d] if a is not None]
        mean = f"{sum(arrived) / len(arrived):.2f} ({len(arrived)}/{len(result['arrival'][d])})" if arrived else "-"
        beyond = trained_depths is not None and int(d) not in trained_depths
        cells = " | ".join(f"{row[str(r)]:.2f}" for r in result["depths"])  # "dense" or "<r>"
        lines.append(f"| {d}{'*' if beyond else ''} | {result['counts'][d]} | {cells} | {mean} |")
    notes = []
    if "at_loops" in result:
        cells = ", ".join(f"{d}: {a:.2f}" for d, a in result["at_loops"].items())
        notes.append(f"loops = depth (the answer to depth d read at r = d): {cells}")
    if R is not None and any(r != DENSE and r > R for r in result["depths"]):
        notes.append(f"r=N*: beyond the trained R = {R} (extrapolation)")
    if trained_depths is not None:
        notes.append(f"depth*: beyond the trained problem depths {trained_depths.start}-{trained_depths.stop - 1}")
    return "\n".join(lines + ([""] + notes if notes else []))


def heatmap(result: dict, path: Path) -> Path:
    from grt_titan.plots import save, task_accuracy_figure

    return save(task_accuracy_figure(result), path)


def build_parser() -> argparse.ArgumentParser:
    p = OverridesParser(
        prog="grt-titan eval-task",
        description="Exact-match accuracy by problem depth x recurrence r, and arrival steps (docs/tasks.md).",
    )
    p.add_argument("model", help="checkpoint step folder (or its checkpoint/ parent) with --config, or an HF export")
    p.add_argument("--config", help="training TOML (or the run's grt_run.json); its overrides may follow")
    p.add_argument("--data", required=True, help="prompt/completion JSONL with 'depth' (grt-titan task --split test)")
    p.add_argument("--max-depth", type=int, help="deepest r scored (default 2R; R for per-step modules)")
    p.add_argument("--trained-depths", help="A-B: problem depths seen in training (rows beyond are marked)")
    p.add_argument("--out", help="folder for task_accuracy.png and eval_task.json")
    p.add_argument("--json", help="write the result here as JSON")
    p.add_argument("--limit", type=int, help="score the first N records")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument(
        "--halting",
        action="append",
        default=[],
        metavar="RULE:THRESHOLD",
        help=f"also score with per-token halting ({', '.join(EVAL_RULES)}; repeatable), e.g. kl:0.001; "
        f"{LEARNED_RULE} needs --probe-data",
    )
    p.add_argument(
        "--probe-data",
        help=f"records whose completions the {LEARNED_RULE} rule's probe is fitted on (the training split, not "
        "--data); their answers are not read",
    )
    p.add_argument("--probe-steps", type=int, default=300, help="batches fitting the probe")
    p.add_argument(
        "--context-halts",
        action="store_true",
        help="also score each --halting rule with every token halting by it, the prompt's too (by default the "
        "prompt before the answering positions runs every step): what the answers lose reading a context that "
        "halted early",
    )
    p.add_argument(
        "--halting-tolerance",
        type=float,
        default=HALTING_TOLERANCE,
        help="accuracy a --halting rule may lose against the most accurate fixed r and still count its steps "
        f"as saved (default {HALTING_TOLERANCE:g}); beyond it a line says the rule lost answers",
    )
    p.add_argument(
        "--wall-clock",
        type=int,
        default=0,
        metavar="N",
        help="also decode the first N records with the exported model's KV cache, batch 1, at r = 1..R and "
        "under each --halting rule: seconds per answer",
    )
    p.add_argument("--no-progress", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    from tqdm import tqdm

    from grt_titan.analysis.load import is_hf_export, load_model
    from grt_titan.data.tasks import parse_depths

    device = opts.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        if opts.wall_clock < 0:
            raise ValueError(f"--wall-clock {opts.wall_clock}; allowed: N >= 1 records (0: off)")
        if opts.wall_clock and not is_hf_export(Path(opts.model)):
            raise ValueError(
                f"--wall-clock decodes with an export's model and KV cache; {opts.model} is no Hugging Face export "
                "(export it first: grt-titan export-hf --checkpoint ... --out DIR; docs/hf_export.md)"
            )
        check_overrides_have_config(opts.config, opts.overrides)  # before the data is read
        trained = parse_depths(opts.trained_depths) if opts.trained_depths else None
        rules = [parse_halting(text) for text in opts.halting]
        learned = any(rule == LEARNED_RULE for rule, _ in rules)
        if learned != bool(opts.probe_data):
            raise ValueError(
                f"--halting {LEARNED_RULE}:X needs --probe-data FILE.jsonl (the records its probe is fitted on)"
                if learned
                else f"--probe-data {opts.probe_data} is read by --halting {LEARNED_RULE}:X only; none is given"
            )
        if opts.probe_steps < 1:
            raise ValueError(f"--probe-steps {opts.probe_steps}; allowed: >= 1")
        if not 0 <= opts.halting_tolerance <= 1:
            raise ValueError(f"--halting-tolerance {opts.halting_tolerance}; allowed: an accuracy in [0, 1]")
        records = task_records(Path(opts.data))[: opts.limit]
        if rules and any(record.meta.get("depth_given") == "loops" for record in records):
            raise ValueError(
                f"--halting on {opts.data}: its records ask depth d by running r = d loops (depth_given = loops), "
                "so a rule that chooses r answers another question; score halting on records whose query names "
                "the depth (grt-titan task --depth-given query)"
            )
        loaded = load_model(opts.model, opts.config, device=device, overrides=opts.overrides)
        args = loaded.args
        depths = depths_to_score(args, opts.max_depth)
        encoded = [encode(loaded.tokenizer, r, args.vocab_size, args.max_seq_len) for r in records]
        if learned:  # as many records as the fit's batches take, at most
            fitting = [
                encode(loaded.tokenizer, r, args.vocab_size, args.max_seq_len)
                for r in task_records(Path(opts.probe_data))[: opts.probe_steps * opts.batch_size]
            ]
    except (ValueError, FileNotFoundError) as e:
        print(f"grt-titan eval-task: error: {e}", file=sys.stderr)
        return 2
    with tqdm(total=len(records), desc="eval-task", unit="problem", disable=opts.no_progress, file=sys.stderr) as bar:
        correct = score(loaded.model, encoded, depths, opts.batch_size, bar)
    result = summarize(records, correct, depths, args)
    result["source"] = {**loaded.source, "data": str(opts.data)}
    print(table(result, trained))
    probe = None
    if rules:
        try:
            probe, fit = learned_probe(loaded.model, fitting, opts) if learned else (None, None)
            contexts = ["full", "halts"] if opts.context_halts else ["full"]
            runs = [(rule, x, context) for context in contexts for rule, x in rules]
            halted = [
                score_halting(
                    loaded.model, encoded, rule, x, opts.batch_size, probe if rule == LEARNED_RULE else None, context
                )
                for rule, x, context in runs
            ]
        except ValueError as e:  # a dense model, MoR, or a gate rule without the gate
            print(f"grt-titan eval-task: error: {e}", file=sys.stderr)
            return 2
        problem_depths = [record.meta["depth"] for record in records]
        result["halting"] = [
            halting_summary(problem_depths, h, correct, rule, x, tolerance=opts.halting_tolerance) | {"context": c}
            for h, (rule, x, c) in zip(halted, runs)
        ]
        for row in result["halting"]:
            if row["rule"] == LEARNED_RULE:
                row["probe"] = fit
        print("\n" + halting_table(result["halting"]))
        for line in filter(None, map(halting_loss_line, result["halting"])):
            print(line)
    if opts.wall_clock:
        timed = encoded[: opts.wall_clock]
        fixed = [r for r in depths if r is None or 1 <= r <= args.num_recurrences]
        exported = [(rule, x) for rule, x in rules if rule != LEARNED_RULE]  # the probe is not in the export
        rows = wall_clock(cached_model(opts.model, device), timed, fixed, exported)
        result["wall_clock"] = {"records": len(timed), "rows": rows}
        print("\n" + wall_clock_table(rows, len(timed)))
    text = json.dumps(result, indent=1, sort_keys=False)
    if opts.json:
        Path(opts.json).write_text(text + "\n")
    if opts.out:
        out = Path(opts.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "eval_task.json").write_text(text + "\n")
        print(f"wrote {heatmap(result, out / 'task_accuracy.png')} and {out / 'eval_task.json'}")
        if probe is not None:  # for `grt-titan export-hf --halting-probe`
            from grt_titan.model.halting.probe import save_halting_probe

            print(f"wrote {save_halting_probe(probe, out / HALTING_PROBE_FILE, fit)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
