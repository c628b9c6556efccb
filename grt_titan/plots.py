"""Matplotlib figures of the paper's diagnostics (figures 3, 8, 9, 10, 11) for one model,
per-token halting's quality-compute curves and the step dynamics beside them, and figure 5's
ablation ladder over runs (`grt-titan table --ladder-png`).

Figures are built as `matplotlib.figure.Figure` objects (Agg canvas) without pyplot, so
no global backend is selected and nothing is left open; `save(fig, path)` writes a PNG.
Every function takes plain lists, so the same code draws the validator's TensorBoard
image, `grt-titan analyze`'s files and `grt-titan table`'s ladder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def _figure(ncols: int, width: float = 4.6, height: float = 3.6, nrows: int = 1) -> tuple[Figure, list]:
    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, [ax for row in axes for ax in row]


def _recurrence_step_axes(axes, steps: Sequence[int]) -> None:
    """Panels whose x axis is the recurrence step."""
    for ax in axes:
        ax.set_xlabel("recurrence step")
        ax.set_xticks(list(steps))
        ax.grid(alpha=0.3)


def save(fig: Figure, path: str | Path, dpi: int = 120) -> Path:
    path = Path(path)
    fig.savefig(path, dpi=dpi, format="png")
    return path


def _mark_trained(ax, x: Sequence[float], y: Sequence[float], depths: Sequence[int], trained_depth: int) -> None:
    """Filled markers up to the trained depth R, hollow beyond (extrapolation), r labels."""
    inside = [i for i, r in enumerate(depths) if r <= trained_depth]
    beyond = [i for i, r in enumerate(depths) if r > trained_depth]
    ax.plot([x[i] for i in inside], [y[i] for i in inside], "o-", color="C0", label=f"r <= R = {trained_depth}")
    if beyond:
        ax.plot(
            [x[i] for i in beyond], [y[i] for i in beyond], "o", mfc="none", color="C3", label="r > R (extrapolation)"
        )
    for xi, yi, r in zip(x, y, depths):
        ax.annotate(f"r={r}", (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7)


def early_exit_figure(
    depths: Sequence[int],
    loss: Sequence[float],
    flops: Sequence[float],
    layers: Sequence[int],
    trained_depth: int,
    title: str = "",
) -> Figure:
    """Figure 3: validation loss vs equivalent layer depth p + r n + c and vs FLOPs/token."""
    fig, (ax_layers, ax_flops) = _figure(2)
    _mark_trained(ax_layers, layers, loss, depths, trained_depth)
    ax_layers.set_xlabel("equivalent layer depth p + r n + c")
    ax_layers.set_ylabel("validation loss (nats/token)")
    ax_layers.set_title("(a) early exit: loss vs depth")
    gflops = [f / 1e9 for f in flops]
    _mark_trained(ax_flops, gflops, loss, depths, trained_depth)
    ax_flops.set_xlabel("forward GFLOPs per token (eq. 1 + LM head)")
    ax_flops.set_title("(b) compute-quality dial")
    for ax in (ax_layers, ax_flops):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return fig


# Marker and colour per halting rule, the same in every figure (C0 / C3: the fixed depth).
HALTING_STYLES = {
    "state": ("s", "C1"),
    "gate": ("^", "C2"),
    "kl": ("v", "C4"),
    "entropy": ("D", "C5"),
    "argmax": ("P", "C6"),
}


def halting_figure(
    depths: Sequence[int],
    loss: Sequence[float],
    flops: Sequence[float],
    trained_depth: int,
    rules: dict[str, dict[str, Sequence[float]]],
    min_depth: int,
    max_depth: int,
    title: str = "",
) -> Figure:
    """Per-token halting on figure 3b's axes: the fixed-depth curve (r labels) and one line
    per rule through its thresholds (`rules[rule]`: `loss`, `forward_flops_per_token` at the
    realised depths), in the order swept. A rule below the fixed-depth curve buys the same
    loss for fewer FLOPs."""
    fig, (ax,) = _figure(1, width=6.4, height=4.4)
    _mark_trained(ax, [f / 1e9 for f in flops], loss, depths, trained_depth)
    for rule, curve in rules.items():
        marker, color = HALTING_STYLES.get(rule, ("o", "C7"))
        ax.plot(
            [f / 1e9 for f in curve["forward_flops_per_token"]],
            curve["loss"],
            marker + "-",
            color=color,
            ms=5,
            alpha=0.85,
            label=f"halting: {rule}",
        )
    ax.set_xlabel("forward GFLOPs per token (mean over tokens at their realised depths)")
    ax.set_ylabel("validation loss (nats/token)")
    ax.set_title(f"per-token halting vs fixed depth (depths {min_depth}..{max_depth})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return fig


def step_dynamics_figure(
    steps: Sequence[int],
    margin: Sequence[float],
    angle: Sequence[float],
    radial: Sequence[float],
    trained_depth: int,
    anchor: Sequence[float] | None = None,
) -> Figure:
    """Why tokens halt: per recurrence step, (a) the readout's decision margin, (b) the angle
    the state turns, (c) the radial share of its displacement; with `anchor`, (d) the anchor
    response ||T_s(a; e) - a|| / ||e|| (the forcing bias: 0 for SCSE); dotted line at R."""
    fig, axes = _figure(3 if anchor is None else 4, width=4.0)
    ax_margin, ax_angle, ax_radial = axes[:3]
    ax_margin.plot(steps, margin, "o-", color="C0")
    ax_margin.set_ylabel("top-1 minus top-2 logit of the step's readout")
    ax_margin.set_title("(a) decision margin")
    ax_angle.plot(steps, angle, "o-", color="C1")
    ax_angle.set_ylabel("angle(h_s, h_{s-1}), degrees")
    ax_angle.set_title("(b) how far the state turns")
    ax_radial.plot(steps, radial, "o-", color="C2")
    ax_radial.set_ylabel("|cos(h_s - h_{s-1}, h_{s-1})|")
    ax_radial.set_title("(c) radial share of the step")
    if anchor is not None:
        axes[3].plot(steps, anchor, "o-", color="C3")
        axes[3].set_ylabel("||T_s(a; e) - a|| / ||e||")
        axes[3].set_title("(d) anchor response (forcing bias)")
    for ax in axes:
        ax.axvline(trained_depth, color="grey", ls=":", lw=1)
    _recurrence_step_axes(tuple(axes), steps)
    return fig


def convergence_figure(depths: Sequence[int], loss: Sequence[float], kl: Sequence[float], final_depth: int) -> Figure:
    """Figure 9: (a) loss at each recurrence step r (0 = prelude only), (b) KL to the final step."""
    fig, (ax_loss, ax_kl) = _figure(2)
    _mark_trained(ax_loss, depths, loss, depths, final_depth)
    ax_loss.set_xlabel("recurrence step r (0 = prelude output)")
    ax_loss.set_ylabel("loss (nats/token)")
    ax_loss.set_title("(a) loss per recurrence step")
    ax_kl.plot(depths, kl, "o-", color="C1")
    ax_kl.axvline(final_depth, color="grey", ls=":", lw=1)
    ax_kl.set_xlabel("recurrence step r")
    ax_kl.set_ylabel(f"KL(p_final || p_r), final r = {final_depth}")
    ax_kl.set_title("(b) KL to the final step")
    for ax in (ax_loss, ax_kl):
        ax.grid(alpha=0.3)
        ax.set_xticks(list(depths))
    return fig


def gate_figure(
    steps: Sequence[int],
    mean: Sequence[float],
    quantiles: dict[float, Sequence[float]],
    copy_frac: Sequence[float],
    write_frac: Sequence[float],
    update_ratio: Sequence[float],
) -> Figure:
    """Figure 10: (a) gate mean with the 5-95 % and 25-75 % bands of g per step (quantiles:
    inside [0, 1] like g itself, where mean +- std can cross 1), (b) saturation shares,
    (c) effective openness rho."""
    fig, (ax_mean, ax_sat, ax_rho) = _figure(3, width=4.0)
    for (lo, hi), alpha in (((0.05, 0.95), 0.2), ((0.25, 0.75), 0.4)):
        ax_mean.fill_between(
            steps,
            quantiles[lo],
            quantiles[hi],
            color="C0",
            alpha=alpha,
            linewidth=0,
            label=f"{round(100 * lo)}-{round(100 * hi)} %",
        )
    ax_mean.plot(steps, quantiles[0.5], "-", color="C0", label="median")
    ax_mean.plot(steps, mean, "o", color="C3", label="mean")
    low = min(quantiles[0.05], default=0.0)
    ax_mean.set_ylim(max(0.0, low - 0.05 * (1.0 - low)), 1.0)
    ax_mean.legend(fontsize="small", loc="lower left")
    ax_mean.set_ylabel("gate g")
    ax_mean.set_title("(a) gate g: mean, median, quantile bands")
    # Two axes: write saturation is orders of magnitude rarer in a trained model (< 1e-4).
    ax_sat.plot(steps, [100 * c for c in copy_frac], "o-", color="C0", label="g > 0.95 (copy)")
    ax_sat.set_ylabel("g > 0.95 (copy-saturated), %", color="C0")
    ax_write = ax_sat.twinx()
    ax_write.plot(steps, [100 * w for w in write_frac], "s--", color="C1", label="g < 0.05 (write)")
    ax_write.set_ylabel("g < 0.05 (write-saturated), %", color="C1")
    ax_sat.set_title("(b) saturated gate values")
    ax_rho.plot(steps, update_ratio, "o-", color="C2")
    ax_rho.set_ylabel("||h_r - h_{r-1}|| / ||o_r - h_{r-1}||")
    ax_rho.set_title("(c) effective gate openness (eq. 6)")
    _recurrence_step_axes((ax_mean, ax_sat, ax_rho), steps)
    return fig


def updates_figure(
    steps: Sequence[int],
    update_norm: Sequence[float],
    proposal_norm: Sequence[float],
    state_cosine: Sequence[float],
    proposal_cosine: Sequence[float],
    relative_update: Sequence[float],
) -> Figure:
    """Figure 11 (a, b) and 14 (b): norms, cosines to the previous state, relative update."""
    fig, (ax_norm, ax_cos, ax_rel) = _figure(3, width=4.0)
    ax_norm.plot(steps, proposal_norm, "o-", label="proposal ||o_r||")
    ax_norm.plot(steps, update_norm, "s-", label="applied update ||h_r - h_{r-1}||")
    ax_norm.set_ylabel("mean per-token L2 norm")
    ax_norm.set_title("(a) proposal vs applied update")
    ax_norm.legend(fontsize=8)
    ax_cos.plot(steps, state_cosine, "o-", label="cos(h_r, h_{r-1})")
    ax_cos.plot(steps, proposal_cosine, "s-", label="cos(o_r, h_{r-1})")
    ax_cos.set_ylabel("mean per-token cosine")
    ax_cos.set_title("(b) cosine to the previous state")
    ax_cos.legend(fontsize=8)
    ax_rel.plot(steps, relative_update, "o-", color="C2")
    ax_rel.set_ylabel("||h_r - h_{r-1}||_F / ||h_{r-1}||_F")
    ax_rel.set_title("(c) relative update (fig. 14b)")
    _recurrence_step_axes((ax_norm, ax_cos, ax_rel), steps)
    return fig


def gate_heatmap_figure(prompts: Sequence[dict]) -> Figure:
    """Figure 8: mean_d g per token (columns) and recurrence step (rows), one panel per prompt.

    Each prompt is `{"text", "tokens": [str], "gate_mean": [[float] * tokens] * steps}`.
    Bright = lower g = write-heavy (the paper's colouring); dark = copy-heavy.
    """
    n = max(len(prompts), 1)
    width = max(6.0, 0.45 * max((len(p["tokens"]) for p in prompts), default=8) + 2)
    fig, axes = _figure(
        1, width=width, height=2.2 + 0.25 * max((len(p["gate_mean"]) for p in prompts), default=4), nrows=n
    )
    vmin = min((min(min(row) for row in p["gate_mean"]) for p in prompts if p["gate_mean"]), default=0.0)
    vmax = max((max(max(row) for row in p["gate_mean"]) for p in prompts if p["gate_mean"]), default=1.0)
    image = None
    for ax, prompt in zip(axes, prompts):
        matrix = prompt["gate_mean"]
        image = ax.imshow(matrix, aspect="auto", cmap="viridis_r", vmin=vmin, vmax=vmax, interpolation="nearest")
        ax.set_xticks(range(len(prompt["tokens"])))
        ax.set_xticklabels([repr(t)[1:-1] for t in prompt["tokens"]], rotation=60, ha="right", fontsize=8)
        ax.set_yticks(range(len(matrix)))
        ax.set_yticklabels([str(i + 1) for i in range(len(matrix))], fontsize=8)
        ax.set_ylabel("step")
        ax.set_title(prompt["text"][:80], fontsize=9)
    if image is not None:
        fig.colorbar(image, ax=axes, label="mean_d g (bright = write-heavy)", shrink=0.9)
    return fig


def task_accuracy_figure(result: dict) -> Figure:
    """`grt-titan eval-task`: exact-match accuracy by problem depth (rows) x recurrence r
    (columns; beyond R marked), and the arrival step by depth (the ignition curve); for records
    whose depth the loops give (`at_loops`), where an answer is meant to be right at r = d only
    and no arrival exists, each depth's accuracy at r = d beside r = 1's."""
    depths = list(result["accuracy"])
    columns = [str(r) for r in result["depths"]]
    matrix = [[result["accuracy"][d][c] for c in columns] for d in depths]
    fig, (heat, arrival) = _figure(2, width=max(4.6, 0.3 * len(columns) + 2.0))
    image = heat.imshow(
        matrix, aspect="auto", cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest", origin="lower"
    )
    R = result.get("num_recurrences")
    heat.set_xticks(range(len(columns)))
    heat.set_xticklabels(
        [c + ("*" if R is not None and c.isdigit() and int(c) > R else "") for c in columns], fontsize=8
    )
    heat.set_yticks(range(len(depths)))
    heat.set_yticklabels(depths, fontsize=8)
    heat.set_xlabel("recurrence r (* beyond R)")
    heat.set_ylabel("problem depth")
    heat.set_title("exact match")
    fig.colorbar(image, ax=heat, shrink=0.9)
    if "at_loops" in result:
        _loops_panel(arrival, result)
        return fig
    for d in depths:
        steps = [a for a in result["arrival"][d] if a is not None]
        if steps:
            arrival.scatter([int(d)] * len(steps), steps, alpha=0.15, color="C0", s=12)
            arrival.plot([int(d)], [sum(steps) / len(steps)], "o", color="C1")
    arrival.set_xlabel("problem depth")
    arrival.set_ylabel("arrival step r (mean in orange)")
    arrival.set_title("arrival of the answer")
    return fig


def _loops_panel(ax, result: dict) -> None:
    """Each depth's accuracy read at r = d (the loops give the depth) and at r = 1."""
    depths = [int(d) for d in result["at_loops"]]
    ax.plot(depths, list(result["at_loops"].values()), "o-", color="C1", label="at r = d")
    at_one = [result["accuracy"][str(d)].get("1") for d in depths]
    if all(a is not None for a in at_one):
        ax.plot(depths, at_one, "s--", color="C0", label="at r = 1")
    ax.set_ylim(-0.05, 1.05)
    ax.set_xticks(depths)
    ax.set_xlabel("problem depth")
    ax.set_ylabel("exact match")
    ax.set_title("the answer to depth d, read after d steps")
    ax.legend(fontsize=8)


def ladder_figure(
    names: Sequence[str],
    losses: Sequence[float],
    errors: Sequence[float],
    dense_loss: float | None = None,
    dense_name: str = "",
) -> Figure:
    """Figure 5: validation loss per ablation rung (bars in the order given, +- std over
    seeds), the dense baseline's loss as a dashed horizontal line."""
    fig, (ax,) = _figure(1, width=max(6.0, 1.1 * len(names) + 2), height=4.2)
    x = list(range(len(names)))
    bars = ax.bar(x, losses, yerr=list(errors), capsize=4, color="C0", alpha=0.85)
    ax.bar_label(bars, labels=[f"{v:.3f}" for v in losses], padding=3, fontsize=8)
    if dense_loss is not None:
        ax.axhline(dense_loss, color="C3", ls="--", lw=1.2, label=f"dense {dense_name}: {dense_loss:.3f}")
        ax.legend(fontsize=8, loc="upper right")
    ax.set_xticks(x)
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("validation loss (nats/token)")
    ax.set_title("component ablation ladder")
    if losses:  # the axis starts near the smallest loss, as the paper's figure does
        dense = [dense_loss] if dense_loss is not None else []
        low = min([*losses, *dense])
        high = max([*(v + e for v, e in zip(losses, errors)), *dense])
        margin = 0.1 * (high - low) + 0.02
        ax.set_ylim(low - margin, high + 1.5 * margin)
    ax.grid(alpha=0.3, axis="y")
    return fig
