"""The suite's disk hygiene: a module's shared runs (conftest's module_tmp) and each test's
tmp_path go once they pass, and stay for a look when something failed."""

pytest_plugins = ["pytester"]

MODULE = """
import pytest

@pytest.fixture(scope="module")
def run(module_tmp):
    folder = module_tmp("run")
    (folder / "checkpoint").write_bytes(b"0" * 1024)
    return folder

def test_first(run):
    assert (run / "checkpoint").is_file()

def test_second(run):
    assert {outcome}
"""


def run_module(pytester, outcome: str):
    pytester.makeconftest("from tests.conftest import module_tmp  # noqa: F401")
    pytester.makepyfile(test_shared=MODULE.format(outcome=outcome))
    base = pytester.path / "base"
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--basetemp", str(base))
    return result, base


def test_module_tmp_goes_when_the_module_passes(pytester):
    result, base = run_module(pytester, "True")
    result.assert_outcomes(passed=2)
    assert not list(base.glob("run*"))


def test_module_tmp_stays_when_a_test_of_the_module_fails(pytester):
    result, base = run_module(pytester, "False")
    result.assert_outcomes(passed=1, failed=1)
    assert (base / "run0" / "checkpoint").is_file()


def test_each_tests_tmp_path_goes_when_it_passes(pytestconfig):
    assert pytestconfig.getini("tmp_path_retention_policy") == "failed"
