"""Mixture-of-Recursions (`router = "expert_choice"`) in the GRT's transformers model: the
routers and the routed recurrence, which replaces the plain loop; its cache is `MoRCache`
(cache_grt.py).

Remote code: imports torch and transformers only, exported next to modeling_grt.py.
"""

from __future__ import annotations

import torch
from torch import nn

# The annotations name transformers' base class, not GRTConfig: configuration_grt.py imports
# the parts, which import this file (an import circle).
from transformers import PretrainedConfig

from .cache_grt import MoRCache

# How a forward routes tokens through the steps (`MoRRouter`); threshold is causal (generation).
ROUTER_INFERENCE = ("threshold", "top_k")
# How a routed token's state takes the core output o = core(h) with router weight g. delta:
# h + g (o - h) (the paper's H + g f(H)); block: h + g o, the released code's `x + g * Block(x)`
# (its Block holds the residual). The first is the default: every export made before the
# field existed was trained with it and has no such field.
ROUTER_UPDATES = ("delta", "block")


class MoRRouter(nn.ModuleList):
    r"""Mixture-of-Recursions' routers (one bias-free Linear(d, 1) per step, `model.router.{i}`)
    and the routed recurrence, as grt_titan trains it (grt_titan docs/mor.md):

        for step i:  logit = w_i . h;  active = the tokens step i routes (rule below)
                     o = core(h[active])            causal attention among the row's active tokens
                     h[active] += g (o - h[active]),  g = router_scale x sigmoid(logit)   (router_update "delta")
                     h[active] += g o                 the released MoR code's update            ("block")

    Rules (`router_inference`): "threshold", a token goes on to step i while it was active at
    step i-1 and logit_i > 0 (sigmoid > 0.5), causal, what generation with a `MoRCache`
    computes; "top_k", the top-k_i of step i-1's tokens by logit, k_i = max(1, int(c_i T)),
    training's rule, which ranks the whole sequence: full forwards without cache only.
    Each sequence runs on its own (its active tokens are its own); padding never enters the core.
    """

    def __init__(self, config: PretrainedConfig):
        super().__init__(nn.Linear(config.hidden_size, 1, bias=False) for _ in range(config.num_recurrences))
        self.scale = config.router_scale
        steps = config.num_recurrences
        self.capacities = config.router_capacity or [(steps - i) / steps for i in range(steps)]
        self.default_rule = config.router_inference
        self.add_block = config.router_update == "block"  # as trained (config.json; "delta" if absent)

    def forward(self, h, depth, core, rule=None, cache=None, cache_slots=None, keep=None):
        """(h after `depth` routed steps, the states h_1..h_r, the proposals o_1..o_r: on routed
        tokens the o of h <- (1 - g) h + g o, the core output (delta) or h + it (block); h
        elsewhere). `keep` [B, T]: False for padding tokens."""
        rule = rule or self.default_rule
        if rule not in ROUTER_INFERENCE:
            raise ValueError(f"router_inference = {rule!r} is invalid; allowed: {ROUTER_INFERENCE}")
        batch, seqlen, _ = h.shape
        active = torch.ones(batch, seqlen, dtype=torch.bool, device=h.device) if keep is None else keep.bool()
        if rule == "top_k" and (cache is not None or not bool(active.all())):
            raise ValueError(
                "router_inference = 'top_k' ranks the whole sequence (not causal): it needs one call on "
                "unpadded sequences without cache (use_cache=False); generate with 'threshold'"
            )
        states, proposals = [], []
        for step in range(depth):
            logits = self[step](h).squeeze(-1)  # [B, T]; only the active tokens' are read
            if rule == "threshold":
                active = active & (logits > 0)
            else:
                k = max(1, int(self.capacities[step] * seqlen))
                chosen = logits.masked_fill(~active, float("-inf")).topk(k, dim=1).indices
                active = torch.zeros_like(active).scatter_(1, chosen, True)
            weight = (torch.sigmoid(logits) * self.scale).unsqueeze(-1)
            new_h, proposal = h.clone(), h.clone()
            for row in range(batch):
                positions = active[row].nonzero().squeeze(-1)  # causal order
                past = 0
                if cache is not None:
                    past = cache.routed_length(step, row)
                    cache.add_routed(step, row, batch, cache_slots[positions])
                if positions.numel() == 0:
                    continue
                x = h[row, positions][None]
                o = self._core(core, x, step, row, batch, past, cache)
                if self.add_block:
                    new_h[row, positions] = (x + weight[row, positions][None] * o)[0]
                    o = x + o  # the proposal in the convention h <- (1 - g) h + g o
                else:
                    new_h[row, positions] = (x + weight[row, positions][None] * (o - x))[0]
                proposal[row, positions] = o[0]
            h = new_h
            states.append(h)
            proposals.append(proposal)
        return h, states, proposals

    @staticmethod
    def _core(core, x, step, row, batch, past, cache):
        """The shared core on one sequence's routed tokens x [1, n, d], after the `past`
        tokens it routed through this step in earlier calls (their K/V in `cache`)."""
        n = x.shape[1]
        mask = None  # no past, or one query: plain causal attention
        if past and n > 1:
            query = past + torch.arange(n, device=x.device)
            mask = (torch.arange(past + n, device=x.device)[None, :] <= query[:, None])[None, None]
        o = x
        for index, block in enumerate(core):
            kv = None if cache is None else _routed_kv(cache, step, index, row, batch)
            o = block(o, None, mask, kv)
        return o


def _routed_kv(cache: MoRCache, step: int, index: int, row: int, batch: int):
    """The `kv_update` of core block `index` at `step` for sequence `row` (GRTAttention)."""
    return lambda key, value: cache.update_routed_kv(key, value, step, index, row, batch)
