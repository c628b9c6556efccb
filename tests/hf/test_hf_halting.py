"""Per-token halting in the Hugging Face model (grt_titan/hf/remote/halting_grt.py; docs/generation.md,
"Per-token halting"): each rule by hand on rows whose tokens see only themselves (the readout
rules' distributions from the fixed-depth forward's step logits), the two threshold limits
against the fixed-depth forward, cached = uncached decoding under every rule
(per_step: exact, the halted tokens' last K/V standing in for their later steps), the
compressed strategies' exact prefill, left padding, the torchtitan model's evaluation path
(grt_titan/model/halting/rules.py) against the export, and the refusals."""

import pytest
import torch

from grt_titan.hf.convert import write_hf_folder
from grt_titan.model.halting.rules import HALTING_RULES, READOUT_RULES, never_halts

from hf_helpers import (
    ATOL,
    SMALL_VOCAB,
    assert_left_padded_rows_generate_alone,
    cache_class,
    greedy,
    load_hf,
    prompt,
    seeded_model,
    small_args,
)

RULES = HALTING_RULES
MAX_DEPTH = 6  # above R = 4: halting may extrapolate
INF = float("inf")
# The thresholds that halt every token at the minimum: argmax counts steps, the other rules'
# measures fall below the threshold (the ones that never halt: `never_halts`).
AT_MIN = {"argmax": 0.0}


def step_measures(hf, ids, rule, depth=MAX_DEPTH):
    """By hand, from the fixed-depth forward (no token halted): the rule's measure after each
    step 1..depth, `[depth, B, T]`; the readout rules' from its step logits (coda and head on
    h_s), p_0 uniform."""
    with torch.no_grad():
        out = hf(ids, num_recurrences=depth, output_recurrence=True, output_step_logits=True, use_cache=False)
    states = out.recurrence_states
    if rule == "state":
        return torch.stack(
            [
                torch.linalg.vector_norm(states[s] - states[s - 1], dim=-1)
                / torch.linalg.vector_norm(states[s], dim=-1)
                for s in range(1, depth + 1)
            ]
        )
    if rule == "gate":
        return torch.stack([1 - g.mean(-1) for g in out.gate_values])
    logits = out.step_logits[1:]  # steps 1..depth (step_logits[0] reads out h_0)
    vocab = logits[0].shape[-1]
    if rule == "argmax":
        tops = [lg.argmax(-1) for lg in logits]
        counts = [torch.zeros_like(tops[0])]
        for s in range(1, depth):
            counts.append(torch.where(tops[s] == tops[s - 1], counts[-1] + 1, 0))
        return torch.stack(counts).float()
    probs = [torch.full_like(logits[0].float(), 1 / vocab)] + [lg.float().softmax(-1) for lg in logits]
    if rule == "kl":  # KL(p_{s-1} || p_s)
        return torch.stack(
            [(probs[s - 1] * (probs[s - 1].log() - probs[s].log())).sum(-1) for s in range(1, depth + 1)]
        )
    entropy = [-(p * p.log()).sum(-1) for p in probs]
    return torch.stack([(entropy[s] - entropy[s - 1]).abs() for s in range(1, depth + 1)])


def halts_by_hand(rule, measures, threshold):
    return measures >= threshold if rule == "argmax" else measures < threshold


def mixed_threshold(hf, ids, rule, min_depth=1):
    """A threshold at which the tokens of `ids` halt at different depths: in the widest gap
    between the middle half of the tokens' measures after step min + 1, so that no measure sits at it (the two models'
    ~1e-6 differences cannot flip a decision)."""
    values = step_measures(hf, ids, rule)[min_depth].flatten().sort().values  # after step min + 1
    if rule == "argmax":  # counts: a threshold between two counts
        return float(values[len(values) // 2]) + 0.5
    n = len(values)
    gaps = values[n // 4 + 1 : 3 * n // 4 + 1] - values[n // 4 : 3 * n // 4]
    i = n // 4 + int(gaps.argmax())
    return float((values[i] + values[i + 1]) / 2)


def halted(hf, ids, **kwargs):
    with torch.no_grad():
        return hf(ids, use_cache=False, num_recurrences=MAX_DEPTH, **kwargs)


@pytest.mark.parametrize("rule", RULES)
def test_threshold_zero_is_the_fixed_depth_and_infinity_the_minimum(rule, hf_models):
    hf = hf_models["gpt2"]
    ids = prompt(batch=2, seq=9)
    with torch.no_grad():
        fixed = hf(ids, num_recurrences=MAX_DEPTH, use_cache=False).logits
        shallow = hf(ids, num_recurrences=2, use_cache=False).logits
    never = halted(hf, ids, halting=rule, halting_threshold=never_halts(rule))
    assert torch.equal(never.logits, fixed) and (never.recurrence_depths == MAX_DEPTH).all()
    always = halted(hf, ids, halting=rule, halting_threshold=AT_MIN.get(rule, INF), min_recurrences=2)
    assert torch.equal(always.logits, shallow) and (always.recurrence_depths == 2).all()


@pytest.mark.parametrize("style", ["gpt2", "llama"])
@pytest.mark.parametrize("rule", RULES)
def test_each_rule_by_hand_on_rows_of_one_token(rule, style, hf_models):
    """One-token rows see only themselves: a token's depth is the first step s >= min whose
    measure (by hand, from the fixed-depth states) is below the threshold, and its logits are
    the fixed-depth forward's at that depth."""
    hf = hf_models[style]
    ids = prompt(batch=12, seq=1, seed=3)
    min_depth = 2
    measures = step_measures(hf, ids, rule)  # [depth, B, 1]
    threshold = mixed_threshold(hf, ids, rule, min_depth)
    steps = torch.arange(1, MAX_DEPTH + 1)[:, None, None]
    below = halts_by_hand(rule, measures, threshold) & (steps >= min_depth)
    expected = torch.where(
        below.any(0), below.int().argmax(0) + 1, torch.full_like(below[0], MAX_DEPTH, dtype=torch.long)
    )
    assert len(expected.unique()) > 1, expected  # a mix of depths
    out = halted(hf, ids, halting=rule, halting_threshold=threshold, min_recurrences=min_depth)
    assert torch.equal(out.recurrence_depths, expected)
    for row, depth in enumerate(expected[:, 0].tolist()):
        with torch.no_grad():
            alone = hf(ids[row : row + 1], num_recurrences=depth, use_cache=False).logits
        assert torch.allclose(out.logits[row : row + 1], alone, atol=1e-5, rtol=0), (row, depth)


@pytest.mark.parametrize("rule", RULES)
def test_hidden_states_hold_each_tokens_state_and_readout_at_its_depth(rule, hf_models):
    """`output_hidden_states` under halting, on one-token rows (each sees only itself): the
    recurrence entries hold each token's state, frozen from the step it halted at, and the
    coda entries its readout at that depth (a readout rule's from the step that decided),
    each equal to the fixed-depth forward's at the token's depth; the head on the last entry
    gives the logits."""
    hf = hf_models["gpt2"]
    ids = prompt(batch=12, seq=1, seed=3)
    threshold = mixed_threshold(hf, ids, rule)
    out = halted(hf, ids, halting=rule, halting_threshold=threshold, output_hidden_states=True)
    depths = out.recurrence_depths[:, 0].tolist()
    assert len(set(depths)) > 1, depths
    prelude, coda = hf.config.num_prelude_layers, hf.config.num_coda_layers
    hidden = out.hidden_states
    steps = hidden[1 + prelude : len(hidden) - coda]
    assert len(steps) == max(depths)  # the loop ends when every token has halted
    with torch.no_grad():
        assert torch.allclose(hf.lm_head(hf.model.norm(hidden[-1])), out.logits, atol=1e-5, rtol=0)
        for row, depth in enumerate(depths):
            alone = hf(ids[row : row + 1], num_recurrences=depth, use_cache=False, output_hidden_states=True)
            state = alone.hidden_states[prelude + depth]  # h_depth
            for step in steps[depth - 1 :]:
                assert torch.allclose(step[row : row + 1], state, atol=1e-5, rtol=0), (row, depth)
            for mine, reference in zip(hidden[-coda:], alone.hidden_states[-coda:]):
                assert torch.allclose(mine[row : row + 1], reference, atol=1e-5, rtol=0), (row, depth)


@pytest.mark.parametrize("style", ["gpt2", "llama"])
@pytest.mark.parametrize("rule", RULES)
def test_torchtitan_evaluation_path_agrees_with_the_export(rule, style, native_models, hf_models):
    """`GRTModel.forward_with_halting` (halted tokens' K/V substituted at each core block's
    attention) gives the export's depths and logits."""
    native, hf = native_models[style], hf_models[style]
    ids = prompt(batch=2, seq=12, seed=4)
    threshold = mixed_threshold(hf, ids, rule)
    out = halted(hf, ids, halting=rule, halting_threshold=threshold, min_recurrences=2)
    with torch.no_grad():
        logits, depths = native.forward_with_halting(ids, rule, threshold, min_recurrences=2, num_recurrences=MAX_DEPTH)
    assert len(depths.unique()) > 1 and torch.equal(depths, out.recurrence_depths)
    assert (logits[..., :SMALL_VOCAB] - out.logits).abs().max().item() < ATOL
    with pytest.raises(ValueError, match="min_recurrences = 7 > num_recurrences = 6"):
        native.forward_with_halting(ids, rule, threshold, min_recurrences=7, num_recurrences=MAX_DEPTH)


@pytest.fixture(scope="module")
def two_coda_blocks(tmp_path_factory):
    """The gpt2 model with two coda blocks: the second's K/V of a halted token depend on the
    tokens still running, so a readout rule must keep (and cache) its last step's."""
    args = small_args("gpt2").replace(n_coda_layers=2)
    model = seeded_model(args, seed=1)
    folder = write_hf_folder(
        tmp_path_factory.mktemp("two_coda") / "hf", model.state_dict(), args, write_tokenizer=False
    )
    return model, load_hf(folder)


@pytest.mark.parametrize("rule", READOUT_RULES)
def test_readout_rules_keep_a_halted_tokens_coda_kv(rule, two_coda_blocks):
    """Cached decoding = the uncached forward, and the torchtitan path = the export, with two
    coda blocks (without the halted tokens' coda K/V kept, both fail)."""
    native, hf = two_coda_blocks
    ids = prompt(batch=2, seq=12, seed=21)
    kwargs = {"halting": rule, "halting_threshold": mixed_threshold(hf, ids, rule)}
    full = halted(hf, ids, **kwargs)
    assert len(full.recurrence_depths.unique()) > 1
    logits, depths = decode_with_cache(hf, ids, "per_step", prefix=6, **kwargs)
    assert torch.equal(depths, full.recurrence_depths)
    assert (logits - full.logits[:, 5:]).abs().max().item() < 1e-4
    with torch.no_grad():
        native_logits, native_depths = native.forward_with_halting(
            ids, rule, kwargs["halting_threshold"], num_recurrences=MAX_DEPTH
        )
    assert torch.equal(native_depths, full.recurrence_depths)
    assert (native_logits[..., :SMALL_VOCAB] - full.logits).abs().max().item() < ATOL


def decode_with_cache(hf, ids, strategy, prefix, **kwargs):
    """Logits of the prefill's last token, then of each later token fed one by one."""
    cache = cache_class(hf)(hf.config, strategy=strategy)
    with torch.no_grad():
        out = [hf(ids[:, :prefix], past_key_values=cache, num_recurrences=MAX_DEPTH, **kwargs)]
        for t in range(prefix, ids.shape[1]):
            out.append(hf(ids[:, t : t + 1], past_key_values=cache, num_recurrences=MAX_DEPTH, **kwargs))
    logits = torch.stack([o.logits[:, -1] for o in out], 1)
    depths = torch.cat([out[0].recurrence_depths] + [o.recurrence_depths for o in out[1:]], 1)
    return logits, depths


@pytest.mark.parametrize("rule", RULES)
def test_a_context_prefilled_at_full_depth_decodes_as_the_batched_forward_holding_it(rule, native_models, hf_models):
    """The export's cached decode with its context prefilled at the rule's never-halting
    threshold (as eval-task, the depth benchmark and `Generator` decode), each later token then
    one decode step under the rule, makes the batched forward's halting decisions with that
    context held (`may_halt`): the same depths, token by token, and the same logits."""
    native, hf = native_models["gpt2"], hf_models["gpt2"]
    ids, context = prompt(batch=2, seq=14, seed=8), 6
    threshold = mixed_threshold(hf, ids, rule)
    may_halt = torch.arange(ids.shape[1]) >= context
    with torch.no_grad():
        logits, depths = native.forward_with_halting(ids, rule, threshold, num_recurrences=MAX_DEPTH, may_halt=may_halt)
    assert (depths[:, :context] == MAX_DEPTH).all() and len(depths[:, context:].unique()) > 1
    cache = cache_class(hf)(hf.config, strategy="per_step")
    call = {"halting": rule, "num_recurrences": MAX_DEPTH, "past_key_values": cache}
    with torch.no_grad():
        out = [hf(ids[:, :context], halting_threshold=never_halts(rule), **call)]
        out += [hf(ids[:, t : t + 1], halting_threshold=threshold, **call) for t in range(context, ids.shape[1])]
    decoded = torch.cat([o.recurrence_depths for o in out], 1)
    assert torch.equal(decoded, depths)
    decoded_logits = torch.cat([o.logits for o in out], 1)
    assert (decoded_logits - logits[..., :SMALL_VOCAB]).abs().max().item() < ATOL


@pytest.mark.parametrize("style", ["gpt2", "llama"])
@pytest.mark.parametrize("rule", RULES)
def test_cached_decoding_equals_the_uncached_forward(rule, style, hf_models):
    hf = hf_models[style]
    ids = prompt(batch=2, seq=14, seed=8)
    kwargs = {"halting": rule, "halting_threshold": mixed_threshold(hf, ids, rule)}
    full = halted(hf, ids, **kwargs)
    assert len(full.recurrence_depths.unique()) > 1
    logits, depths = decode_with_cache(hf, ids, "per_step", prefix=8, **kwargs)
    assert torch.equal(depths, full.recurrence_depths)
    assert (logits - full.logits[:, 7:]).abs().max().item() < 1e-4
    # generate() through the cache = generate() recomputing the prefix every token.
    cached = greedy(hf, ids[:1, :6], n=10, num_recurrences=MAX_DEPTH, **kwargs)
    assert torch.equal(cached, greedy(hf, ids[:1, :6], n=10, num_recurrences=MAX_DEPTH, use_cache=False, **kwargs))


@pytest.mark.parametrize("rule", ["state", "kl"])
@pytest.mark.parametrize("strategy", ["first", "last", "average"])
def test_compressed_strategies_prefill_exactly(strategy, rule, hf_models):
    """Within a call the tokens attend to each other's current (or last computed) step, as
    uncached: a prefill is exact under every strategy (a readout rule's coda keeps one K/V per
    step under each); later tokens see the strategy's K/V."""
    hf = hf_models["gpt2"]
    ids = prompt(batch=2, seq=12, seed=9)
    kwargs = {"halting": rule, "halting_threshold": mixed_threshold(hf, ids, rule)}
    full = halted(hf, ids, **kwargs)
    logits, depths = decode_with_cache(hf, ids, strategy, prefix=12, **kwargs)
    assert torch.equal(depths, full.recurrence_depths)
    assert (logits[:, 0] - full.logits[:, -1]).abs().max().item() < 1e-5
    greedy(hf, ids[:1, :6], n=4, num_recurrences=MAX_DEPTH, kv_cache_strategy=strategy, **kwargs)  # decodes


@pytest.mark.parametrize("rule", RULES)
def test_left_padded_rows_generate_as_when_alone(rule, hf_models):
    hf = hf_models["llama"]
    threshold = mixed_threshold(hf, prompt(batch=2, seq=9, seed=19), rule)
    assert_left_padded_rows_generate_alone(
        hf, num_recurrences=MAX_DEPTH, halting=rule, halting_threshold=threshold, min_recurrences=2
    )
    ids = torch.tensor([[0, 0, 5, 6]])
    out = halted(
        hf, ids, attention_mask=torch.tensor([[0, 0, 1, 1]]), halting=rule, halting_threshold=never_halts(rule)
    )
    assert out.recurrence_depths.tolist() == [[0, 0, MAX_DEPTH, MAX_DEPTH]]  # padding runs no step


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (
            {"halting": "kl_divergence", "halting_threshold": 0.1},
            f"halting = 'kl_divergence'; allowed: {RULES}",
        ),
        ({"halting": "state"}, "halting = 'state' needs halting_threshold"),
        ({"halting": "state", "halting_threshold": -0.5}, "halting_threshold = -0.5; allowed: >= 0"),
        ({"halting": "state", "halting_threshold": float("nan")}, "halting_threshold = nan; allowed: >= 0"),
        (
            {"halting": "gate", "halting_threshold": 0.1, "min_recurrences": 0},
            "min_recurrences = 0; allowed: an int >= 1",
        ),
        (
            {"halting": "gate", "halting_threshold": 0.1, "min_recurrences": 7},
            "min_recurrences = 7 > num_recurrences = 6",
        ),
        ({"halting_threshold": 0.1}, f"halting_threshold = 0.1 needs halting = one of {RULES}"),
        (
            {"halting": "argmax", "halting_threshold": -1},
            "halting_threshold = -1; allowed: >= 0 (the number of successive steps with the same argmax",
        ),
        ({"min_recurrences": 2}, "min_recurrences = 2 needs halting"),
    ],
)
def test_bad_halting_arguments_are_named(kwargs, error, hf_models):
    with pytest.raises(ValueError, match=error.replace("(", r"\(").replace(")", r"\)")):
        halted(hf_models["gpt2"], prompt(seq=4), **kwargs)


def test_the_gate_rule_needs_a_gate(tmp_path):
    args = small_args("gpt2").replace(update="overwrite")
    model = seeded_model(args)
    hf = load_hf(write_hf_folder(tmp_path / "hf", model.state_dict(), args, write_tokenizer=False))
    with pytest.raises(ValueError, match="halting = 'gate' needs the gate .*update is 'overwrite'"):
        halted(hf, prompt(seq=4), halting="gate", halting_threshold=0.1)
    with pytest.raises(ValueError, match="halting = 'gate' needs the gate .*update is 'overwrite'"):
        model.forward_with_halting(prompt(seq=4), "gate", 0.1)
    assert halted(hf, prompt(seq=4), halting="state", halting_threshold=0.1).recurrence_depths.shape == (1, 4)


def test_the_export_knows_the_training_models_rules():
    from grt_titan.hf.remote import halting_grt

    assert halting_grt.HALTING_RULES == HALTING_RULES and halting_grt.READOUT_RULES == READOUT_RULES


def test_a_readout_rule_needs_the_lm_head_and_its_cache_keeps_its_layout(hf_models):
    """The base model has no LM head to read a step out with; a cache filled by a readout rule
    (one coda K/V per step) is refused by a call that reads out once, and the other way round."""
    hf = hf_models["gpt2"]
    ids = prompt(seq=4)
    with torch.no_grad(), pytest.raises(ValueError, match="halting = 'kl' reads each step's next-token distribution"):
        hf.model(ids, halting="kl", halting_threshold=0.1, num_recurrences=MAX_DEPTH)
    for first, then in (("kl", "state"), ("state", "argmax")):
        cache = cache_class(hf)(hf.config)
        with torch.no_grad():
            hf(ids, past_key_values=cache, num_recurrences=MAX_DEPTH, halting=first, halting_threshold=0.1)
            with pytest.raises(ValueError, match="this cache was made for .* reads out otherwise"):
                hf(ids[:, :1], past_key_values=cache, num_recurrences=MAX_DEPTH, halting=then, halting_threshold=0.1)


@pytest.fixture(scope="module")
def with_probe(native_models, tmp_path_factory):
    """The gpt2 model exported with a learned-halting probe (seeded, unfitted: its decisions
    vary by token all the same), and the probe."""
    from grt_titan.model.halting.rules import HaltingProbe

    native = native_models["gpt2"]
    torch.manual_seed(3)
    probe = HaltingProbe(native.model_args.dim).eval()
    folder = write_hf_folder(
        tmp_path_factory.mktemp("probe") / "hf", native.state_dict(), native.model_args, write_tokenizer=False,
        halting_probe=probe,
    )  # fmt: skip
    return folder, load_hf(folder), probe


def test_the_learned_rule_decodes_from_the_export_that_holds_its_probe(native_models, with_probe, exported, hf_models):
    """An export written with the probe takes halting="learned": uncached it gives the torchtitan
    model's depths and logits, and a cached decode, its context prefilled at `never_halts`,
    gives the batched forward's decisions with that context held. An import leaves the probe
    out, and an export without one refuses the rule by name."""
    import json

    from grt_titan.checkpoints.hf_weights import read_hf_weights
    from grt_titan.checkpoints.load import native_state_from_hf

    native, (folder, hf, probe) = native_models["gpt2"], with_probe
    ids, context = prompt(batch=2, seq=14, seed=8), 6
    with torch.no_grad():
        h_pre = native.prelude(native.embed(ids), native.freqs_cis)
        states = native.recurrence(h_pre, native.freqs_cis, MAX_DEPTH, all_states=True).step_states
        values = (1 - torch.sigmoid(probe(states[1]))).flatten().sort().values  # after step 2
    gaps = values[7:21] - values[6:20]  # the widest gap in the middle half of the 28 tokens
    threshold = float((values[6 + int(gaps.argmax())] + values[7 + int(gaps.argmax())]) / 2)
    full = halted(hf, ids, halting="learned", halting_threshold=threshold)
    with torch.no_grad():
        logits, depths = native.forward_with_halting(ids, "learned", threshold, probe=probe, num_recurrences=MAX_DEPTH)
        held_logits, held = native.forward_with_halting(
            ids, "learned", threshold, probe=probe, num_recurrences=MAX_DEPTH, may_halt=torch.arange(14) >= context
        )
    assert len(depths.unique()) > 1 and torch.equal(full.recurrence_depths, depths)
    assert (full.logits - logits[..., :SMALL_VOCAB]).abs().max().item() < ATOL
    cache = cache_class(hf)(hf.config, strategy="per_step")
    call = {"halting": "learned", "num_recurrences": MAX_DEPTH, "past_key_values": cache}
    with torch.no_grad():
        out = [hf(ids[:, :context], halting_threshold=never_halts("learned"), **call)]
        out += [hf(ids[:, t : t + 1], halting_threshold=threshold, **call) for t in range(context, 14)]
    assert torch.equal(torch.cat([o.recurrence_depths for o in out], 1), held)
    assert len(held[:, context:].unique()) > 1
    assert (torch.cat([o.logits for o in out], 1) - held_logits[..., :SMALL_VOCAB]).abs().max().item() < ATOL
    assert json.loads((folder / "config.json").read_text())["halting_probe"] is True
    imported = native_state_from_hf(read_hf_weights(folder), native.model_args)
    assert all(torch.equal(imported[k], v) for k, v in native.state_dict().items() if k in imported)
    assert "halting_probe" not in json.loads((exported["gpt2"] / "config.json").read_text())
    with pytest.raises(ValueError, match="reads a halting probe, and this export holds none"):
        halted(hf_models["gpt2"], ids, halting="learned", halting_threshold=0.1)
