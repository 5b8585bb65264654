"""``servefleet init``: a fleet repository that depends on the installed package. This
repository's own deploys and lab inventory are the scaffold's texts; a scaffolded repository's
files compile, its group_data/all.py names every key it shows with the key table's default, and
an existing file stops the whole init before anything is written."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from servefleet.cli import main
from servefleet.errors import DataError
from servefleet.scaffold import DEPLOYS, LAB_INVENTORY, SITE_KEYS, deploy_file, files, init
from servefleet.settings import DEFAULTS, KEYS

REPO = Path(__file__).resolve().parents[2]


def test_this_repositorys_deploys_and_lab_inventory_are_the_scaffolds() -> None:
    assert sorted(p.name for p in (REPO / "deploys").glob("*.py")) == sorted(DEPLOYS)
    for name in DEPLOYS:
        assert (REPO / "deploys" / name).read_text() == deploy_file(name), name
    assert (REPO / "inventories" / "lab.py").read_text() == LAB_INVENTORY


def test_init_writes_a_fleet_repository_whose_files_compile(tmp_path: Path) -> None:
    target = tmp_path / "fleet"
    result = CliRunner().invoke(main, ["init", str(target)])
    assert result.exit_code == 0, result.output
    assert sorted(result.output.split()) == sorted(f"{target}/{rel}" for rel in files())
    for rel in files():
        text = (target / rel).read_text()
        if rel.endswith(".py"):
            ast.parse(text, rel)
    all_py = (target / "group_data" / "all.py").read_text()
    assert set(SITE_KEYS) <= set(KEYS)
    for key in SITE_KEYS:
        assert f"# {key} = {DEFAULTS[key]!r}\n" in all_py, key
    assert "canary = " in (target / "inventories" / "prod.py").read_text()


def test_init_refuses_a_directory_holding_one_of_its_files_and_writes_nothing(
    tmp_path: Path,
) -> None:
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "all.py").write_text("ours = 1\n")
    result = CliRunner().invoke(main, ["init", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "group_data/all.py exists; allowed:" in result.output
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["all.py", "group_data"]
    assert (tmp_path / "group_data" / "all.py").read_text() == "ours = 1\n"


@pytest.mark.parametrize("planted", ["deploys", "group_data", "inventories", "locks"])
def test_init_follows_no_link_planted_in_the_directory(tmp_path: Path, planted: str) -> None:
    """#31 (6): a link planted where init makes a directory is refused in one line, and nothing
    is written through it (before: 7 files written into the link's target)."""
    target, elsewhere = tmp_path / "fleet", tmp_path / "elsewhere"
    target.mkdir()
    elsewhere.mkdir()
    (target / planted).symlink_to(elsewhere)
    result = CliRunner().invoke(main, ["init", str(target)])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines()[-1] == (
        f"servefleet: error: {target}: {planted} is a link or not a directory; allowed: a directory "
        "without the scaffold's files (.gitignore, README.md, deploys, group_data, inventories, "
        "locks), none of them a link"
    )
    assert list(elsewhere.iterdir()) == []
    assert sorted(p.name for p in target.iterdir()) == [planted]  # nothing else written


def test_init_never_writes_through_a_file_that_appears_after_its_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#31 (6): the race on locks/README.md: a link to another file (root's, in the finding)
    planted after the existence check is not written through; the file is created exclusively."""
    target, victim = tmp_path / "fleet", tmp_path / "victim"
    victim.write_text("root's own\n")
    (target / "locks").mkdir(parents=True)
    (target / "locks" / "README.md").symlink_to(victim)
    monkeypatch.setattr(os.path, "lexists", lambda path: False)  # the check runs before the link
    with pytest.raises(DataError, match=r"locks/README\.md exists; allowed: "):
        init(str(target))
    assert victim.read_text() == "root's own\n"
    assert (target / "locks" / "README.md").is_symlink()
