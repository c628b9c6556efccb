"""The collection order and the suite's two parts that CI's scheduling relies on
(tests/conftest.py: LONGEST_FIRST, `--suite-part`)."""

from tests.conftest import LONGEST_FIRST, TESTS, module_of, suite_part


def test_longest_first_names_modules_that_exist():
    missing = [name for name in LONGEST_FIRST if not (TESTS / name).is_file()]
    assert not missing, f"tests/conftest.py LONGEST_FIRST names modules that do not exist: {missing}"


def test_the_collection_starts_with_the_longest_modules(request):
    """As collected in this run: LONGEST_FIRST's modules, longest first, then the others."""
    order = list(dict.fromkeys(module_of(item) for item in request.session.items))
    ranked = [name for name in order if name in LONGEST_FIRST]
    assert ranked == sorted(ranked, key=lambda name: -LONGEST_FIRST[name])
    assert order[: len(ranked)] == ranked


def test_every_test_folder_has_a_budget_within_the_suites():
    """tests/budget.py: each folder of test modules is an area with a budget, and the areas'
    budgets fit the suite's."""
    from tests.budget import BUDGET_S, SUITE_BUDGET_S, area_of

    areas = {area_of(path.relative_to(TESTS).as_posix()) for path in TESTS.rglob("test_*.py")}
    assert areas == set(BUDGET_S), areas ^ set(BUDGET_S)
    assert sum(BUDGET_S.values()) <= SUITE_BUDGET_S


def test_budget_charges_each_area_its_tests_seconds(tmp_path, capsys):
    from tests.budget import BUDGET_S, main

    log = tmp_path / "durations.log"
    log.write_text(
        "============ slowest durations ============\n"
        "120.50s setup    tests/infra/test_presets.py::test_preset_starts_at_its_layout[dense_debug]\n"
        "3.25s call     tests/infra/test_presets.py::test_preset_starts_at_its_layout[dense_debug]\n"
        "0.01s teardown tests/test_launcher.py::test_a_timeout_kills_the_job\n"
        f"{BUDGET_S['docs'] + 1}.00s call     tests/docs/test_docs.py::test_documented_commands_run\n"
    )
    assert main([str(log)]) == 1  # docs is over its budget
    lines = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()[1:]}
    assert lines["infra"][:2] == ["124", str(BUDGET_S["infra"])]
    assert lines["top"][0] == "0" and lines["docs"][-1] == "over"
    log.write_text(log.read_text().replace(f"{BUDGET_S['docs'] + 1}.00s", "1.00s"))
    assert main([str(log)]) == 0
    log.write_text("no durations here\n")
    assert main([str(log)]) == 1


class _Item:
    def __init__(self, module: str, slow: bool):
        self.path, self.slow = TESTS / module, slow

    def get_closest_marker(self, name: str):
        return object() if name == "slow" and self.slow else None


def test_the_suite_parts_split_whole_modules_by_whether_one_holds_a_slow_test():
    """The training part: every module that holds a slow test, its fast tests with it (its
    shared fixture then runs once); the unit part: the rest; together the whole suite once."""
    items = [_Item("infra/a.py", False), _Item("infra/a.py", True), _Item("data/b.py", False), _Item("c.py", False)]
    items.append(_Item("c.py", True))
    training, rest = suite_part(items, "training")
    unit, rest_of_unit = suite_part(items, "unit")
    assert [i.path.name for i in training] == ["a.py", "a.py", "c.py", "c.py"]
    assert [i.path.name for i in unit] == ["b.py"]
    assert rest == unit and rest_of_unit == training
