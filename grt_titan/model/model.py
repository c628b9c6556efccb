"""The Gated Recurrent Transformer: embeddings, prelude, recurrence, coda, LM head.

Single-device math only: every parallel plan lives in grt_titan/infra/.

Initialisation (`init_weights`, run after the meta-device build):

| parameter                               | init                                        |
|-----------------------------------------|---------------------------------------------|
| tok_embeddings (tied LM head for gpt2)  | normal(0, 0.02) gpt2; normal(0, 1) llama    |
| pos_embeddings (gpt2)                   | normal(0, 0.02)                             |
| block q/k/v, mlp in                     | trunc normal(0, 0.02), biases 0             |
| block out projections (wo, w2)          | trunc normal(0, 0.02 / sqrt(2 (p + nR + c)))|
| recurrence.step.proj (W_proj)           | trunc normal(0, 0.02)                       |
| gate w_in / w_out                       | trunc normal(0, 0.02); w_out bias = +4      |
| norms                                   | weight 1, bias 0                            |
| output (llama, untied)                  | trunc normal(0, dim^-0.5), cut at 3 std     |
| exit_gate (Ouro, objective exit_distribution) | trunc normal(0, 0.02), bias 0         |

tok_embeddings and output have `padded_vocab_size` rows (`vocab_multiple_of`, default 1 =
no padding); rows >= vocab_size are initialised like the others, are never an input id or a
target, and their logits stay in the training softmax (nanoGPT / Megatron do the same).
The Hugging Face export drops them (grt_titan/hf/convert.py), so generation never emits them.
"""

from __future__ import annotations

import torch
from torch import nn

from .args import GRTModelArgs
from .blocks import BlockStack, rope_table
from .blocks.init import trunc_normal_
from .blocks.rows import Rows
from .halting.rules import LEARNED_RULE, HaltingProbe, halting_of_call, halting_recurrence, learned_halting_of_call
from .methods.ouro import exit_forward
from .methods.step_supervision import step_supervised_readout
from .part import TrainingOutput, slot
from .recurrence import Recurrence


class GRTModel(nn.Module):
    """prelude (p blocks) -> recurrence (n shared blocks x r) -> coda (c blocks) -> head.

    What torchtitan 0.2.2's trainer calls (its ModelProtocol, duck-typed): the constructor
    on `model_args`, `init_weights(buffer_device)`, `forward` and `get_attention_masks`.
    """

    def __init__(self, model_args: GRTModelArgs):
        super().__init__()
        model_args.validate()
        self.model_args = args = model_args
        self.tok_embeddings = nn.Embedding(args.padded_vocab_size, args.dim)
        self.pos_embeddings = nn.Embedding(args.max_seq_len, args.dim) if args.block_style == "gpt2" else None
        if args.block_style != "gpt2":  # llama: complex freqs_cis; qwen3: cos/sin cache
            self.register_buffer("freqs_cis", self._precompute_freqs_cis(), persistent=False)
        else:
            self.freqs_cis = None
        self.prelude = BlockStack(args, args.n_prelude_layers, first_layer_id=0)
        self.recurrence = Recurrence(args) if args.is_recurrent else None
        self.coda = BlockStack(args, args.n_coda_layers, first_layer_id=args.n_prelude_layers + args.n_core_layers)
        norm_cls = nn.LayerNorm if args.block_style == "gpt2" else nn.RMSNorm
        self.norm = norm_cls(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.padded_vocab_size, bias=False)
        # The objective's module: Ouro's exit gate on each step's readout (objective = "exit_distribution").
        self.exit_gate = slot(args, "readout").build(args)
        self.tie_weights()

    def tie_weights(self) -> None:
        # Re-done in init_weights: materialising a meta model can untie parameters.
        if self.model_args.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def _precompute_freqs_cis(self) -> torch.Tensor:
        """The RoPE table of the block style (`blocks.rope_table`), held in `freqs_cis`."""
        return rope_table(self.model_args)

    def init_weights(self, buffer_device: torch.device | None = None) -> None:
        args = self.model_args
        if args.block_style != "gpt2":
            buffer_device = buffer_device or self.freqs_cis.device
            with torch.device(buffer_device):
                self.freqs_cis = self._precompute_freqs_cis()
        self.tie_weights()
        if args.tie_embeddings:
            nn.init.normal_(self.tok_embeddings.weight, std=0.02)
        else:
            nn.init.normal_(self.tok_embeddings.weight)
            std = args.dim**-0.5
            trunc_normal_(self.output.weight, std=std, a=-3 * std, b=3 * std)
        if self.pos_embeddings is not None:
            nn.init.normal_(self.pos_embeddings.weight, std=0.02)
        self.prelude.init_weights()
        if self.recurrence is not None:
            self.recurrence.init_weights()
        self.coda.init_weights()
        self.norm.reset_parameters()
        if self.exit_gate is not None:
            self.exit_gate.init_weights()

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        if self.pos_embeddings is not None:
            positions = torch.arange(tokens.shape[1], device=tokens.device)
            h = h + self.pos_embeddings(positions)
        return h

    def forward(
        self,
        tokens: torch.Tensor,
        attention_masks: object | None = None,
        positions: torch.Tensor | None = None,
        num_recurrences: int | None = None,
        step_labels: torch.Tensor | None = None,
    ) -> torch.Tensor | TrainingOutput:
        """Logits [B, S, padded_vocab_size] for `tokens` [B, S] (columns >= vocab_size are
        the padding rows of `vocab_multiple_of`; the tokenizer never emits those ids).
        A training forward of objective = "exit_distribution" returns a `TrainingOutput`.

        `num_recurrences`: depth r of this call (0 = prelude only, r < R early exit,
        r > R extrapolation). None: sampled per the config in training, the eval depth
        (default R) in eval mode.
        A MoR training forward returns `TrainingOutput(logits, aux_loss_sum=...)` (the
        router's auxiliary loss); every eval forward returns plain logits.
        `step_labels` [B, S, K]: the batch's per-step targets (the loader's, with
        step_supervision), handed through to the loss in the `TrainingOutput`.
        """
        if attention_masks is not None or positions is not None:
            raise ValueError("GRT supports causal sdpa attention only (no masks, no positions)")
        h = self.prelude(self.embed(tokens), self.freqs_cis)
        if self.exit_gate is not None and (self.training or self.model_args.exit_threshold < 1):
            return self.exit_readout(h, num_recurrences)
        if self.training and self.model_args.step_supervision and self.supervises_steps():
            states = self.recurrence(h, self.freqs_cis, num_recurrences, all_states=True).step_states
            return step_supervised_readout(self, states, step_labels) if states else self.logits_from_state(h)
        aux_loss_sum = None
        if self.recurrence is not None:
            out = self.recurrence(h, self.freqs_cis, num_recurrences)
            h, aux_loss_sum = out.state, out.aux_loss_sum  # aux: MoR's router loss (training)
        elif num_recurrences:
            raise ValueError(f"num_recurrences = {num_recurrences} given to a dense model (no core)")
        logits = self.logits_from_state(h)
        if aux_loss_sum is not None:
            return TrainingOutput(logits, aux_loss_sum=aux_loss_sum)
        return logits

    def supervises_steps(self) -> bool:
        """Per-step supervision this training forward: within the first `step_supervision_steps`
        optimizer steps (0: every step). The depth sampler's count is this forward's index
        (it draws inside the recurrence), persistent, so a resume switches at the same step."""
        until, sampler = self.model_args.step_supervision_steps, self.recurrence.depth_sampler
        return until == 0 or sampler.step_of(sampler.forwards) < until

    def forward_with_halting(
        self,
        tokens: torch.Tensor,
        halting: str,
        halting_threshold: float,
        min_recurrences: int | None = None,
        num_recurrences: int | None = None,
        probe: HaltingProbe | None = None,
        may_halt: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, each token's depth `[B, S]`) of an eval forward in which each token halts by
        `halting`'s rule (halting.py; the exported model's `halting=...`, or "learned" with a
        `probe` fitted to this model), after at least `min_recurrences` (default 1) and at most
        `num_recurrences` (default the eval depth) steps. `may_halt` (bool `[B, S]` or `[S]`;
        None: every token): the tokens the rule may halt, the others (a prompt that later
        tokens read) running to the maximum depth."""
        if self.recurrence is None:
            raise ValueError(f"halting = {halting!r} given to a dense model (no core)")
        if self.training:  # before resolve_depth, which samples a depth in training
            raise ValueError("per-token halting is an evaluation mode: call model.eval() first")
        if halting is None:
            raise ValueError("halting = None: forward_with_halting needs a rule; a fixed depth is forward(...)")
        depth = self.recurrence.resolve_depth(num_recurrences)  # eval: None is the eval depth
        args = self.model_args
        if halting == LEARNED_RULE:
            plan = learned_halting_of_call(probe, halting_threshold, min_recurrences, depth, args.dim)
        elif probe is not None:
            raise ValueError(f"probe given with halting = {halting!r}: only halting = {LEARNED_RULE!r} reads one")
        else:
            plan = halting_of_call(halting, halting_threshold, min_recurrences, depth)
        own = [f"router = {args.router!r}"] if args.part("router") is not None else []
        if self.exit_gate is not None and args.exit_threshold < 1:
            own.append(f"exit_threshold = {args.exit_threshold} (Ouro's per-token exit)")
        if own:
            raise ValueError(
                f"halting = {halting!r} is not supported with {own[0]}: that model chooses each token's "
                "steps itself; allowed: halting = None"
            )
        if plan.rule == "gate" and not hasattr(self.recurrence.step, "gate"):
            raise ValueError(
                f"halting = 'gate' needs the gate (update = 'gate'); this model's update is {args.update!r}"
            )
        if may_halt is not None and (
            may_halt.dtype != torch.bool or may_halt.shape not in (tokens.shape, tokens.shape[1:])
        ):
            raise ValueError(
                f"may_halt: a bool tensor of the tokens' shape {tuple(tokens.shape)} or {tuple(tokens.shape[1:])}, "
                f"got {may_halt.dtype} of shape {tuple(may_halt.shape)}"
            )
        h = self.prelude(self.embed(tokens), self.freqs_cis)
        h, depths, logits = halting_recurrence(
            self.recurrence, h, self.freqs_cis, plan, self, args.vocab_size, probe, may_halt
        )
        return (self.logits_from_state(h) if logits is None else logits), depths

    def logits_from_state(self, h: torch.Tensor, rows: Rows | None = None) -> torch.Tensor:
        """Coda, final norm and LM head on a state h [B, S, dim]: the end of `forward`.

        Its own method so that a state captured after any recurrence step can be read out
        (per-depth loss in `grt-titan analyze`, early exit) exactly as `forward` would.
        `rows` (blocks/rows.py): those positions' logits alone, [N, V], the coda's keys and
        values still covering every position (per-step supervision's readout).
        """
        return self.output(self.final_hidden(h, rows))

    def final_hidden(self, h: torch.Tensor, rows: Rows | None = None) -> torch.Tensor:
        """Coda and final norm on a state h: the hidden state the LM head reads."""
        return self.norm(self.coda(h, self.freqs_cis, rows=rows))

    def exit_readout(self, h_pre: torch.Tensor, num_recurrences: int | None) -> torch.Tensor | TrainingOutput:
        """Ouro: every step's state read out and weighed by the exit gate (methods/ouro.py).
        Eval with exit_threshold = 1 never comes here: the last step is the plain forward."""
        states = self.recurrence(h_pre, self.freqs_cis, num_recurrences, all_states=True).step_states
        if not states:  # r = 0: the prelude-only readout, no step to exit at
            return self.logits_from_state(h_pre)
        return exit_forward(self, states)

    def get_attention_masks(self, *args, **kwargs):
        # TypeError is what torchtitan's trainer and validator expect for sdpa models.
        raise TypeError("GRT uses causal sdpa attention: no attention masks to build")


def build_meta_model(args: GRTModelArgs) -> GRTModel:
    """The model's structure without storage: parameter names and shapes for free."""
    with torch.device("meta"):
        return GRTModel(args)
