"""model/ reads like the paper (docs/architecture.md, "Package layout"): the GRT at the top of
the folder, each compared method a module of model/methods/, and a loop that calls its slots
without naming a method (docs/methods.md, "The parts")."""

import re
from pathlib import Path

MODEL = Path(__file__).resolve().parents[2] / "grt_titan" / "model"
METHOD_WORDS = re.compile(r"\b(scse|mor|ouro|rrt|router|deviation)\b", re.IGNORECASE)


def test_the_recurrence_names_no_method():
    text = (MODEL / "recurrence.py").read_text()
    assert not METHOD_WORDS.findall(text), sorted(set(METHOD_WORDS.findall(text)))


def test_the_top_of_model_is_the_grt_and_the_methods_have_a_folder():
    assert len(list(MODEL.glob("*.py"))) <= 12, sorted(p.name for p in MODEL.glob("*.py"))
    methods = {p.stem for p in (MODEL / "methods").glob("*.py")} - {"__init__", "table"}
    assert {"mor", "ouro", "rrt", "poisson", "scse"} <= methods, methods


def test_the_words_check_would_catch_a_method():
    assert METHOD_WORDS.findall("the MoR router and SCSE's deviation") == ["MoR", "router", "SCSE", "deviation"]
    assert not METHOD_WORDS.findall("more memory, routed steps")
