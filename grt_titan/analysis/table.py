"""`grt-titan table`: paper table 1 (and figure 5's ladder) from training runs.

    grt-titan table outputs/paper/small_dense outputs/paper/small_grt_seed* \
        --csv table1.csv --ladder-png fig5.png
    grt-titan table outputs/paper        # every run folder below it (each holds grt_run.json)

One row per method and architecture; runs of the same row (several seeds) give the mean,
the sample standard deviation and n of their last validation losses. Columns:

| column | value |
|---|---|
| method | the run's label (`method_name` of its model args, else GRT / dense), plus the method settings in which rows of that label differ: `Heavy-tail Poisson (depth_mean=3.0)` |
| layout | `p+nxR+c` (`1+1x10+1`), dense `12L` |
| unique layers | p + n + c: blocks stored |
| block applications | p + n R + c: blocks run per forward, the paper's isoFLOP count |
| GFLOPs/token | forward FLOPs per token at the eval depth, the args' own formula (eq. 1 for GRT) at the training seq_len |
| params | stored parameters of the model built on the meta device (a tied weight once) |
| val loss | last `validation_metrics/loss` (mean +- std over seeds), its step, n |

Runs trained with `[fault_tolerance]` get a second table below: each replica group's live
groups by step and its steps not committed (grt_titan/analysis/live_groups.py).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grt_titan.analysis import live_groups
from grt_titan.analysis.runs import Run, find_run_dirs, load_run
from grt_titan.model.args import CONFIGURABLE_FIELDS, GRTModelArgs
from grt_titan.model.model import build_meta_model
from grt_titan.run_record import RECORD_NAME
from grt_titan.runtime.atomic_dir import atomic_write_text

# Fields that differ between seeds of one row, not between rows.
SEED_FIELDS = ("depth_seed",)
# What can tell rows of one method apart besides its architecture (the layout and params
# columns): the `[grt]` settings but R (in the layout) and the seed, then the training
# sequence length and steps (figure 6's token budgets).
SETTING_KEYS = tuple(k for k in CONFIGURABLE_FIELDS if k not in SEED_FIELDS + ("num_recurrences",)) + (
    "seq_len",
    "training_steps",
)


def layout(args: GRTModelArgs) -> str:
    if not args.is_recurrent:
        return f"{args.n_prelude_layers + args.n_coda_layers}L"
    return f"{args.n_prelude_layers}+{args.n_core_layers}x{args.num_recurrences}+{args.n_coda_layers}"


def stored_parameters(args: GRTModelArgs) -> int:
    """Parameters of the model built on the meta device; `parameters()` yields a tied weight once."""
    return sum(p.numel() for p in build_meta_model(args).parameters())


@dataclass
class Row:
    method: str
    layout: str
    unique_layers: int
    block_applications: int
    flops_per_token: float  # forward, at the eval depth
    params: int
    runs: list[Run]
    # The method settings in which rows of this method differ (`differing_settings`).
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def title(self) -> str:
        """The method, with the settings that tell it from the other rows of its method."""
        if not self.settings:
            return self.method
        return f"{self.method} ({settings_text(self.settings)})"

    @property
    def scored(self) -> list[Run]:
        return [run for run in self.runs if run.loss is not None]

    @property
    def loss_mean(self) -> float | None:
        return statistics.fmean(r.loss for r in self.scored) if self.scored else None

    @property
    def loss_std(self) -> float | None:
        """Sample standard deviation (n - 1) over seeds; None below two losses."""
        return statistics.stdev(r.loss for r in self.scored) if len(self.scored) > 1 else None

    @property
    def steps(self) -> str:
        steps = sorted({r.loss_step for r in self.scored})
        return "" if not steps else str(steps[0]) if len(steps) == 1 else f"{steps[0]}-{steps[-1]}"

    @property
    def is_dense(self) -> bool:
        return not self.runs[0].args.is_recurrent


def row_key(run: Run) -> str:
    """Runs with the same key are seeds of one row: label, model args but the seed fields,
    sequence length and training steps."""
    args = {k: v for k, v in dataclasses.asdict(run.args).items() if k not in SEED_FIELDS}
    return json.dumps([run.label, args, run.seq_len, run.record.get("training_steps")], sort_keys=True, default=str)


def run_settings(run: Run) -> dict[str, Any]:
    """The run's value of each of `SETTING_KEYS`."""
    values = {k: getattr(run.args, k) for k in SETTING_KEYS if k not in ("seq_len", "training_steps")}
    return {**values, "seq_len": run.seq_len, "training_steps": run.record.get("training_steps")}


def settings_text(settings: dict[str, Any]) -> str:
    """`key=value, ...`; a list without spaces (`[0.5,0.25]`), None as None (the field's default rule)."""

    def text(value: Any) -> str:
        return "[" + ",".join(map(str, value)) + "]" if isinstance(value, (list, tuple)) else str(value)

    return ", ".join(f"{k}={text(v)}" for k, v in settings.items())


def differing_settings(rows: list[Row]) -> None:
    """Set each row's `settings`: the keys of `SETTING_KEYS` whose values differ between the
    rows of its method (label), with this row's values. Rows of a method that differ only
    in architecture (sizes: the layout and params columns show it) get none."""
    by_method: dict[str, list[Row]] = {}
    for row in rows:
        by_method.setdefault(row.method, []).append(row)
    for members in by_method.values():
        values = [run_settings(row.runs[0]) for row in members]
        keys = [k for k in SETTING_KEYS if len({json.dumps(v[k], default=str) for v in values}) > 1]
        for row, v in zip(members, values):
            row.settings = {k: v[k] for k in keys}


def build_rows(runs: list[Run]) -> list[Row]:
    """One row per `row_key`, in the order of each row's first run; each row's `settings`
    name what tells it from the other rows of its method."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(row_key(run), []).append(run)
    rows = []
    for members in groups.values():
        args = members[0].args
        rows.append(
            Row(
                method=members[0].label,
                layout=layout(args),
                unique_layers=args.n_prelude_layers + args.n_core_layers + args.n_coda_layers,
                block_applications=args.unrolled_layers,
                flops_per_token=args.forward_flops_per_token(members[0].seq_len, recurrences=args.eval_depth),
                params=stored_parameters(args),
                runs=members,
            )
        )
    differing_settings(rows)
    return rows


def _loss_text(row: Row) -> str:
    if row.loss_mean is None:
        return "n/a"
    return f"{row.loss_mean:.4f}" + (f" ± {row.loss_std:.4f}" if row.loss_std is not None else "")


def markdown(rows: list[Row]) -> str:
    head = [
        "method",
        "layout",
        "unique layers",
        "block applications",
        "GFLOPs/token (fwd)",
        "params",
        "val loss",
        "step",
        "n",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [
            row.title,
            row.layout,
            str(row.unique_layers),
            str(row.block_applications),
            f"{row.flops_per_token / 1e9:.4g}",
            f"{row.params / 1e6:.1f}M",
            _loss_text(row),
            row.steps or "n/a",
            str(len(row.scored)),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


CSV_COLUMNS = [
    "method",
    "layout",
    "unique_layers",
    "block_applications",
    "forward_flops_per_token",
    "params",
    "val_loss_mean",
    "val_loss_std",
    "n",
    "step",
    "runs",
    "settings",
]


def csv_text(rows: list[Row]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in rows:
        writer.writerow(
            [
                row.method,
                row.layout,
                row.unique_layers,
                row.block_applications,
                repr(row.flops_per_token),
                row.params,
                "" if row.loss_mean is None else repr(row.loss_mean),
                "" if row.loss_std is None else repr(row.loss_std),
                len(row.scored),
                row.steps,
                ";".join(str(run.path) for run in row.runs),
                settings_text(row.settings),
            ]
        )
    return out.getvalue()


def write_ladder(rows: list[Row], path: str | Path) -> Path:
    """Figure 5: one bar per row (std error bars over seeds), the first dense row's loss dashed."""
    from grt_titan import plots

    bars = [row for row in rows if row.loss_mean is not None]
    for row in rows:
        if row.loss_mean is None:
            print(f"grt-titan table: ladder: no bar for {row.runs[0].name} (no validation loss)", file=sys.stderr)
    dense = next((row for row in bars if row.is_dense), None)
    if dense is None:
        print("grt-titan table: ladder: no dense run with a validation loss, so no dashed line", file=sys.stderr)
    fig = plots.ladder_figure(
        [f"{row.title}\n{row.runs[0].name}" for row in bars],
        [row.loss_mean for row in bars],
        [row.loss_std or 0.0 for row in bars],
        dense_loss=dense.loss_mean if dense is not None else None,
        dense_name=dense.layout if dense is not None else "",
    )
    return plots.save(fig, path)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="grt-titan table",
        description="Paper table 1 (method, layout, layers, FLOPs, params, validation loss) from training runs.",
    )
    p.add_argument(
        "runs",
        nargs="+",
        metavar="RUN_DIR",
        help="job.dump_folder of a run (holds grt_run.json and tb/), or a folder of runs: every "
        "folder below it that holds grt_run.json",
    )
    p.add_argument(
        "--config",
        action="append",
        default=[],
        help="training TOML of a run without grt_run.json (runs made before the record existed): "
        "once for all such runs, or once per such run in the order given",
    )
    p.add_argument("--csv", help="also write the table as CSV to this file")
    p.add_argument("--ladder-png", help="also draw figure 5: one bar per row in the order given, dense loss dashed")
    return p


def _configs_for(run_dirs: list[str], configs: list[str]) -> list[str | None]:
    """Each run dir's --config: None for runs with a record; the one config, or the k-th."""
    bare = [d for d in run_dirs if not (Path(d) / RECORD_NAME).is_file()]
    if configs and len(configs) not in (1, len(bare)):
        raise ValueError(
            f"{len(configs)} --config given for {len(bare)} run(s) without {RECORD_NAME} "
            f"({', '.join(bare) or 'none'}): give one for all of them, or one each in order"
        )
    given = iter(configs)
    return [
        None if d not in bare or not configs else configs[0] if len(configs) == 1 else next(given) for d in run_dirs
    ]


def print_live_groups(runs: list[Run]) -> None:
    """The fault-tolerance section below the table, for the runs trained with it."""
    histories = []
    for run in runs:
        found = live_groups.group_histories(run)
        if not found and (live_groups.config_section(run, "fault_tolerance") or {}).get("enable"):
            print(
                f"grt-titan table: {run.path}: trained with [fault_tolerance] but no "
                f"{live_groups.LIVE_TAG!r} events (train with [metrics] enable_tensorboard = true)",
                file=sys.stderr,
            )
        histories += found
    if histories:
        print("\nFault tolerance: replica groups live at each logged step\n")
        print(live_groups.markdown(histories), end="")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        run_dirs = [str(d) for d in find_run_dirs(args.runs, allow_bare=bool(args.config))]
        runs = [load_run(d, c) for d, c in zip(run_dirs, _configs_for(run_dirs, args.config))]
        for run in runs:
            if run.loss is None:
                print(f"grt-titan table: {run.path}: validation loss n/a: {run.missing}", file=sys.stderr)
        rows = build_rows(runs)
        print(markdown(rows), end="")
        print_live_groups(runs)
        if args.csv:
            atomic_write_text(args.csv, csv_text(rows))
            print(f"wrote {args.csv}", file=sys.stderr)
        if args.ladder_png:
            write_ladder(rows, args.ladder_png)
            print(f"wrote {args.ladder_png}", file=sys.stderr)
    except (ValueError, FileNotFoundError) as e:
        print(f"grt-titan table: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
