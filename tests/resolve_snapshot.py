"""Write what ``servefleet resolve`` prints for every case into DIR, one file a case.

    .venv/bin/python tests/resolve_snapshot.py DIR   (from the checkout's root)

Run it on two checkouts (before and after a refactor) and compare with ``diff -r``: the output
must be byte-identical. It goes through the CLI only, so it runs on any version of the code.
The cases: every combination of the seed card's grid on each target (json, shell, unit), and
every shipped vLLM recipe (yaml and json) on each hardware it lists with each strategy, and
each variant on the recipe's default hardware (json, shell, unit); a refusal is recorded as its
exit code and message, so refusals must not change either.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from servefleet.entry.cli import main as cli

FORMATS = ("json", "shell", "unit")
REPO = Path.cwd()  # the checkout whose code runs (run from its root)


def run(args: list[str]) -> str:
    result = CliRunner().invoke(cli, args)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return f"exit {result.exit_code}\n{result.output}"


def show(recipe: str) -> dict[str, Any]:
    out = run(["recipes", "show", recipe, "--json"])
    return json.loads(out.split("\n", 1)[1])


def rbln_cases(recipe: str) -> list[list[str]]:
    doc = show(recipe)
    cases = []
    for strategy in doc["strategies"]:
        for target in strategy["targets"]:
            axes = target["axes"]
            for values in itertools.product(*axes.values()):
                sets = [f"--set={a}={v}" for a, v in zip(axes, values, strict=True)]
                cases.append(
                    [recipe, f"--strategy={strategy['slug']}", f"--target={target['target']}"]
                    + sets
                )
            cases.append(
                [recipe, f"--strategy={strategy['slug']}", f"--target={target['target']}"]
                + ["--recommended"]
            )
    return cases


def vllm_cases(recipe: str) -> list[list[str]]:
    doc = show(recipe)
    cases = [[recipe]]
    for hw in doc["hardware"]:
        for strategy in doc["strategies"]:
            cases.append([recipe, f"--hardware={hw}", f"--strategy={strategy}"])
    for variant in doc["variants"]:
        cases.append([recipe, f"--variant={variant}"])
    return cases


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    names = run(["recipes", "list"]).split("\n", 1)[1].split()
    files = sorted(REPO.glob("src/servefleet/_files/recipes/*/json/*/*.json"))
    recipes = names + [str(p.relative_to(REPO)) for p in files]
    count = 0
    for recipe in recipes:
        (out / f"show-{count:05d}.txt").write_text(f"{recipe}\n{run(['recipes', 'show', recipe])}")
        cases = rbln_cases(recipe) if recipe.startswith("rbln/") else vllm_cases(recipe)
        for case in cases:
            for fmt in FORMATS:
                count += 1
                args = ["resolve", *case, f"--format={fmt}"]
                text = run(args)
                shown = " ".join(args) + "\n" + text
                (out / f"{count:05d}.txt").write_text(shown.replace(f"{REPO}/", ""))
    print(f"{count} outputs written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
