"""#50: the documentation is reachable from the installed tool: ``servefleet docs`` lists the
topics (every docs/*.md, shipped in the wheel as ``_files/docs``), ``docs TOPIC`` prints one,
and a topic that is not one is a line naming the topics, exit 2."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from servefleet.entry.cli import main
from servefleet.entry.cmd_recipes import DOCS_DIR

REPO = Path(__file__).resolve().parents[3]


def test_the_shipped_docs_are_the_repositorys() -> None:
    assert DOCS_DIR.resolve() == (REPO / "docs").resolve()


def test_docs_lists_every_topic_with_its_title() -> None:
    out = CliRunner().invoke(main, ["docs"])
    assert out.exit_code == 0
    names = [line.split()[0] for line in out.output.splitlines()]
    assert names == sorted(p.stem for p in (REPO / "docs").glob("*.md"))
    assert any(
        line.split()[0] == "real-fleet" and "A real fleet" in line
        for line in out.output.splitlines()
    )


def test_docs_topic_prints_the_document() -> None:
    out = CliRunner().invoke(main, ["docs", "exit-codes"])
    assert out.exit_code == 0 and out.output == (REPO / "docs" / "exit-codes.md").read_text()
    assert (
        CliRunner().invoke(main, ["docs", "data.md", "--path"]).output.strip().endswith("data.md")
    )


def test_an_unknown_topic_is_one_line_naming_the_topics() -> None:
    out = CliRunner().invoke(main, ["docs", "real_fleet"])
    assert out.exit_code == 2
    (line,) = out.output.splitlines()
    assert line.startswith(
        "servefleet: error: real_fleet: not a topic of servefleet docs; allowed: "
    )
    assert "real-fleet" in line
