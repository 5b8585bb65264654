"""Reading recipe files: the one place every kind's recipe text is read from disk."""

from __future__ import annotations

from pathlib import Path

from servefleet.errors import RecipeError


def read_recipe_text(p: Path, label: str) -> str:
    """A recipe file's text; RecipeError naming ``label`` when it cannot be read."""
    try:
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise RecipeError(f"{label}: cannot read recipe: {reason}") from None
