"""#53: the lab's public index serves the uv of each lock under ``./locks`` besides the
controller's, so the hosts can take the uv a committed lock pins whatever uv the controller has;
a lock that cannot be read, or names an odd version, adds nothing."""

from __future__ import annotations

import json
from pathlib import Path

from servefleet.fleet.lab.artifacts import artifacts_key, host_uv_versions
from servefleet.release.uvbin import uv_version


def test_each_locks_uv_is_served_besides_the_controllers(tmp_path: Path) -> None:
    for name, doc in {"lab": {"uv": {"version": "0.0.1"}}, "prod": {"uv": {"version": "0.0.1"}},
                      "odd": {"uv": {"version": "1.0; rm -rf /"}}, "none": {}}.items():  # fmt: skip
        (tmp_path / name).mkdir()
        (tmp_path / name / "servefleet.lock.json").write_text(json.dumps(doc))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "servefleet.lock.json").write_text("{")
    assert host_uv_versions(tmp_path) == sorted({uv_version(), "0.0.1"})
    assert host_uv_versions(tmp_path / "missing") == [uv_version()]


def test_a_build_serving_another_uv_has_a_key_of_its_own(tmp_path: Path) -> None:
    (tmp_path / "build.py").write_text("")
    alone = artifacts_key(tmp_path, (), [uv_version()])
    assert alone == artifacts_key(tmp_path)
    assert artifacts_key(tmp_path, (), sorted({uv_version(), "0.0.1"})) != alone
