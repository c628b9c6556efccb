"""The docs are how-to and reference pages, and the measurements live apart (docs/README's
layout, README.md "What depth buys"): each docs/*.md is short, says first what it is for,
and carries no dated run; each study in docs/results/ carries its date, its command and its
table; the README shows a picture that exists."""

import re
from pathlib import Path

import pytest

from grt_test_helpers import REPO

MAX_LINES = 450
PAGES = sorted((REPO / "docs").glob("*.md"))
STUDIES = sorted((REPO / "docs" / "results").glob("*.md"))
DATE = re.compile(
    r"\b20\d\d-[01]\d-[0-3]\d\b|\b(January|February|March|April|May|June|July|August|September|October|November|December) 20\d\d\b"
)
# How a lab notebook narrates the machine a run shared; a how-to page states a number and links its study.
MACHINE_NARRATIVE = re.compile(
    r"this (2-core |CPU |same |shared )?machine|beside (a|the) CI|beside other work|with other work|nothing else running",
    re.I,
)
TABLE_RULE = re.compile(r"^\|\s*:?-{3,}", re.M)
FENCED_COMMAND = re.compile(r"^```(bash|sh|shell|console)\n.*?^```", re.M | re.S)


def opening(text: str) -> tuple[str, str]:
    """The page's first line and the first paragraph after it."""
    lines = text.splitlines()
    rest = "\n".join(lines[1:]).lstrip("\n")
    return lines[0], rest.split("\n\n", 1)[0]


def page_problems(path: Path) -> list[str]:
    text = path.read_text()
    problems = []
    if (n := len(text.splitlines())) > MAX_LINES:
        problems.append(f"{n} lines (at most {MAX_LINES}: move a study to docs/results/ or split the page)")
    heading, paragraph = opening(text)
    if not heading.startswith("# "):
        problems.append(f"opens with {heading!r}, not a '# ' heading")
    if not paragraph or paragraph.startswith(("#", "```", "|", "<!--", "- ", "* ")):
        problems.append("no paragraph after the heading saying what the page is for")
    for pattern, what in ((DATE, "a date"), (MACHINE_NARRATIVE, "a narrative of the machine a run shared")):
        for match in pattern.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            problems.append(f"line {line}: {what} ({match.group(0)!r}); dated runs go in docs/results/")
    return problems


@pytest.mark.parametrize("path", PAGES, ids=[p.name for p in PAGES])
def test_each_page_is_short_says_what_it_is_for_and_holds_no_dated_run(path):
    problems = page_problems(path)
    assert not problems, f"{path.relative_to(REPO)}:\n" + "\n".join(problems)


def test_the_rules_catch_a_lab_notebook(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("## Results\n\n(2026-12-05, this 2-core machine) loss 2.5\n" + "x\n" * MAX_LINES)
    problems = "\n".join(page_problems(page))
    for expected in ("lines (at most", "not a '# ' heading", "a date ('2026-12-05')", "'this 2-core machine'"):
        assert expected in problems, problems


def test_the_results_folder_holds_the_studies():
    assert len(STUDIES) >= 5, [p.name for p in STUDIES]
    for path in STUDIES:
        text = path.read_text()
        where = path.relative_to(REPO)
        assert text.startswith("# "), f"{where}: opens with a '# ' heading"
        assert DATE.search(text), f"{where}: no date"
        assert FENCED_COMMAND.search(text), f"{where}: no fenced command"
        assert TABLE_RULE.search(text), f"{where}: no table"
    index = (REPO / "docs" / "benchmarks.md").read_text()
    unindexed = [p.name for p in STUDIES if f"results/{p.name}" not in index]
    assert not unindexed, f"docs/benchmarks.md indexes every study; missing: {unindexed}"


def test_the_readme_links_the_results_and_shows_a_picture():
    text = (REPO / "README.md").read_text()
    assert "docs/results/" in text
    pictures = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", text)
    assert pictures, "README.md shows no picture"
    for picture in pictures:
        assert (REPO / picture).is_file(), f"README.md shows {picture}, which is not in the repository"
