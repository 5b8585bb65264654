"""The rules both sides apply, written once in the host contract (remote/layout.py, #33): a model
id and an environment variable name mean the same to the card, the data, the spec, the unit
renderer, the wheelhouse and the host's fetcher. Before, the model-id rule had three versions:
the data and the wheelhouse took ``a/b..c``, the fetcher took ``-a/b`` and ``.a/b``; the card's
(no leading dash or dot, no '..') was the right one."""

from __future__ import annotations

import pytest

from servefleet.base.remote import fetch_model, layout
from servefleet.kinds import base as kinds_base
from servefleet.release import wheelhouse
from servefleet.settings import check_names, check_words

GOOD_IDS = ["openai/gpt-oss-120b", "a/b", "Org.x/Name_1.2-3", "0/9"]
BAD_IDS = ["a/b..c", "../a", "a/..", "-a/b", ".a/b", "a/-b", "a/.b", "a", "a/b/c", "a/b\n",
           "a /b", "", "a/", "/b", "a/b\x00"]  # fmt: skip
GOOD_ENV = ["A", "_", "RBLN_DEVICES", "x9", "VLLM_API_KEY"]
BAD_ENV = ["9A", "A-B", "A B", "", "A\n", "A=B", "Ä"]


@pytest.mark.parametrize("model", GOOD_IDS + BAD_IDS)
def test_every_side_takes_the_same_model_ids(model: str) -> None:
    want = model in GOOD_IDS
    assert bool(layout.MODEL_ID.fullmatch(model)) is want
    assert bool(kinds_base.MODEL_ID.fullmatch(model)) is want
    assert bool(check_names.MODEL_ID.fullmatch(model)) is want
    assert bool(fetch_model.MODEL_RE.fullmatch(model)) is want
    entry = {"url": "http://store/x.tar.gz", "sha256": "0" * 64}
    if want:
        assert wheelhouse.model_file(model, entry) is not None
    else:
        with pytest.raises(wheelhouse.WheelhouseError):
            wheelhouse.model_file(model, entry)


@pytest.mark.parametrize("name", GOOD_ENV + BAD_ENV)
def test_every_side_takes_the_same_variable_names(name: str) -> None:
    want = name in GOOD_ENV
    assert bool(layout.ENV_NAME.fullmatch(name)) is want
    assert bool(check_words.ENV_NAME.fullmatch(name)) is want
    assert bool(fetch_model.ENV_NAME_RE.fullmatch(name)) is want


def test_serve_router_is_read_in_one_place() -> None:
    """#33: ``serve_router`` was compared with its words in 16 places; the settings table says
    what each word means once (``router_off``, ``router_per_host``, ``router_fleet``)."""
    import ast
    from pathlib import Path

    import servefleet

    src = Path(servefleet.__file__).resolve().parent
    found = []
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(
                isinstance(n, ast.Attribute) and n.attr == "serve_router" for n in ast.walk(node)
            ):
                found.append(f"{path.relative_to(src)}:{node.lineno}")
    assert [f for f in found if not f.startswith("settings/table.py:")] == []
    assert len(found) == 3
