"""Rewrite the golden files under tests/data/golden from what the code outputs today.

    .venv/bin/python tests/regen_goldens.py

Run it by hand after a deliberate change of output, then review ``git diff tests/data/golden``:
the tests only compare against these files and never write them.

+ golden/rbln/<case>.json: the ``args`` of ``servefleet resolve`` -> its ``output``: the JSON, or
  the text for ``--format shell``/``unit``
+ golden/vllm/<case>.json: a ``recipe_file`` and the ``resolve`` arguments -> the ServeSpec JSON
  ``expected`` (recipe paths relative to the repository, ``recipes/...`` to the package's shipped
  files ``src/servefleet/_files``)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from servefleet.base.shipped import FILES
from servefleet.entry.cli import main
from servefleet.kinds.vllm import load_vllm_recipe, resolve_vllm

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "data" / "golden"


def rbln_output(doc: dict[str, Any]) -> Any:
    """What ``servefleet resolve <args>`` prints, parsed unless it is text."""
    args = doc["args"]
    result = CliRunner().invoke(main, ["resolve", *args], catch_exceptions=False)
    if result.exit_code != 0:
        raise SystemExit(f"servefleet resolve {' '.join(args)}: {result.output}")
    text = "--format" in args and args[args.index("--format") + 1] != "json"
    return result.output if text else json.loads(result.output)


def vllm_expected(doc: dict[str, Any]) -> Any:
    """The ServeSpec JSON of a vLLM recipe resolved with the case's arguments."""
    rel = doc["recipe_file"]
    recipe = load_vllm_recipe((FILES if rel.startswith("recipes/") else REPO) / rel)
    spec = resolve_vllm(recipe, **doc["resolve"]).to_json()
    spec["recipe"] = spec["recipe"].replace(str(FILES) + "/", "").replace(str(REPO) + "/", "")
    return spec


KINDS: dict[str, tuple[str, Callable[[dict[str, Any]], Any]]] = {
    "rbln": ("output", rbln_output),
    "vllm": ("expected", vllm_expected),
}


def regenerate() -> int:
    """Rewrite every golden file whose expected part differs; the number rewritten."""
    rewritten = 0
    for kind, (field, compute) in KINDS.items():
        for path in sorted((GOLDEN / kind).glob("*.json")):
            old = path.read_text()
            doc = json.loads(old)
            doc[field] = compute(doc)
            new = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
            if new != old:
                path.write_text(new)
                rewritten += 1
                print(f"rewrote {path.relative_to(REPO)}")
    return rewritten


if __name__ == "__main__":
    print(f"{regenerate()} golden file(s) rewritten")
