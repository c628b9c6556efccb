"""The collection order that CI's scheduling relies on (tests/conftest.py, LONGEST_FIRST)."""

from tests.conftest import LONGEST_FIRST, TESTS, module_of


def test_longest_first_names_modules_that_exist():
    missing = [name for name in LONGEST_FIRST if not (TESTS / name).is_file()]
    assert not missing, f"tests/conftest.py LONGEST_FIRST names modules that do not exist: {missing}"


def test_the_collection_starts_with_the_longest_modules(request):
    """As collected in this run: LONGEST_FIRST's modules, longest first, then the others."""
    order = list(dict.fromkeys(module_of(item) for item in request.session.items))
    ranked = [name for name in order if name in LONGEST_FIRST]
    assert ranked == sorted(ranked, key=lambda name: -LONGEST_FIRST[name])
    assert order[: len(ranked)] == ranked
