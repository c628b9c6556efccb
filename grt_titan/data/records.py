"""Prompt/completion records for `grt-titan prepare`: supervised fine-tuning data whose loss
counts the completion only (docs/data.md, "Prompt/completion data").

A JSONL input whose first record has string fields ``prompt`` and ``completion``, or a
``messages`` list (a chat, rendered by the tokenizer's chat template, the loss on its assistant
turns: ``ChatTemplate``), is read as records instead of documents. Each record becomes ``prefix + prompt + completion + suffix``
(the tokenizer's document specials: GPT-2 ``[] ... [eos]``, Llama 3 ``[bos] ... [eos]``) and
a loss mask, 1 on the completion and the end token, 0 on the prefix and the prompt. Optional
fields ``depth`` (an int >= 1) and ``steps`` (``depth`` strings: the intermediate targets of
a multi-step task) and ``depth_given`` (``query`` or ``loops``: whether the prompt names the
depth, `grt-titan task --depth-given`) are kept as metadata, one JSON line per record in ``{split}_meta.jsonl``,
with the record's source (``where``: file:line). ``steps`` also become per-step target
streams (``encode_records``; in a chat record they stand in for the last assistant turn),
which ``[grt] step_supervision`` trains step t's readout on. A record of many answers holds a
``turns`` list of prompt/completion objects (each with its own ``depth`` and ``steps``), laid
end to end with every completion counted (``check_turns``).
Records are validated before anything is written: the first bad one stops `prepare` with its
file, line and field.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from grt_titan.data.shards import RECORDS_KIND
from grt_titan.data.sources import InvalidUTF8, jsonl_values

PROMPT, COMPLETION, MESSAGES, TURNS = "prompt", "completion", "messages", "turns"
ROLES = ("system", "user", "assistant", "tool")
KIND = RECORDS_KIND


@dataclass
class Record:
    prompt: str
    completion: str
    where: str
    meta: dict = field(default_factory=dict)
    messages: list[dict] | None = None  # a chat record: rendered by the tokenizer's chat template
    turns: list[Record] | None = None  # a record of many answers: its turns laid end to end


def plain_turns(record: Record) -> list[Record]:
    """A plain record's prompt/completion pairs: its turns, or the record itself."""
    return record.turns if record.turns is not None else [record]


def is_record_file(kind: str, path: Path) -> bool:
    """A JSONL input whose first non-blank line is an object with ``prompt`` and ``completion``."""
    if kind != "jsonl":
        return False
    try:
        obj, _ = next(jsonl_values(path), (None, ""))
    except ValueError:  # not JSON: the documents' reader names the line
        return False
    return isinstance(obj, dict) and ((PROMPT in obj and COMPLETION in obj) or MESSAGES in obj or TURNS in obj)


def check_record(obj, where: str) -> Record:
    """The record of one JSONL line, or ValueError naming the line and the field."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: a record must be a JSON object, got {type(obj).__name__}")
    if MESSAGES in obj and PROMPT not in obj and COMPLETION not in obj:
        return Record("", "", where, _meta(obj, where), check_messages(obj[MESSAGES], where))
    if TURNS in obj and PROMPT not in obj and COMPLETION not in obj:
        return Record("", "", where, {}, turns=check_turns(obj, where))
    for name in (PROMPT, COMPLETION):
        if name not in obj:
            raise ValueError(f"{where}: field {name!r} is missing (found {sorted(obj)})")
        value = obj[name]
        if not isinstance(value, str):
            raise ValueError(f"{where}: field {name!r} is {type(value).__name__}; allowed: a non-empty string")
        if not value:
            raise ValueError(f"{where}: field {name!r} is empty; allowed: a non-empty string")
    return Record(obj[PROMPT], obj[COMPLETION], where, _meta(obj, where))


def check_messages(messages, where: str) -> list[dict]:
    """A chat record's turns: role and non-empty content each, one assistant turn at least."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: field 'messages' must be a non-empty list of {{role, content}} objects")
    for k, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ROLES:
            raise ValueError(f"{where}: field 'messages' turn {k}: role {role!r}; allowed: {', '.join(ROLES)}")
        content = message.get("content")
        if not isinstance(content, str) or not content:
            raise ValueError(f"{where}: field 'messages' turn {k}: content must be a non-empty string")
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError(f"{where}: field 'messages' has no assistant turn; the loss counts assistant turns only")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def check_turns(obj: dict, where: str) -> list[Record]:
    """A record of many answers: ``turns``, a non-empty list of prompt/completion objects, each
    with its own optional ``depth`` and ``steps``; no other field beside it."""
    turns = obj[TURNS]
    if not isinstance(turns, list) or not turns:
        raise ValueError(f"{where}: field 'turns' must be a non-empty list of {{prompt, completion}} objects")
    extra = sorted(set(obj) - {TURNS})
    if extra:
        raise ValueError(f"{where}: field {extra[0]!r} beside 'turns'; allowed: 'depth' and 'steps' inside each turn")
    out = []
    for k, turn in enumerate(turns):
        if not isinstance(turn, dict) or MESSAGES in turn or TURNS in turn:
            raise ValueError(f"{where}: field 'turns' turn {k}: must be an object with 'prompt' and 'completion'")
        out.append(check_record(turn, f"{where} turn {k}"))
    return out


# `depth_given`: the prompt names the problem's depth, or the recurrence steps run give it.
DEPTH_GIVEN = ("query", "loops")


def _meta(obj: dict, where: str) -> dict:
    meta = {}
    if "depth_given" in obj:
        if obj["depth_given"] not in DEPTH_GIVEN:
            raise ValueError(
                f"{where}: field 'depth_given' is {obj['depth_given']!r}; allowed: {', '.join(map(repr, DEPTH_GIVEN))}"
            )
        meta["depth_given"] = obj["depth_given"]
    if "depth" in obj:
        depth = obj["depth"]
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"{where}: field 'depth' is {depth!r}; allowed: an integer >= 1")
        meta["depth"] = depth
    if "steps" in obj:
        steps = obj["steps"]
        if not isinstance(steps, list) or not all(isinstance(s, str) and s for s in steps):
            raise ValueError(f"{where}: field 'steps' must be a list of non-empty strings")
        if "depth" in meta and len(steps) != meta["depth"]:
            raise ValueError(
                f"{where}: field 'steps' has {len(steps)} targets but 'depth' is {meta['depth']}; "
                "allowed: one target per step"
            )
        meta["steps"] = steps
    return meta


def read_records(paths: list[Path]) -> Iterator[Record]:
    """Every record of the JSONL files, in order; blank lines skipped."""
    for path in paths:
        for obj, where in jsonl_values(path):
            if isinstance(obj, InvalidUTF8):
                raise ValueError(obj.args[0])
            yield check_record(obj, where)


def ordinary_batch(tokenizer, texts: list[str]) -> list[list[int]]:
    """The ids of each text alone (no special token added, none recognised in it): tiktoken's
    encoder text by text (its batch encoder's thread per text costs more than short records),
    the `tokenizers` library's batch encoder."""
    if hasattr(tokenizer, "encoding"):  # GPT2Tokenizer (tiktoken)
        encode = tokenizer.encoding.encode_ordinary
        return [encode(text) for text in texts]
    if hasattr(tokenizer, "encode_ordinary") and hasattr(tokenizer, "tokenizer"):  # HFTokenizer
        return [e.ids for e in tokenizer.tokenizer.encode_batch(texts, add_special_tokens=False)]
    return [tokenizer.encode(text) for text in texts]


@dataclass
class Encoded:
    """Records laid end to end (`encode_records`)."""

    ids: np.ndarray  # token ids
    mask: np.ndarray  # loss mask: 1 on the completions and their suffix
    lengths: list[int]  # tokens per record
    # [tokens, max_steps]: column t is the stream with each completion replaced by the record's
    # step t + 1 target (per-step supervision); None without steps, or when they do not align.
    steps: np.ndarray | None = None
    unaligned: str | None = None  # why a record's step targets cannot replace its completion


def answer(record: Record) -> str:
    """The text the per-step targets stand in for: the completion, or a chat's last assistant turn."""
    if record.messages is None:
        return record.completion
    return next(m["content"] for m in reversed(record.messages) if m["role"] == "assistant")


def step_completions(record: Record) -> list[str]:
    """The answer the record would have if step t's target were its answer: the answer's
    leading whitespace, then steps[t] (" f" for steps ["h", "f"] and " f")."""
    text = answer(record)
    lead = text[: len(text) - len(text.lstrip())]
    return [lead + step for step in record.meta.get("steps", [])]


def encode_records(tokenizer, batch: list[Record], prefix: list[int], suffix: list[int], max_steps: int = 0) -> Encoded:
    """Records laid end to end: each is prefix + prompt + completion + suffix (a record of many
    answers: prefix, then each turn's prompt + completion, then suffix), the mask 1 on the
    completions and the suffix. Prompt and completion are encoded apart, so the boundary is
    where the record puts it. With `max_steps`, also the per-step target streams: step t's
    target tokens in place of each completion's (as many tokens, else `unaligned` says which
    record), the completion itself past its last step. A chat record's steps stand in for its
    last assistant turn, rendered by the template as the record is."""
    turns = [turn for r in batch if r.messages is None for turn in plain_turns(r)]
    prompts = iter(ordinary_batch(tokenizer, [t.prompt for t in turns]))
    completions = iter(ordinary_batch(tokenizer, [t.completion for t in turns]))
    steps = iter(ordinary_batch(tokenizer, [s for t in turns for s in step_completions(t)])) if max_steps else None
    ids, mask, lengths, step_rows, unaligned = [], [], [], [], None
    for record in batch:
        if record.messages is not None:
            template = ChatTemplate.of(tokenizer, record.where)
            record_ids, record_mask = template.encode(record)
            if steps is not None:
                rows, why = _chat_step_rows(template, record, record_ids, record_mask, max_steps)
                step_rows.append(rows)
                unaligned = unaligned or why
        else:
            record_ids, record_mask, answers = list(prefix), [0] * len(prefix), []
            for turn in plain_turns(record):
                prompt, completion = next(prompts), next(completions)
                check_known(tokenizer, turn, prompt=prompt, completion=completion)
                record_ids += prompt
                record_mask += [0] * len(prompt)
                targets = [next(steps) for _ in turn.meta.get("steps", [])] if steps is not None else []
                answers.append((turn, len(record_ids), completion, targets))
                record_ids += completion
                record_mask += [1] * len(completion)
            record_ids += suffix
            record_mask += [1] * len(suffix)
            if steps is not None:
                rows, why = _step_rows(record_ids, answers, max_steps)
                step_rows.append(rows)
                unaligned = unaligned or why
        ids += record_ids
        mask += record_mask
        lengths.append(len(record_ids))
    encoded = Encoded(np.array(ids, dtype=np.int64), np.array(mask, dtype=np.uint8), lengths)
    if max_steps and unaligned is None:
        encoded.steps = np.concatenate(step_rows) if step_rows else np.zeros((0, max_steps), np.int64)
    encoded.unaligned = unaligned
    return encoded


def check_known(tokenizer, turn: Record, **ids: list[int]) -> None:
    """ValueError naming the field and its words when a tokenizer with an unknown token (a
    word-level one, such as `grt-titan task vocab`'s) read a word of `turn` as that token: the
    text would train as `<unk>`, silently."""
    unknown = getattr(tokenizer, "unknown_id", None)
    if unknown is None:
        return
    for name, field_ids in ids.items():
        if unknown in field_ids:
            words = sorted({w for w in getattr(turn, name).split() if unknown in tokenizer.encode_ordinary(w)})
            raise ValueError(
                f"{turn.where}: field {name!r} has words the tokenizer {tokenizer.name!r} does not know "
                f"({', '.join(map(repr, words[:5]))}): it would read them as its unknown token; allowed: "
                "text in its vocabulary"
            )


def _step_rows(
    record_ids: list[int], answers: list[tuple[Record, int, list[int], list[list[int]]]], max_steps: int
) -> tuple[np.ndarray, str | None]:
    """One plain record's [tokens, max_steps] step streams (`encode_records`): each answer
    (turn, where its completion starts, the completion, its step targets' tokens), or why not."""
    rows = np.tile(np.array(record_ids, dtype=np.int64)[:, None], (1, max_steps))
    for turn, at, completion, steps in answers:
        for t, step in enumerate(steps):
            if len(step) != len(completion):
                texts = step_completions(turn)
                return rows, (
                    f"{turn.where}: steps[{t}] as a completion, {texts[t]!r}, is {len(step)} token(s) but the "
                    f"completion {turn.completion!r} is {len(completion)}"
                )
            rows[at : at + len(step), t] = step
    return rows, None


def _chat_step_rows(
    template: ChatTemplate, record: Record, record_ids: list[int], record_mask: list[int], max_steps: int
) -> tuple[np.ndarray, str | None]:
    """A chat record's [tokens, max_steps] step streams: step t's rendering, its last assistant
    turn's content steps[t], on the counted positions (`encode_records`), or why not."""
    rows = np.tile(np.array(record_ids, dtype=np.int64)[:, None], (1, max_steps))
    last = max(k for k, m in enumerate(record.messages) if m["role"] == "assistant")
    counted = np.array(record_mask, dtype=bool)
    for t, text in enumerate(step_completions(record)):
        messages = [*record.messages[:last], {"role": "assistant", "content": text}, *record.messages[last + 1 :]]
        step_ids, _ = template.encode(Record("", "", record.where, record.meta, messages))
        if len(step_ids) != len(record_ids):
            return rows, (
                f"{record.where}: steps[{t}] as the last assistant turn, {text!r}, renders to {len(step_ids)} "
                f"token(s) but the record to {len(record_ids)}"
            )
        rows[counted, t] = np.array(step_ids, dtype=np.int64)[counted]
    return rows, None


class ChatTemplate:
    """A Hugging Face tokenizer folder's chat template (tokenizer_config.json's
    `chat_template`, or chat_template.jinja), rendered with jinja2 as transformers renders it.
    A chat record is the rendering of its turns; the mask is 1 on the tokens of each assistant
    turn's text, what the template adds after the turns before it (the turn's content and its
    end token)."""

    # One per tokenizer object, gone with it (an id() key could be reused by the next one).
    _cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __init__(self, tokenizer, where: str):
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        config = getattr(tokenizer, "config", None) or {}
        text = config.get("chat_template")
        if isinstance(text, list):  # named templates: the default one
            text = next((t["template"] for t in text if t.get("name") == "default"), None)
        path = getattr(tokenizer, "path", None)
        if text is None and path is not None and (Path(path) / "chat_template.jinja").is_file():
            text = (Path(path) / "chat_template.jinja").read_text(encoding="utf-8")
        if not text or not hasattr(tokenizer, "tokenizer"):
            raise ValueError(
                f"{where}: a chat record (messages) needs a tokenizer with a chat template; "
                f"{getattr(tokenizer, 'name', 'this tokenizer')!r} has none. Allowed: --tokenizer FOLDER whose "
                "tokenizer_config.json holds chat_template, or prompt/completion records"
            )

        def raise_exception(message):
            raise ValueError(f"{where}: the chat template refused the record: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        env.globals["raise_exception"] = raise_exception
        self.template = env.from_string(text)
        self.specials = {
            name: (value.get("content") if isinstance(value, dict) else value)
            for name in ("bos_token", "eos_token", "pad_token", "unk_token")
            if (value := config.get(name)) is not None
        }
        self.encoder = tokenizer.tokenizer  # the `tokenizers` object, not the cache's key

    @classmethod
    def of(cls, tokenizer, where: str) -> ChatTemplate:
        if tokenizer not in cls._cache:
            cls._cache[tokenizer] = cls(tokenizer, where)
        return cls._cache[tokenizer]

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt, **self.specials)

    def encode(self, record: Record) -> tuple[list[int], list[int]]:
        messages = record.messages
        text, spans = self.render(messages, False), []
        for k, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            before, upto = self.render(messages[:k], True), self.render(messages[: k + 1], False)
            if not (upto.startswith(before) and text.startswith(upto)):
                raise ValueError(
                    f"{record.where}: the chat template does not render turn {k} as an extension of the turns "
                    "before it, so its tokens cannot be told apart; allowed: a template whose rendering of a "
                    "conversation's first turns begins its rendering of the whole"
                )
            spans.append((len(before), len(upto)))
        tok = self.encoder
        tok.encode_special_tokens = False  # the template's own special tokens are special here
        try:
            encoding = tok.encode(text, add_special_tokens=False)
        finally:
            tok.encode_special_tokens = True
        mask = [int(any(a <= start < b for a, b in spans)) for start, _ in encoding.offsets]
        return list(encoding.ids), mask


def meta_of(record: Record) -> dict:
    """A record's metadata line: its ``depth`` and ``steps``, or each turn's under ``turns``."""
    return record.meta if record.turns is None else {TURNS: [turn.meta for turn in record.turns]}


def max_steps_of(record: Record) -> int:
    """The most per-step targets of any answer in the record."""
    return max(len(turn.meta.get("steps", ())) for turn in plain_turns(record))


class RecordIndex:
    """One split's record starts (token offsets) and metadata lines, written at close."""

    def __init__(self, out_dir: Path, split: str):
        self.out_dir, self.split = out_dir, split
        self.starts = [0]
        self.meta_file = f"{split}_meta.jsonl"
        self.meta = open(out_dir / self.meta_file, "w", encoding="utf-8")

    def add(self, batch: list[Record], lengths: list[int]) -> None:
        for record, tokens in zip(batch, lengths):
            self.starts.append(self.starts[-1] + tokens)
        self.meta.write("".join(json.dumps({"where": r.where, **meta_of(r)}, sort_keys=True) + "\n" for r in batch))

    def close(self) -> dict:
        self.meta.close()
        name = f"{self.split}_records.bin"
        np.asarray(self.starts, dtype="<i8").tofile(self.out_dir / name)
        return {"records": len(self.starts) - 1, "records_file": name, "meta_file": self.meta_file}


def pack(starts: np.ndarray, capacity: int, together: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Greedy in-order packing of whole records into sequences of at most ``capacity``
    tokens (one record each unless ``together``): (sequence start, sequence end) token
    offsets, and the records that did not fit in any (longer than ``capacity``), left out."""
    lengths = np.diff(starts)
    if not together:
        fits = lengths <= capacity
        return starts[:-1][fits].astype(np.int64), starts[1:][fits].astype(np.int64), np.flatnonzero(~fits)
    seq_starts, seq_ends, too_long = [], [], []
    open_at, used = None, 0
    for i, length in enumerate(lengths.tolist()):
        if length > capacity:
            too_long.append(i)
            continue
        if open_at is not None and used + length > capacity:
            seq_starts.append(open_at)
            seq_ends.append(open_at + used)
            open_at = None
        if open_at is None:
            open_at, used = int(starts[i]), 0
        elif int(starts[i]) != open_at + used:  # a dropped record in between: start afresh
            seq_starts.append(open_at)
            seq_ends.append(open_at + used)
            open_at, used = int(starts[i]), 0
        used += length
    if open_at is not None:
        seq_starts.append(open_at)
        seq_ends.append(open_at + used)
    return np.array(seq_starts, np.int64), np.array(seq_ends, np.int64), np.array(too_long, np.int64)


def record_source(dataset_dir: Path, meta_file: str, index: int) -> str:
    """The ``where`` (file:line) of record ``index`` of a split, for error messages."""
    with open(dataset_dir / meta_file, encoding="utf-8") as f:
        for k, line in enumerate(f):
            if k == index:
                return json.loads(line).get("where", f"record {index}")
    return f"record {index}"
