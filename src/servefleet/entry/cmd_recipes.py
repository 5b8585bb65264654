"""The commands that show what is shipped: ``recipes list``, ``recipes show`` (a recipe's
axes, as text or JSON), ``keys`` (the data keys, from the key table) and ``docs`` (the
documentation, shipped in the wheel)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from servefleet.base.errors import DataError, RecipeError, ServefleetError
from servefleet.base.shipped import FILES
from servefleet.entry import common

DOCS_DIR = FILES / "docs"  # the repository's docs/, in the wheel (a link in the source tree)

# ---------------------------------------------------------------------------------------------
# recipes


@click.group("recipes", context_settings={"help_option_names": ["-h", "--help"]})
def recipes_group() -> None:
    """List and inspect the shipped recipes (rbln/<name>, vllm/<org>/<name>)."""


@recipes_group.command("list")
@click.argument("directory", required=False, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="A JSON list of the names.")
def recipes_list(directory: Path | None, as_json: bool) -> None:
    """Print the qualified names of the recipes under DIRECTORY (default: the shipped ones, or
    SERVEFLEET_RECIPES). DIRECTORY holds rbln/ and vllm/, or is a checkout of vllm-project/recipes
    (models/, strategies/, taxonomy.yaml at its root); one that holds no recipe is an error.

    Example:

        servefleet recipes list
    """
    from servefleet.kinds import list_recipes

    if directory is not None and not directory.is_dir():
        raise RecipeError(f"{directory}: not a directory")
    names = list_recipes(directory)
    if not names:
        from servefleet.kinds import RECIPES_DIR

        raise RecipeError(
            f"{directory or RECIPES_DIR}: holds no recipe (looked for rbln/<name>.json, "
            "vllm/models/<org>/<name>.yaml, and models/<org>/<name>.yaml as in a checkout of "
            "vllm-project/recipes)"
        )
    if as_json:
        common.echo_json(names)
        return
    for name in names:
        click.echo(name)


def outline(value: Any, indent: str = "") -> list[str]:
    """A JSON value as indented text for a reader: ``key: value`` lines, a list of plain
    values on one line (``a, b, c``), a list of mappings as ``-`` items.

    + value: what JSON would print
    + indent: the indentation of its lines
    """

    def plain(v: Any) -> bool:
        return not isinstance(v, (dict, list)) or v in ([], {})

    def word(v: Any) -> str:
        return (
            "-" if v is None or v in ([], {}) else str(v).lower() if isinstance(v, bool) else str(v)
        )

    if isinstance(value, dict):
        out = []
        for k, v in value.items():
            if plain(v) or (isinstance(v, list) and all(plain(x) for x in v)):
                shown = ", ".join(map(word, v)) if isinstance(v, list) and v else word(v)
                out.append(f"{indent}{k}: {shown}")
            else:
                out += [f"{indent}{k}:", *outline(v, indent + "  ")]
        return out
    if isinstance(value, list):
        if all(plain(x) for x in value):
            return [f"{indent}{', '.join(map(word, value)) or '-'}"]
        out = []
        for item in value:
            lines = outline(item, indent + "  ")
            out += [f"{indent}- {lines[0].lstrip()}", *lines[1:]] if lines else [f"{indent}-"]
        return out
    return [f"{indent}{word(value)}"]


@recipes_group.command("show")
@click.argument("recipe", shell_complete=common.complete_recipe)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="text: indented, for reading; json: the same as JSON, for programs.",
)
@click.option("--json", "as_json", is_flag=True, help="The same as --format json.")
def recipes_show(recipe: str, fmt: str, as_json: bool) -> None:
    """Show a recipe's axes with allowed values, defaults, recommended, targets and strategies.

    Example:

        servefleet recipes show rbln/gpt-oss-120b
    """
    from servefleet.kinds import find

    source, path = find(recipe)
    shown = source.show(path, recipe)
    if as_json or fmt == "json":
        click.echo(json.dumps(shown, indent=2, ensure_ascii=False))
    else:
        click.echo("\n".join(outline(shown)))


# ---------------------------------------------------------------------------------------------
# keys


@click.command("keys")
@click.argument("names", nargs=-1, metavar="[NAME]...")
@click.option("--json", "as_json", is_flag=True, help="JSON: key -> its type, allowed values, "
              "default and meaning.")  # fmt: skip
def keys_cmd(names: tuple[str, ...], as_json: bool) -> None:
    """The data keys, from the installed package's key table (as ``ansible-doc`` does): without
    NAME every key and its meaning; with NAME (a key, or a glob such as 'serve_router*') its
    type, meaning, allowed values and default.

    Example:

        servefleet keys serve_target
    """
    import fnmatch

    from servefleet.fleet.datadoc import key_docs, key_help
    from servefleet.settings.checks import closest

    docs = {doc.name: doc for doc in key_docs()}
    chosen = []
    for name in names:
        found = [k for k in docs if fnmatch.fnmatchcase(k, name)]
        if not found:
            near = closest(name, docs, cutoff=0.7)
            hint = f"did you mean {near}? " if near else ""
            raise ServefleetError(f"{name}: no such data key; {hint}allowed: a key that "
                                  "`servefleet keys` lists, or a glob of them")  # fmt: skip
        chosen += [k for k in found if k not in chosen]
    if as_json:
        common.echo_json({k: docs[k].to_json() for k in chosen or docs}, sort_keys=False)
    elif chosen:
        click.echo("\n\n".join(key_help(docs[k]) for k in chosen))
    else:
        width = max(map(len, docs))
        click.echo("\n".join(f"{k.ljust(width)}  {d.meaning}" for k, d in docs.items()))


# ---------------------------------------------------------------------------------------------
# docs


def doc_topics() -> dict[str, str]:
    """Each shipped document's topic (its file name without ``.md``) -> its title."""
    out = {}
    for path in sorted(DOCS_DIR.glob("*.md")):
        lines = path.read_text(encoding="utf-8").splitlines()
        out[path.stem] = next((x.lstrip("# ").strip() for x in lines if x.startswith("#")), "")
    return out


@click.command("docs")
@click.argument("topic", required=False)
@click.option("--path", "as_path", is_flag=True, help="Print where the document is instead.")
def docs_cmd(topic: str | None, as_path: bool) -> None:
    """The documentation of this servefleet, as shipped in its wheel: without TOPIC, the
    topics; with one, its text (Markdown).

    \b
      servefleet docs                 # the topics
      servefleet docs real-fleet      # running a real fleet, step by step
      servefleet docs data --path     # where data.md is
    """
    topics = doc_topics()
    if topic is None:
        width = max(map(len, topics), default=0)
        click.echo("\n".join(f"{name:<{width}}  {title}" for name, title in topics.items()))
        return
    name = topic.removesuffix(".md")
    if name not in topics:
        raise DataError(f"{topic}: not a topic of servefleet docs; allowed: {', '.join(topics)}")
    path = DOCS_DIR / f"{name}.md"
    click.echo(str(path) if as_path else path.read_text(encoding="utf-8"), nl=as_path)
