"""Test-only reader of systemd's quoting rules, to read ExecStart=/Environment= back into values.

Follows systemd 252 (src/basic/extract-word.c ``extract_first_word`` with EXTRACT_UNQUOTE |
EXTRACT_CUNESCAPE | EXTRACT_RELAX, src/basic/escape.c ``cunescape_one``, src/core/load-fragment.c
``config_parse_exec`` for the ``;``/``\\;`` tokens, and env-util.c ``replace_env`` for ``$$``).
It is strict where our renderer must be: an unknown ``%`` specifier, an unbalanced quote or a
single ``$`` (a variable reference) raises instead of being interpreted.
"""

from __future__ import annotations

WHITESPACE = " \t\n\r"
_SIMPLE = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    '"': '"',
    "'": "'",
    "s": " ",
}


class ParseError(ValueError):
    """Text that systemd would refuse or interpret differently than plain quoting."""


def expand_specifiers(text: str) -> str:
    """Specifier expansion restricted to ``%%`` -> ``%`` (any other specifier raises)."""
    out = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "%":
            if i + 1 < len(text) and text[i + 1] == "%":
                out.append("%")
                i += 2
                continue
            raise ParseError(f"unexpected specifier at {i}: {text[i : i + 2]!r}")
        out.append(c)
        i += 1
    return "".join(out)


def cunescape_one(text: str, i: int) -> tuple[str, int]:
    """Decode the escape whose letter is at ``text[i]``; returns (char, chars consumed)."""
    if i >= len(text):
        raise ParseError("backslash at end")
    c = text[i]
    if c in _SIMPLE:
        return _SIMPLE[c], 1
    for letter, n in (("x", 2), ("u", 4), ("U", 8)):
        if c == letter:
            digits = text[i + 1 : i + 1 + n]
            if len(digits) != n or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise ParseError(f"bad \\{letter} escape")
            code = int(digits, 16)
            if code == 0 or 0xD800 <= code <= 0xDFFF or code > 0x10FFFF:
                raise ParseError(f"\\{letter} escape of an invalid character")
            return chr(code), 1 + n
    if c in "01234567":
        digits = text[i : i + 3]
        if len(digits) != 3 or any(d not in "01234567" for d in digits):
            raise ParseError("bad octal escape")
        code = int(digits, 8)
        if code == 0:
            raise ParseError("octal escape of NUL")
        return chr(code), 3
    raise ParseError(f"unknown escape \\{c}")


def extract_first_word(text: str, pos: int, *, relax: bool = True) -> tuple[str | None, int]:
    """One word from ``text[pos:]`` (unquoting, C-unescaping); returns (word or None, new pos)."""
    while pos < len(text) and text[pos] in WHITESPACE:
        pos += 1
    if pos >= len(text):
        return None, pos
    word: list[str] = []
    quote: str | None = None
    while pos < len(text):
        c = text[pos]
        if c == "\\":
            try:
                ch, n = cunescape_one(text, pos + 1)
            except ParseError:
                if not relax or pos + 1 >= len(text):
                    raise
                # EXTRACT_RELAX: an unknown escape is kept as the backslash and the character
                word.append("\\" + text[pos + 1])
                pos += 2
                continue
            word.append(ch)
            pos += 1 + n
            continue
        if quote is not None:
            if c == quote:
                quote = None
            else:
                word.append(c)
            pos += 1
            continue
        if c in "'\"":
            quote = c
            pos += 1
            continue
        if c in WHITESPACE:
            break
        word.append(c)
        pos += 1
    if quote is not None:
        raise ParseError("unbalanced quoting")
    return "".join(word), pos


def _replace_dollars(word: str) -> str:
    out = []
    i = 0
    while i < len(word):
        if word[i] == "$":
            if i + 1 < len(word) and word[i + 1] == "$":
                out.append("$")
                i += 2
                continue
            raise ParseError(f"variable reference in {word!r} at {i}")
        out.append(word[i])
        i += 1
    return "".join(out)


def parse_exec(value: str) -> list[str]:
    """The argv systemd runs for one ``ExecStart=`` value (exactly one command)."""
    text = expand_specifiers(value)
    first, pos = extract_first_word(text, 0, relax=False)
    if first is None:
        raise ParseError("empty ExecStart")
    if first[0] in "@-:+!|":
        raise ParseError(f"executable {first!r} starts with a prefix character")
    argv = [first]
    while True:
        while pos < len(text) and text[pos] in WHITESPACE:
            pos += 1
        if pos >= len(text):
            break
        if text[pos] == ";" and (pos + 1 == len(text) or text[pos + 1] in WHITESPACE):
            raise ParseError("a second command follows an unquoted ';'")
        if text.startswith("\\;", pos) and (pos + 2 == len(text) or text[pos + 2] in WHITESPACE):
            argv.append(";")
            pos += 2
            continue
        word, pos = extract_first_word(text, pos)
        if word is None:
            break
        argv.append(word)
    return [_replace_dollars(a) for a in argv]


def parse_environment(value: str) -> dict[str, str]:
    """The assignments of one ``Environment=`` value (no ``$`` expansion there)."""
    text = expand_specifiers(value)
    out: dict[str, str] = {}
    pos = 0
    while True:
        word, pos = extract_first_word(text, pos)
        if word is None:
            return out
        name, eq, val = word.partition("=")
        if not eq or not name:
            raise ParseError(f"not an assignment: {word!r}")
        out[name] = val


def parse_unit(text: str) -> tuple[list[str], dict[str, str]]:
    """ExecStart argv and the merged Environment= of a ``[Service]`` section."""
    argv: list[str] | None = None
    env: dict[str, str] = {}
    for line in text.split("\n"):  # systemd splits on \n only (not U+2028 etc.)
        if line.endswith("\\"):
            raise ParseError("line continuation is not expected")
        key, eq, value = line.partition("=")
        if not eq:
            continue
        if key == "ExecStart":
            if argv is not None:
                raise ParseError("two ExecStart= lines")
            argv = parse_exec(value)
        elif key == "Environment":
            env.update(parse_environment(value))
    if argv is None:
        raise ParseError("no ExecStart=")
    return argv, env
