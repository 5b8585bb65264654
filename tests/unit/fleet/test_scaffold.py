"""``servefleet init``: a fleet repository that depends on the installed package. This
repository's own deploys and lab inventory are the scaffold's texts; a scaffolded repository's
files compile, its group_data/all.py names every key it shows with the key table's default, and
an existing file stops the whole init before anything is written."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from host_inputs import CREDS
from repo_paths import REPO

from servefleet.base.errors import DataError
from servefleet.entry.cli import main
from servefleet.fleet.scaffold import DEPLOYS, LAB_INVENTORY, SITE_KEYS, deploy_file, files, init
from servefleet.settings.table import DEFAULTS, KEYS


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
    assert set(SITE_KEYS) <= set(KEYS)
    assert "canary = " in (target / "inventories" / "prod.py").read_text()


def uncommented(all_py: str) -> dict[str, object]:
    """group_data/all.py with each key's ``# key = value`` lines (and their continuation
    lines) uncommented, run as Python: key -> the value it sets."""
    code, taking = [], False
    for line in all_py.splitlines():
        name = re.match(r"# ([a-z][a-z0-9_]*) = ", line)
        if name and name.group(1) in KEYS:
            taking = True
        elif not line.startswith("#  "):
            taking = False
        if taking:
            code.append(line[2:])
    found: dict[str, object] = {}
    exec("\n".join(code), {}, found)  # noqa: S102 (the scaffold's own text)
    return found


def test_group_data_all_sets_every_key_of_the_table_to_its_default_when_uncommented(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """#32 (2): every key of the key table is in group_data/all.py, commented, with its type,
    allowed values and meaning; uncommented, each sets the key's default (the kinds' own
    defaults: the RBLN stack's), so the data validates to the default settings."""
    from servefleet.fleet.datadoc import key_docs
    from servefleet.settings.table import settings_from

    all_py = files()["group_data/all.py"]
    ast.parse(all_py)
    values = uncommented(all_py)
    assert list(values) == [*SITE_KEYS, *(k for k in KEYS if k not in SITE_KEYS)]
    assert values == DEFAULTS
    for doc in key_docs():
        block = all_py.split(f"\n# {doc.name} = ", 1)[0].rsplit("\n\n", 1)[1]
        assert f"# type: {doc.type}" in block, doc.name
        assert " ".join(doc.allowed.split()) in " ".join(block.replace("#", " ").split()), doc.name
    for name, value in CREDS.items():
        monkeypatch.setenv(name, value)
    assert settings_from(values.get, keys=values.keys()) == settings_from({}.get, keys=())


def test_the_uncommenting_check_can_fail() -> None:
    """A key missing from the text, or shown with another value, is caught."""
    text = files()["group_data/all.py"]
    assert (
        uncommented(text.replace("# serve_target = 'Latency'", "# serve_target = 'x'")) != DEFAULTS
    )
    assert "serve_target" not in uncommented(text.replace("# serve_target = ", "# serve_target: "))


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


@pytest.mark.parametrize("planted", ["deploys", "group_data", "inventories", "locks", "monitoring"])
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
        "locks, monitoring), none of them a link"
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


def test_every_file_sd_path_is_the_monitoring_kits_one() -> None:
    """#50 (2): the scaffold's README, its monitoring/ files and the docs name one
    ``status --prometheus`` file, the one the kit's prometheus.yml reads (before: the README's
    /var/lib/prometheus/servefleet.json, which no Prometheus read)."""
    from servefleet.fleet.monitoring.kit import TARGETS

    texts = {rel: text for rel, text in files().items() if not rel.endswith(".json")}
    texts.update({str(p.relative_to(REPO)): p.read_text() for p in REPO.glob("docs/*.md")})
    texts["README.md (this repository's)"] = (REPO / "README.md").read_text()
    named = {
        (rel, path)
        for rel, text in texts.items()
        for path in re.findall(r"/[\w./-]*/servefleet\.json\b", text)
    }
    assert {rel for rel, _ in named} >= {"README.md", "monitoring/prometheus.yml",
                                         "monitoring/README.md"}  # fmt: skip
    assert {path for _, path in named} == {TARGETS}, sorted(named)
    assert TARGETS.startswith("/etc/prometheus/")  # Debian's prometheus package makes it


def test_the_gitignore_lists_the_log_pyinfra_writes_into_the_fleet_repository() -> None:
    """#50: pyinfra writes pyinfra-debug.log into the directory it runs in (the fleet
    repository); the scaffold's .gitignore keeps it out of git."""
    import inspect

    import pyinfra_cli.exceptions

    assert 'open("pyinfra-debug.log"' in inspect.getsource(pyinfra_cli.exceptions)
    assert "pyinfra-debug.log" in files()[".gitignore"].splitlines()
