"""The comparison methods, one module each, beside the GRT they are compared with
(docs/methods.md): each module holds its parts (`Part` subclasses: its modules, rules, start-up
checks and FLOPs terms), the math they run and its own `[grt]` settings.

    table.py             the paper's methods as named sets of parts: table 1 and figure 5's ladder
    mor.py               Mixture-of-Recursions, expert choice (a router per step)
    mor_token_choice.py  Mixture-of-Recursions, token choice (each token its depth)
    ouro.py              Ouro's exit distribution (per-step readouts, a learned exit)
    rrt.py               Relaxed Recursive Transformers' per-step LoRA adapters
    poisson.py           the heavy-tail Poisson row: its random initial state and depth law
    scse.py              Source-Centered State Evolution (injection, update, anchor)
    step_supervision.py  per-step targets (every step read out toward its own target)

A method is one module here, listed in `MODULES`, a row in table.py and its TOML
(docs/methods.md, "The recipe").
"""

from . import mor, mor_token_choice, ouro, poisson, rrt, scse, step_supervision

# Each module's `PARTS` joins the table of parts (grt_titan/model/part_table.py) and its
# `SETTINGS` the args' bases (grt_titan/model/args.py), both in this order: the order their
# rules are checked and `[grt]` lists their settings.
MODULES = (poisson, scse, rrt, ouro, step_supervision, mor, mor_token_choice)
