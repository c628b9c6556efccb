"""`grt-titan task NAME`: multi-step problems as prompt/completion records (docs/tasks.md).

Each problem of depth d needs d dependent steps, and its record carries ``depth`` and
``steps``, the d intermediate targets (the last is the answer), for evaluation by depth and
per-step supervision. Problems are plain text of space-separated words, so any tokenizer
reads them, and ``task_vocabulary`` writes a word-level tokenizer with one token per word
for models too small to pay for 50k embedding rows.

- ``iterated-function``: a shuffled table ``a > q ;`` of a function f over S symbols, a start
  x and d: the answer is f^d(x). The orbit x, f(x), ..., f^d(x) is d + 1 distinct symbols,
  so no cycle ends the walk early (the iterated-function task of the recurrent-retrofit study).
  ``--table ordered`` writes the lines in symbol order instead: symbol i's line is at a fixed
  place, so a lookup can go by position (one attention layer) rather than by matching the
  line's first symbol and reading past it (an induction-style circuit of two). ``--table
  edges`` writes each line as one word ``a>q``, shuffled: one token per line in the task
  vocabulary, so a lookup matches that token by its content (one attention layer).
- ``chains``: variable assignments ``b = a ;`` forming a chain of d hops from the queried
  variable to a digit, among two distractor chains of the same depth with digits of their
  own, shuffled (p-hop / variable tracking).
- ``mano``: a prefix expression of d operators (+, -, *) over 0..22, mod 23 (Ouro's Mano).

Splits are disjoint by construction: a problem's split is decided by the hash of its prompt
(train 80%, val 10%, test 10%), so files generated with any seeds never share a problem
across splits; within a file problems are distinct. Depths cycle through the range, so
every depth has the same count.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import string
import sys
from pathlib import Path

from grt_titan.data.records import DEPTH_GIVEN  # iterated-function's query names its depth, or the loops give it

SPLIT_BUCKETS = {"train": range(0, 80), "val": range(80, 90), "test": range(90, 100)}
SYMBOLS = string.ascii_lowercase
MANO_MODULUS = 23
MAX_TRIES_PER_PROBLEM = 200
CHAINS = 3  # chains per `chains` problem: the query's and two distractors


def table_text(f: dict[str, str], rng: random.Random, table: str) -> str:
    """f's lines ``a > f(a) ;``: shuffled, or in symbol order (``table`` ``ordered``); or
    shuffled words ``a>f(a)`` (``edges``)."""
    lines = sorted(f.items())
    if table != "ordered":
        rng.shuffle(lines)
    if table == "edges":
        return " ".join(f"{a}>{b}" for a, b in lines)
    return " ".join(f"{a} > {b} ;" for a, b in lines)


def query_text(x: str, depth: int, depth_given: str) -> str:
    """An iterated-function query: ``| x * d =`` names the depth; ``| x =`` (``loops``) leaves it
    to the number of recurrence steps the model runs (docs/tasks.md's quickstart)."""
    return f"| {x} =" if depth_given == "loops" else f"| {x} * {depth} ="


def iterated_function(
    rng: random.Random, depth: int, symbols: int, table: str = "shuffled", depth_given: str = "query"
) -> dict:
    if depth + 1 > symbols:
        raise ValueError(
            f"iterated-function: depth {depth} needs at least {depth + 1} symbols; got --symbols {symbols}"
        )
    names = SYMBOLS[:symbols]
    orbit = rng.sample(names, depth + 1)
    f = {a: rng.choice(names) for a in names}
    for a, b in zip(orbit, orbit[1:]):
        f[a] = b
    prompt = table_text(f, rng, table) + " " + query_text(orbit[0], depth, depth_given)
    record = {"prompt": prompt, "completion": f" {orbit[-1]}", "depth": depth, "steps": orbit[1:]}
    return record | ({"depth_given": "loops"} if depth_given == "loops" else {})


def iterated_function_queries(
    rng: random.Random, depths: list[int], symbols: int, table: str = "shuffled", depth_given: str = "query"
) -> dict:
    """One table, a query per depth in `depths`, each answered: a record of many answers
    (``turns``). f is a single cycle over the S symbols, so f^a(x) != f^b(x) for a != b < S: an
    answer a step short is wrong, and every orbit of d < S steps is d + 1 distinct symbols."""
    if max(depths) + 1 > symbols:
        raise ValueError(
            f"iterated-function: depth {max(depths)} needs at least {max(depths) + 1} symbols; got --symbols {symbols}"
        )
    cycle = rng.sample(SYMBOLS[:symbols], symbols)
    f = {a: cycle[(i + 1) % symbols] for i, a in enumerate(cycle)}
    turns, before = [], table_text(f, rng, table) + " "
    for depth in depths:
        orbit = [rng.choice(cycle)]
        for _ in range(depth):
            orbit.append(f[orbit[-1]])
        turns.append(
            {"prompt": before + query_text(orbit[0], depth, depth_given), "completion": f" {orbit[-1]}", "depth": depth}
        )
        turns[-1]["steps"] = orbit[1:]
        if depth_given == "loops":
            turns[-1]["depth_given"] = "loops"
        before = " "
    return {"turns": turns}


def chains(rng: random.Random, depth: int, symbols: int) -> dict:
    """CHAINS chains of d variables, each first set to its own digit, each next to the one
    before; the query is one chain's last variable, d lookups from its digit. Every chain has
    the query's depth and a digit of its own, so a guess among the prompt's digits is right
    1 time in CHAINS at every depth: only following the query's chain does better."""
    if CHAINS * depth > symbols:
        raise ValueError(
            f"chains: depth {depth} needs at least {CHAINS * depth} symbols ({CHAINS} chains); got --symbols {symbols}"
        )
    names = rng.sample(SYMBOLS[:symbols], CHAINS * depth)
    digits = rng.sample("0123456789", CHAINS)
    assignments, query, steps = [], None, None
    for c, value in enumerate(digits):
        chain = names[c * depth : (c + 1) * depth]
        assignments.append(f"{chain[0]} = {value} ;")
        assignments += [f"{var} = {prev} ;" for prev, var in zip(chain, chain[1:])]
        if c == 0:
            query, steps = chain[-1], [*reversed(chain[:-1]), value]
    rng.shuffle(assignments)
    prompt = " ".join(assignments) + f" | {query} ="
    return {"prompt": prompt, "completion": f" {steps[-1]}", "depth": depth, "steps": steps}


def mano(rng: random.Random, depth: int, symbols: int) -> dict:
    del symbols

    def build(operators: int):
        if operators == 0:
            value = rng.randrange(MANO_MODULUS)
            return [str(value)], value, []
        left_ops = rng.randrange(operators)
        op = rng.choice("+-*")
        left, lv, ls = build(left_ops)
        right, rv, rs = build(operators - 1 - left_ops)
        value = {"+": lv + rv, "-": lv - rv, "*": lv * rv}[op] % MANO_MODULUS
        return [op, *left, *right], value, [*ls, *rs, value]

    tokens, value, steps = build(depth)
    prompt = " ".join(tokens) + " ="
    return {"prompt": prompt, "completion": f" {value}", "depth": depth, "steps": [str(s) for s in steps]}


TASKS = {"iterated-function": iterated_function, "chains": chains, "mano": mano}
DEFAULT_SYMBOLS = {"iterated-function": 12, "chains": 24, "mano": 0}
TABLES = ("shuffled", "ordered", "edges")  # iterated-function's table (--table)

# The task vocabulary's `a>b` words (`--table edges`): every pair over the first EDGE_SYMBOLS
# symbols, so the vocabulary (235 ids) fits the 256 rows of the `task_debug_words` flavor.
EDGE_SYMBOLS = 10


def problem_split(prompt: str) -> str:
    bucket = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "little") % 100
    return next(name for name, buckets in SPLIT_BUCKETS.items() if bucket in buckets)


def generate(
    name: str,
    depths: range,
    n: int,
    seed: int,
    split: str = "train",
    symbols: int | None = None,
    queries: int = 1,
    table: str = "shuffled",
    depth_given: str = "query",
) -> list[dict]:
    """``n`` distinct problems of ``split``, depths cycling through ``depths``; with ``queries``
    > 1 (iterated-function), records of that many answers over one table each, its lines in
    ``table`` order; ``depth_given`` ``loops``: queries without their depth."""
    if name not in TASKS:
        raise ValueError(f"task {name!r}: unknown; allowed: {', '.join(TASKS)}")
    if split not in SPLIT_BUCKETS:
        raise ValueError(f"--split {split!r}; allowed: {', '.join(SPLIT_BUCKETS)}")
    if n < 1 or not depths or depths.start < 1:
        raise ValueError(f"--n {n} and --depths {depths.start}-{depths.stop - 1}: need n >= 1 and depths >= 1")
    symbols = DEFAULT_SYMBOLS[name] if symbols is None else symbols
    if name != "mano" and not 2 <= symbols <= len(SYMBOLS):
        raise ValueError(f"--symbols {symbols}; allowed: 2 to {len(SYMBOLS)}")
    if queries < 1 or (queries > 1 and name != "iterated-function"):
        raise ValueError(f"--queries {queries}; allowed: 1, or more for iterated-function (one table, many answers)")
    if table not in TABLES or (table != "shuffled" and name != "iterated-function"):
        raise ValueError(f"--table {table}; allowed: {', '.join(TABLES)} for iterated-function, shuffled otherwise")
    if depth_given not in DEPTH_GIVEN or (depth_given != "query" and name != "iterated-function"):
        raise ValueError(
            f"--depth-given {depth_given}; allowed: {', '.join(DEPTH_GIVEN)} for iterated-function, query otherwise"
        )
    options = {"table": table, "depth_given": depth_given} if name == "iterated-function" else {}
    rng = random.Random(f"{name}:{seed}")
    seen, out = set(), []
    for k in range(n):
        depth = depths[k % len(depths)]
        query_depths = [depths[(k * queries + j) % len(depths)] for j in range(queries)]
        for _ in range(MAX_TRIES_PER_PROBLEM):
            if queries > 1:
                record = iterated_function_queries(rng, query_depths, symbols, **options)
                key = record["turns"][0]["prompt"]
            else:
                record = TASKS[name](rng, depth, symbols, **options)
                key = record["prompt"]
            if key not in seen and problem_split(key) == split:
                break
        else:
            raise ValueError(
                f"{name}: found no new {split} problem of depth {depth} after {MAX_TRIES_PER_PROBLEM} tries "
                f"({len(seen)} made); lower --n or widen the problem space (--symbols)"
            )
        seen.add(key)
        out.append(record)
    return out


def task_vocabulary() -> list[str]:
    """Every word the tasks write, in a fixed order: symbols, digits and numbers to 99,
    punctuation and operators, then the edge words ``a>b`` over the first EDGE_SYMBOLS symbols."""
    edges = [f"{a}>{b}" for a in SYMBOLS[:EDGE_SYMBOLS] for b in SYMBOLS[:EDGE_SYMBOLS]]
    return [*SYMBOLS, *map(str, range(100)), ">", ";", "|", "*", "=", "+", "-", *edges]


def write_task_tokenizer(folder: str | Path) -> Path:
    """A word-level Hugging Face tokenizer folder (tokenizer.json, tokenizer_config.json):
    one token per task word, split on whitespace, ``<eos>`` last; `--tokenizer` of
    `grt-titan prepare` and `[model] hf_assets_path` read it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    words = ["<unk>", *task_vocabulary(), "<eos>"]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    tokenizer.add_special_tokens(["<eos>"])
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {
        "eos_token": "<eos>",
        "unk_token": "<unk>",
        "model_max_length": 4096,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder


def as_chat(problem: dict) -> dict:
    """The problem as a chat record: the prompt the user's turn, the answer the assistant's (no
    leading space: the chat template separates the turns), `depth` and `steps` kept, so that
    prepare renders it by a model's chat template and the steps stand in for the answer."""
    turns = [
        {"role": "user", "content": problem["prompt"]},
        {"role": "assistant", "content": problem["completion"].strip()},
    ]
    return {"messages": turns, **{key: problem[key] for key in ("depth", "steps") if key in problem}}


def as_scratchpad(problem: dict) -> dict:
    """The problem with a scratchpad completion: every intermediate value written out, the
    answer last (` j b e` for f(c), f(f(c)), f^3(c) = e), the chain-of-thought baseline of
    the recurrent-retrofit study (arXiv 2608.11233). No `steps`: they are in the text."""
    return {"prompt": problem["prompt"], "completion": " " + " ".join(problem["steps"]), "depth": problem["depth"]}


def parse_depths(text: str) -> range:
    try:
        low, _, high = text.partition("-")
        low, high = int(low), int(high or low)
    except ValueError:
        raise ValueError(f"--depths {text!r}; allowed: A-B or A, integers >= 1") from None
    if low < 1 or high < low:
        raise ValueError(f"--depths {text!r}; allowed: A-B with 1 <= A <= B")
    return range(low, high + 1)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="grt-titan task",
        description="Multi-step problems as prompt/completion JSONL for `grt-titan prepare` (docs/tasks.md).",
    )
    p.add_argument("name", choices=[*TASKS, "vocab"], help="the task, or `vocab`: write the task tokenizer to --out")
    p.add_argument("--out", required=True, help="FILE.jsonl (a task), or a folder (vocab)")
    p.add_argument("--depths", default="1-6", help="A-B: problem depths, cycled (default 1-6)")
    p.add_argument("--n", type=int, default=1000, help="problems (default 1000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", default="train", choices=list(SPLIT_BUCKETS), help="disjoint by problem hash")
    p.add_argument("--symbols", type=int, default=None, help="symbols of the table/variables (default per task)")
    p.add_argument(
        "--chat", action="store_true", help="write chat records (messages: user, assistant) for a chat template"
    )
    p.add_argument(
        "--scratchpad", action="store_true", help="the completion writes every intermediate value, the answer last"
    )
    p.add_argument(
        "--queries",
        type=int,
        default=1,
        help="iterated-function: queries per table, each answered (a record of many answers, `turns`; default 1)",
    )
    p.add_argument(
        "--table",
        default="shuffled",
        choices=TABLES,
        help="iterated-function: its table's lines shuffled (default); ordered by symbol (a lookup by position); "
        f"or edges: each line one word a>b, shuffled (one token per line in the task vocabulary, to --symbols {EDGE_SYMBOLS})",
    )
    p.add_argument(
        "--depth-given",
        default="query",
        choices=DEPTH_GIVEN,
        help="iterated-function: the query names its depth (`| x * d =`, default), or not (`| x =`, loops: the "
        "answer to depth d is read after d recurrence steps; train on --depths R-R with per-step supervision)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.name == "vocab":
            folder = write_task_tokenizer(args.out)
            print(f"wrote {folder}: a word-level tokenizer of {len(task_vocabulary()) + 2} tokens")
            return 0
        if args.queries > 1 and (args.chat or args.scratchpad):
            raise ValueError(
                f"--queries {args.queries} writes records of many answers; allowed with neither --chat nor --scratchpad"
            )
        problems = generate(
            args.name,
            parse_depths(args.depths),
            args.n,
            args.seed,
            args.split,
            args.symbols,
            args.queries,
            args.table,
            args.depth_given,
        )
    except ValueError as e:
        print(f"grt-titan task: error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    if args.scratchpad:
        problems = [as_scratchpad(p) for p in problems]
    tmp.write_text("".join(json.dumps(as_chat(p) if args.chat else p) + "\n" for p in problems))
    tmp.replace(out)
    kind = ("scratchpad " if args.scratchpad else "") + ("chat records" if args.chat else "problems")
    kind += f" of {args.queries} queries each" if args.queries > 1 else ""
    kind += f" over {args.table} tables" if args.name == "iterated-function" else ""
    kind += ", the depth given by the loops" if args.depth_given == "loops" else ""
    print(f"wrote {out}: {len(problems)} {args.split} {kind} of {args.name}, depths {args.depths}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
