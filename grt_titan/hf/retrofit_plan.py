"""`grt-titan retrofit SRC --plan`: candidate splits measured before any weight is written.

Which source layers become the prelude, the core and the coda decides what the retrofit keeps
and what each extra loop costs. The plan builds each candidate (grt_titan/hf/retrofit.py's
`retrofit_model`, at the `--init` given) and scores it on a sample of the user's data at every
depth r = 1..R in one pass per batch (the prelude once, the core iterated, each step's state
read out through the coda and the LM head), beside the split's stored parameters and forward
FLOPs per token at R. It writes nothing but the optional `--plan-json` file.

At the default `--init every-depth` every split that keeps all layers is the source at every
depth by construction, so their losses at init are equal and cannot rank them: the table is
ordered by forward FLOPs at R, then stored parameters, and says so. `--heal-steps N` trains
each candidate N AdamW steps on the sample's train split (single sequences, its training depth
law and noise, as a healing run starts) and scores it again at r = 1..R: splits then differ by
what training does with them, and the table is ordered by the healed loss at R.

The candidates for a source of L layers, p = max(1, L // 8) (docs/retrofit.md, "Choosing the split"):
the default (every layer kept, a core of 2p layers mid-stack); every layer kept with a core of
2p layers early and late in the stack, and one of 4p layers mid-stack; every layer kept with
the whole middle as the core (prelude and coda p layers); McLeish et al.'s drop-the-middle
(prelude p, core the 2p layers before the last p, coda p); and the split the options name.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

import torch
import torch.nn.functional as F

from .retrofit import DEFAULT_INIT, LayerPlan, RetrofitError, default_split, plan_layers, retrofit_model
from .stock_folders import n_dense_layers, read_stock_config, source_args

Split = tuple[int, tuple[int, int], int]  # (P, (A, B), C), as --prelude / --core / --coda
DEFAULT_TOKENS = 4096
DEFAULT_SEQ_LEN = 256
BATCH_SIZE = 4
HEAL_LR = 1e-4  # the retrofit TOML's continued-training rate for a 135M source (6e-4 / 10 at d <= 768)


@dataclass
class PlanRow:
    """One candidate split, measured."""

    name: str
    prelude: int
    core: str  # "A:B", as --core takes it
    coda: int
    dropped: int  # source layers the split drops
    stored_params: int
    forward_flops_per_token: float  # at r = R, the plan's sequence length
    loss: list[float]  # r = 1..R on the sample
    healed_loss: list[float] | None = None  # r = 1..R after --heal-steps

    @property
    def options(self) -> str:
        return f"--prelude {self.prelude} --core {self.core} --coda {self.coda}"


def candidate_splits(num_layers: int, given: Split | None = None) -> dict[str, Split]:
    """The named candidates (module docstring); duplicates keep their first name, and splits
    that do not fit the source (a 4p-layer core in 4 layers) are left out."""
    p = max(1, num_layers // 8)
    mid = default_split(num_layers)
    candidates: dict[str, Split] = {"default": mid}
    if given is not None:
        candidates["yours"] = given
    for name, core, start in (
        ("early core", 2 * p, p),
        ("late core", 2 * p, num_layers - 3 * p),
        ("large core", 4 * p, (num_layers - 4 * p) // 2),
    ):
        candidates[name] = (start, (start, start + core), num_layers - start - core)
    candidates["whole middle"] = (p, (p, num_layers - p), p)
    candidates["drop the middle"] = (p, (num_layers - 3 * p, num_layers - p), p)
    unique: dict[str, Split] = {}
    for name, split in candidates.items():
        prelude, (a, b), coda = split
        fits = 1 <= prelude <= a < b <= num_layers - coda and coda >= 1
        if (fits or name == "yours") and split not in unique.values():
            unique[name] = split
    return unique


def sample_batches(
    src: Path, data: str, tokens: int, seq_len: int, split: str = "val", batch_size: int = BATCH_SIZE
) -> list[torch.Tensor]:
    """`tokens` tokens of the `split` split of `data` (grt_default or a `grt-titan prepare`
    folder) tokenized with the source's tokenizer, as [batch_size, seq_len + 1] rows (inputs
    and labels)."""
    from grt_titan.data import default_corpus
    from grt_titan.data.config import DataConfig
    from grt_titan.data.loader import TokenSequenceDataset, open_dataset_split
    from grt_titan.tokenizer import load_tokenizer

    if tokens < seq_len:
        raise RetrofitError(f"--tokens {tokens} is below one sequence of {seq_len} tokens; allowed: >= {seq_len}")
    tokenizer = load_tokenizer(src)
    dataset_path = None if data == default_corpus.NAME else data
    stream = open_dataset_split(default_corpus.NAME, dataset_path, split, tokenizer, DataConfig(), "plan")
    dataset = TokenSequenceDataset(stream, seq_len, 0, 1, seed=0, shuffle=False)
    count = tokens // seq_len
    if count > len(dataset):
        raise RetrofitError(
            f"--tokens {tokens}: the {split} split of {data} holds {len(dataset) * seq_len} tokens "
            f"({len(dataset)} sequences of {seq_len}); allowed: --tokens <= {len(dataset) * seq_len}"
        )
    rows = [torch.cat([dataset[k][0]["input"], dataset[k][1][-1:]]) for k in range(count)]
    return [torch.stack(rows[i : i + batch_size]) for i in range(0, count, batch_size)]


@torch.no_grad()
def depth_losses(model: torch.nn.Module, batches: Iterable[torch.Tensor], depth: int) -> list[float]:
    """Mean next-token loss at r = 1..depth, each step's state read out as `forward` would."""
    model.eval()
    sums, count = [0.0] * depth, 0
    for batch in batches:
        inputs, labels = batch[:, :-1], batch[:, 1:]
        h_pre = model.prelude(model.embed(inputs), model.freqs_cis)
        states = model.recurrence(h_pre, model.freqs_cis, depth, all_states=True).step_states
        for r, state in enumerate(states):
            logits = model.logits_from_state(state)[..., : model.model_args.vocab_size].float()
            sums[r] += F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum").item()
        count += labels.numel()
    return [s / count for s in sums]


def heal(model: torch.nn.Module, batches: list[torch.Tensor], lr: float = HEAL_LR) -> None:
    """One AdamW step per batch at training depths (the model's depth law and noise, in train
    mode), gradients clipped at 1: the first steps of a healing run, seeded alike for every
    candidate."""
    torch.manual_seed(0)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    vocab = model.model_args.vocab_size
    for batch in batches:
        output = model(batch[:, :-1])
        logits = getattr(output, "logits", output)[..., :vocab].float()
        F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def measure(
    src: Path,
    name: str,
    plan: LayerPlan,
    batches: list[torch.Tensor],
    init: str,
    seq_len: int,
    heal_batches: list[torch.Tensor] = (),
    **grt,
) -> PlanRow:
    model, plan, _ = retrofit_model(src, plan, init=init, **grt)
    args = model.model_args
    depth = args.num_recurrences
    loss = depth_losses(model, batches, depth)
    healed = None
    if heal_batches:
        heal(model, list(heal_batches))
        healed = depth_losses(model, batches, depth)
    return PlanRow(
        name=name,
        prelude=len(plan.prelude),
        core=f"{plan.core[0]}:{plan.core[-1] + 1}",
        coda=len(plan.coda),
        dropped=len(plan.dropped),
        stored_params=sum(p.numel() for p in model.parameters()),
        forward_flops_per_token=args.forward_flops_per_token(seq_len, depth),
        loss=loss,
        healed_loss=healed,
    )


def ranked(rows: list[PlanRow]) -> list[PlanRow]:
    """Healed rows by their healed loss at R; otherwise by forward FLOPs at R, then stored
    parameters (the losses at init of an exact init cannot tell kept-all splits apart)."""
    if rows and rows[0].healed_loss is not None:
        return sorted(rows, key=lambda row: row.healed_loss[-1])
    return sorted(rows, key=lambda row: (row.forward_flops_per_token, row.stored_params))


def format_table(rows: list[PlanRow], init: str, tokens: int, data: str, heal_steps: int = 0) -> str:
    depth = len(rows[0].loss)
    head = ["split", "options", "dropped", "stored params", "GFLOPs/token at R"]
    head += [f"r = {r}" for r in range(1, depth + 1)]
    if heal_steps:
        head += [f"healed r = {r}" for r in range(1, depth + 1)]
        order = f"ordered by the healed loss at r = {depth} after {heal_steps} steps on the train split"
    else:
        order = "ordered by FLOPs, then parameters"
        if init == "every-depth":
            order += (
                "; at --init every-depth each split that keeps every layer is the source at every r, so "
                "these losses cannot rank them: --heal-steps N trains each and scores it again"
            )
    lines = [
        f"Candidate splits at --init {init}: loss on {tokens} tokens of {data}'s val split at r = 1..{depth}, {order}",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for row in ranked(rows):
        cells = [row.name, row.options, str(row.dropped), f"{row.stored_params / 1e6:.1f}M"]
        cells.append(f"{row.forward_flops_per_token / 1e9:.3f}")
        for loss in row.loss + (row.healed_loss or []):
            cells.append(f"{loss:.4f}" if math.isfinite(loss) else str(loss))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_plan(
    src: str | Path,
    given: Split | None = None,
    data: str = "grt_default",
    tokens: int = DEFAULT_TOKENS,
    seq_len: int = DEFAULT_SEQ_LEN,
    init: str = DEFAULT_INIT,
    plan_json: str | Path | None = None,
    heal_steps: int = 0,
    **grt,
) -> list[PlanRow]:
    """Measure the candidates (the splits checked before any is built; with `heal_steps`, again
    after that many healing steps each), print the table and write `plan_json` if given."""
    if heal_steps < 0:
        raise RetrofitError(f"--heal-steps {heal_steps}: allowed: >= 0 (0: no healing)")
    src = Path(src).resolve()
    source = source_args(read_stock_config(src))
    num_layers = n_dense_layers(source)
    if given is not None:
        plan_layers(num_layers, *given)  # a bad split is refused before anything is measured
    plans = {
        name: plan_layers(num_layers, p, core, c) for name, (p, core, c) in candidate_splits(num_layers, given).items()
    }
    seq_len = min(seq_len, source.max_seq_len)
    batches = sample_batches(src, data, tokens, seq_len)
    heal_batches = sample_batches(src, data, heal_steps * seq_len, seq_len, "train", 1) if heal_steps else []
    rows = [measure(src, name, plan, batches, init, seq_len, heal_batches, **grt) for name, plan in plans.items()]
    print(format_table(rows, init, sum(b[:, 1:].numel() for b in batches), data, heal_steps))
    if plan_json is not None:
        record = {
            "source": str(src),
            "init": init,
            "data": data,
            "seq_len": seq_len,
            "heal_steps": heal_steps,
            "splits": [asdict(r) for r in ranked(rows)],
        }
        Path(plan_json).write_text(json.dumps(record, indent=2) + "\n")
    return rows
