"""``servefleet init``: a fleet repository that depends on the installed package. This
repository's own deploys and lab inventory are the scaffold's texts; a scaffolded repository's
files compile, its group_data/all.py names every key it shows with the key table's default, and
an existing file stops the whole init before anything is written."""

from __future__ import annotations

import ast
from pathlib import Path

from click.testing import CliRunner

from servefleet.cli import main
from servefleet.scaffold import DEPLOYS, LAB_INVENTORY, SITE_KEYS, deploy_file, files
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
