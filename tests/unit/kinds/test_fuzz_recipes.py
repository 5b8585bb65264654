"""Fuzzing the recipe loaders and resolvers (issue #18): hostile mutations of the seed card and
of a vLLM recipe, run through the commands a user runs (``servefleet recipes show`` and
``servefleet resolve`` in each ``--format``), end in a valid spec or one line of
:class:`ServefleetError`, never another exception, within bounded memory and time.

Each example walks the seed document, picks paths and replaces, deletes, inserts, transplants or
swaps the shape of what is there (a list of lists for a list, a string for a list, a list for a
string, a non-finite number for a number): wrong types, structures, deep nesting, YAML aliases
and tags, huge numbers, control characters, lone surrogates and hostile strings (options, paths,
shell and systemd syntax), in values and keys alike; some files then get a raw control character
written into their text. The selection options the commands take are drawn as well. A resolved
spec holds no control character (JSON's line breaks and tabs between tokens aside), no option
inside one argv word and starts with a launcher of the allow-list (issue #31). The commands
run in one worker process (``fuzz_worker.py``) whose address space is capped (``RLIMIT_AS``: a
run that grows it by more than :data:`BUDGET_MIB` ends in a MemoryError, reported as a crash) and
that is killed when it does not answer within :data:`HARD_SECONDS`; hypothesis's ``deadline``
bounds each example's time. Deterministic: ``derandomize``, no example database.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
import re
import selectors
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fuzz_support import Loc, campaign, locations
from hypothesis import given, strategies as st
from repo_paths import DATA, UNIT
from systemd_parse import parse_unit

from servefleet.base.shipped import FILES
from servefleet.kinds.base import LAUNCHERS, MODEL_ID, MODEL_PATH
from servefleet.kinds.rbln.card_checks import MAX_NPUS

WORKER = UNIT / "fuzz_worker.py"
SEED_CARD = FILES / "recipes" / "rbln" / "gpt-oss-120b.json"
VLLM_ROOT = FILES / "recipes" / "vllm"
SEED_VLLM = VLLM_ROOT / "models" / "openai" / "gpt-oss-120b.yaml"
SEED_SITE_JSON = VLLM_ROOT / "json" / "openai" / "gpt-oss-120b.json"  # with recommended_command
# further vLLM seeds: feature modes, KV offload, an omni recipe with tasks
MORE_VLLM = [VLLM_ROOT / "models" / "Qwen" / "Qwen3.8-27B.yaml",
             VLLM_ROOT / "models" / "zai-org" / "GLM-5.2.yaml",
             DATA / "vllm" / "omni-task-hardware.yaml"]  # fmt: skip
BUDGET_MIB = 256  # what one command may grow the worker's address space by
HARD_SECONDS = 30.0  # a worker that has not answered by then is killed
# Examples of each test: the file takes well under 30 s; SERVEFLEET_FUZZ_EXAMPLES=N runs a
# longer campaign of N inputs per test (2500: 10,000 inputs over the four; fuzz_support.py)
EXAMPLES = {"card": 70, "card_yaml": 20, "vllm": 50, "vllm_json": 30}
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
BARE_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")  # a companion's command


def fuzz(kind: str) -> Any:
    return campaign(EXAMPLES[kind])


# ---------------------------------------------------------------------------------------------
# The worker


class Worker:
    """The worker process: requests in, one JSON line of answers out, within a deadline."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.proc: subprocess.Popen[bytes] | None = None
        self.stderr = root / "worker.stderr"

    def start(self) -> subprocess.Popen[bytes]:
        with self.stderr.open("ab") as err:
            return subprocess.Popen(
                [sys.executable, str(WORKER), str(self.root), str(BUDGET_MIB)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                cwd=self.root,
            )

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def ask(self, file: str, text: str, runs: list[list[str]]) -> list[dict[str, Any]]:
        """Write ``text`` to ``file`` in the worker's tree and run each ``servefleet`` command
        (``{file}`` in an argument is the file's path): how each ended."""
        return self.send({"file": file, "text": text, "runs": runs}, HARD_SECONDS)

    def send(self, request: dict[str, Any], seconds: float) -> list[dict[str, Any]]:
        """One request and its answer; AssertionError when none comes within ``seconds`` (the
        worker is killed) or the worker dies."""
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self.start()
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write((json.dumps(request) + "\n").encode("ascii"))
        proc.stdin.flush()
        runs = request.get("runs", request)
        deadline = time.monotonic() + seconds
        answer = b""
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while not answer.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    self.stop()
                    raise AssertionError(f"no answer within {seconds:g} s: {runs}")
                chunk = os.read(proc.stdout.fileno(), 1 << 20)
                if not chunk:
                    code = proc.wait()
                    self.proc = None
                    tail = self.stderr.read_text(errors="replace")[-2000:]
                    raise AssertionError(f"the worker died ({code}) on {runs}: {tail}")
                answer += chunk
        results: list[dict[str, Any]] = json.loads(answer)
        return results


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    root = tmp_path_factory.mktemp("fuzz")
    shutil.copytree(VLLM_ROOT, root / "vllm")
    w = Worker(root)
    yield w
    w.stop()


# ---------------------------------------------------------------------------------------------
# Documents and their mutations


def holds(doc: Any, target: Any) -> bool:
    """Whether ``target`` (by identity) is ``doc`` or inside it."""
    if doc is target:
        return True
    children = doc.values() if isinstance(doc, dict) else doc if isinstance(doc, list) else []
    return any(holds(c, target) for c in children)


def node(doc: Any, loc: Loc) -> Any:
    for step in loc:
        doc = doc[step]
    return doc


# Text standing in for a value, swapped for raw document text after dumping (what no dumper
# writes: nesting past any limit, numbers past any cap, YAML's aliases, tags and odd scalars).
RAW_JSON = [
    "[" * 33 + "]" * 33,
    "[" * 3000 + "]" * 3000,
    '{"a": ' * 40 + "1" + "}" * 40,
    "9" * 19,
    "9" * 5000,
    "-" + "9" * 30,
    "0." + "9" * 5000,
    "1e999",
    "-1E400",
    "NaN",
    "Infinity",
    "-Infinity",
    '"\\ud800"',
    '"\\u0000"',
    '"\\u001b[2J"',
    '{"k": 1, "k": 2}',
    "[1,",
]
RAW_YAML = [
    *("[" * 33 + "]" * 33, "[" * 3000 + "]" * 3000, "{a: " * 40 + "1" + "}" * 40),
    "[&a [x,x,x,x,x,x,x,x,x], "
    + ", ".join(f"&{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]" for i in range(8))
    + "]",
    "&anchor x",
    "*nowhere",
    "9" * 19,
    "9" * 5000,
    "!!int " + "1" * 5000,
    "!!float " + "9" * 5000,
    "0x" + "f" * 5000,
    "0o17",
    "1_000",
    "12:30:45",
    "2001-12-14",
    "!!timestamp 2001-12-14 21:59:43.10 -5",
    "!!binary aGVsbG8=",
    "!!set {a: null, b: null}",
    "!!omap [a: 1, b: 2]",
    "!!python/object/apply:os.system [id]",
    "!custom x",
    ".inf",
    "-.inf",
    ".nan",
    "~",
    "yes",
    "off",
    "{? [a, b] : c}",
    "{1: a, null: b, true: c, 1.5: d}",
    '"\\0"',
    '"\\ud800"',
    '"\\x1b[2J"',
    '"\\u2028"',
    '"\\U0010ffff"',
    "{k: 1, k: 2}",
    "[1,",
    "'",
]
SENTINEL = "zqraw{}zq"

HOSTILE = [
    "",
    " ",
    "-h",
    "--help",
    "--",
    "--host 0.0.0.0",
    "--max-num-seqs=1 --host 0.0.0.0 --api-key x",
    "../../../../usr/bin/python3 -c x",
    "/bin/sh",
    "vllm serve",
    "vllm serve --",
    "openai/gpt-oss-120b",
    "-h/x",
    "a/b/c",
    "org/name\n",
    "$(reboot)",
    "`id`",
    "; rm -rf /",
    "x; ExecStartPre=/bin/sh",
    "%n %h %% %",
    "${HOME} $HOME $$",
    "\x00",
    "\n",
    "a\nb",
    "x\nExecStart=/bin/sh",
    "\r\n",
    "\x1b[2J",
    "\x85\u2028\u2029\x0b\x0c\x1c",
    "\u202e",
    "\ud800",
    "a\udfffb",
    "\ufeff",
    "'",
    '"',
    "\\",
    "{",
    "[1,",
    "[" * 200,
    "=",
    "A=B",
    "K=",
    "9" * 30,
    "1e999",
    "NaN",
    "x" * 5000,
    "ｖｌｌｍ",
    "lmcache=cpu",
    "off",
    "on",
    "Latency",
    "Throughput",
    "RBLN-CR13",
    "h200",
    "mi300x",
    "default",
    "single_node_tp",
    "main",
    "--speculative-config",
    '{"model": "-h", "method": "suffix"}',
    '{"model": "../../etc", "num_speculative_tokens": 99999999999999999999}',
    '--speculative-config {"model":"-h"}',
    '--kv-transfer-config {"kv_connector":"LMCache"}',
    "VLLM_RBLN_DECODE_BATCH_BUCKET_MANUAL_BUCKETS='[1,'",
    "VLLM_ENGINE_READY_TIMEOUT_S=" + "9" * 5000,
    "--max-model-len " + "9" * 5000,
    "--tensor-parallel-size 100000",
    "--tensor-parallel-size -1",
    "-tp 0",
    "[" * 3000,
    "[" + "9" * 5000 + "]",
    '{"model": "a/b", "num_speculative_tokens": ' + "9" * 5000 + "}",
    '{"model": "a/b", "k": 1, "k": 2}',
    '{"kv_connector": ' * 40,
]

NUMBERS = [0, -1, 1, 2, 7, 63, 64, 65, 2**31, 2**63, 10**18, -(10**18), 10**30, 1.5, -0.0]
NUMBERS += [1e308, math.inf, -math.inf, math.nan, True, False, None]

keys = st.sampled_from(HOSTILE) | st.text(max_size=6)
scalars = (
    st.sampled_from(HOSTILE)
    | st.sampled_from(NUMBERS)
    | st.text(max_size=12)
    | st.integers()
    | st.floats()
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
    max_leaves=6,
)


def deep(depth: int, kind: str) -> Any:
    out: Any = "x"
    for _ in range(depth):
        out = [out] if kind == "list" else {"k": out}
    return out


def _rewrap(before: list[str], prefix: str, after: list[str], body: str) -> str:
    return shlex.join([*before, prefix + body, *after])


def embedded(text: str) -> tuple[Any, dict[str, Any]] | None:
    """The JSON object held in a recipe's text (a vLLM argument ``{"model": ...}``, a card's
    fragment ``--speculative-config '{...}'`` or ``KEY='{...}'``) and how to write it back."""
    if "{" not in text:
        return None
    try:
        whole = json.loads(text)
    except (ValueError, RecursionError):
        whole = None
    if isinstance(whole, dict):
        return (lambda body: body), whole
    try:
        words = shlex.split(text)
    except (ValueError, RecursionError):
        return None
    for i, word in enumerate(words):
        head, eq, tail = word.partition("=")
        prefix, body = (head + eq, tail) if eq and not word.startswith("{") else ("", word)
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError):
            continue
        if isinstance(obj, dict):
            return functools.partial(_rewrap, words[:i], prefix, words[i + 1 :]), obj
    return None


ACTIONS = [
    "replace",
    "replace",
    "delete",
    "insert",
    "rename",
    "transplant",
    "fragment",
    "inner",
    "inner",
    "swap",
    "swap",
    "word",
    "word",
]
# Where a value becomes one argv word or env value: a vLLM recipe's argument lists and env maps,
# a card's args and envs (its fragments: ``fragment`` above)
WORD_KEYS = {"base_args", "extra_args", "vllm_args", "args", "base_env", "extra_env", "env",
             "envs", "add_args", "add_envs", "launcher", "serve_binary", "command"}  # fmt: skip
NON_FINITE = [math.inf, -math.inf, math.nan]
# Written raw into a file's text (what no dumper writes): C0, DEL, C1, separators, BOM, noncharacter
RAW_CONTROL = ["\x00", "\x1b", "\x07", "\x08", "\x0b", "\x0c", "\r", "\x7f", "\x85", "\x9b",
               "\u2028", "\u2029", "\u202e", "\ufeff", "\ufffe"]  # fmt: skip


def swapped(draw: Any, old: Any) -> Any:
    """``old`` in another shape: a list of lists or a string for a list, a list for a string or
    a mapping, a non-finite number (or a list, or text) for a number."""
    if isinstance(old, list):
        return draw(
            st.sampled_from(
                [[old], [[x] for x in old], " ".join(map(str, old)), str(old[0]) if old else ""]
            )
        )
    if isinstance(old, dict):
        return draw(st.sampled_from([[old], list(old), " ".join(old), [list(old)]]))
    if isinstance(old, str):
        return draw(st.sampled_from([[old], [[old]], {old: old}]))
    if isinstance(old, (int, float)) and not isinstance(old, bool):
        return draw(st.sampled_from([*NON_FINITE, [old], str(old), -old]))
    return [old]


def with_raw_control(draw: Any, text: str) -> str:
    """Sometimes, ``text`` with a raw control character written at a drawn offset."""
    if not text or draw(st.integers(0, 7)):
        return text
    at = draw(st.integers(0, len(text) - 1))
    return text[:at] + draw(st.sampled_from(RAW_CONTROL)) + text[at:]


def _word_key(loc: Loc) -> bool:
    """A location inside an argument list, an env map or a launcher."""
    return any(isinstance(step, str) and step in WORD_KEYS for step in loc)


def _fragment_key(loc: Loc) -> bool:
    """A location whose key is an option or a variable (a card's args and envs)."""
    key = loc[-1] if loc else None
    return isinstance(key, str) and (
        key.startswith("-") or (key.isupper() and bool(ENV_NAME.match(key)))
    )


@st.composite
def mutated(
    draw: Any, seed: Any, yaml_form: bool, focus: str | None = None
) -> tuple[Any, list[str], list[Loc]]:
    """The seed after one to four mutations, the raw texts its sentinels stand for, and where it
    changed; with ``focus`` (a top-level key), half the mutations land under it."""
    doc = copy.deepcopy(seed)
    raws: list[str] = []
    touched: list[Loc] = []
    raw_texts = RAW_YAML if yaml_form else RAW_JSON

    def value() -> Any:
        kind = draw(st.sampled_from(["value", "value", "value", "raw", "deep"]))
        if kind == "raw":
            raws.append(draw(st.sampled_from(raw_texts)))
            return SENTINEL.format(len(raws) - 1)
        if kind == "deep":
            depth = draw(st.sampled_from([31, 32, 33, 100]))
            return deep(depth, draw(st.sampled_from(["list", "dict"])))
        return draw(values)

    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 2, 3, 4]))):  # mostly one: most resolve far
        action = draw(st.sampled_from(ACTIONS))
        locs = locations(doc)
        if action == "fragment":
            locs = [loc for loc in locs if _fragment_key(loc)]
        elif action == "inner":
            locs = [
                loc for loc in locs if isinstance(node(doc, loc), str) and embedded(node(doc, loc))
            ]
        elif action in ("delete", "rename"):
            locs = [loc for loc in locs if loc]
        elif action == "word":
            locs = [loc for loc in locs if _word_key(loc) and isinstance(node(doc, loc), str)]
        if focus is not None and draw(st.booleans()):
            locs = [loc for loc in locs if loc[:1] == (focus,)] or locs
        if not locs:
            continue
        loc = draw(st.sampled_from(locs))
        touched.append(loc)
        parent = node(doc, loc[:-1]) if loc else None
        if action == "delete":
            del parent[loc[-1]]
            continue
        if action == "rename":
            if isinstance(parent, dict):
                parent[draw(keys)] = parent.pop(loc[-1])
            continue
        if action == "swap":
            new: Any = swapped(draw, node(doc, loc))
            if loc:
                parent[loc[-1]] = new
            else:
                doc = new
            continue
        if action == "insert":
            target = node(doc, loc)
            if isinstance(target, dict):
                target[draw(keys)] = value()
            elif isinstance(target, list):
                target.insert(draw(st.integers(0, len(target))), value())
            continue
        if action == "transplant":
            other = node(doc, draw(st.sampled_from(locations(doc))))
            # YAML: the same object twice is written as an anchor and an alias (not inside
            # itself: a document is no cycle)
            shared = yaml_form and not holds(other, node(doc, loc))
            new = other if shared else copy.deepcopy(other)
        elif action == "word":  # one word holding a hostile word, a control character
            old, word = node(doc, loc), draw(st.sampled_from(HOSTILE))
            control = draw(st.sampled_from(RAW_CONTROL))
            forms = [word, f"{old} {word}", f"{old}{control}{word}", f"{old} {shlex.quote(word)}"]
            new = draw(st.sampled_from(forms))
        elif action == "fragment":  # ``--flag VALUE``, ``--flag=VALUE``, ``KEY=VALUE``
            word = draw(st.sampled_from(HOSTILE))
            quoted = draw(st.sampled_from([shlex.quote(word), word]))
            new = draw(st.sampled_from([f"{loc[-1]} {quoted}", f"{loc[-1]}={quoted}"]))
        elif action == "inner":  # a field of the JSON an argument holds
            rewrap, obj = embedded(node(doc, loc)) or (None, {})
            field = draw(st.sampled_from(["model", "model", *obj, "method"]))
            raw = draw(st.sampled_from([None, None, None, *RAW_JSON[:2], *RAW_JSON[3:5]]))
            obj[field] = SENTINEL.format("j") if raw else draw(values)
            body = json.dumps(obj).replace(json.dumps(SENTINEL.format("j")), raw or "")
            new = rewrap(body)
        else:
            new = value()
        if loc:
            parent[loc[-1]] = new
        else:
            doc = new
    return doc, raws, touched


def dump(doc: Any, raws: list[str], yaml_form: bool) -> str | None:
    """The document's text, with each sentinel swapped for its raw text (None: no dumper can
    write this document)."""
    try:
        if yaml_form:
            text = yaml.dump(
                doc, Dumper=yaml.CSafeDumper, sort_keys=False, allow_unicode=False, width=1 << 30
            )
        else:
            text = json.dumps(doc, indent=1)
    except (ValueError, TypeError, yaml.YAMLError, RecursionError):
        return None
    for i, raw in enumerate(raws):
        token = SENTINEL.format(i)
        text = text.replace(token if yaml_form else json.dumps(token), raw)
    return text


# ---------------------------------------------------------------------------------------------
# Outcomes


def check_one_line(run: list[str], result: dict[str, Any]) -> None:
    assert "crash" not in result, (
        f"{' '.join(run)[:300]}: {result.get('crash')} at {result.get('where')}\n"
        f"{result.get('traceback')}"
    )
    if "error" in result:
        message = result["error"]
        assert message and len(message.splitlines()) == 1, f"{run}: not one line: {message!r}"


def json_value(text: str) -> bool:
    try:
        return isinstance(json.loads(text), (dict, list))
    except (ValueError, RecursionError):
        return False


def printable(word: str) -> bool:
    """Printable text, or a JSON value with line breaks and tabs between its tokens."""
    return word.isprintable() or (
        json_value(word) and word.replace("\n", "").replace("\t", "").isprintable()
    )


def check_words(words: list[str], what: str) -> None:
    """No control character in any word, no option inside an argv word (a JSON value aside)."""
    for word in words:
        assert printable(word), f"{what}: {word!r} holds a control character"
        inner = re.search(r"\s--?[A-Za-z]", word) if what.endswith("argv") else None
        assert inner is None or json_value(word), f"{what}: {word!r} holds an option"


def check_spec(spec: dict[str, Any], kind: str) -> None:
    """What every resolved spec holds, however hostile its recipe: a launcher of the allow-list
    (a companion's: a bare word), printable words, model ids, variable names, a device count in
    range."""
    assert spec["kind"] == kind
    assert spec["servers"], spec
    launchers = [launcher.split() for launcher in LAUNCHERS[kind]]
    for i, server in enumerate(spec["servers"]):
        argv = server["argv"]
        assert argv and all(isinstance(a, str) for a in argv), argv
        if server["role"].startswith("companion-"):
            assert BARE_WORD.match(argv[0]), f"companion {argv[0]!r} is not a bare word"
        else:
            assert any(argv[: len(w)] == w for w in launchers), f"launcher of {argv[:3]}"
        check_words(argv, f"{server['role']} argv")
        check_words(list(server["env"].values()), f"{server['role']} env")
        assert all(ENV_NAME.match(k) and isinstance(v, str) for k, v in server["env"].items())
        npus = server["npus"]  # a companion (a KV cache server) takes none; a rank its node's
        assert isinstance(npus, int) and (1 if i == 0 or "rank" in server else 0) <= npus, npus
        assert npus <= MAX_NPUS, npus
    if "nodes" in spec:  # a group over several hosts: one server per rank, 0 the head
        assert spec["nodes"] >= 2, spec["nodes"]
        assert [s["rank"] for s in spec["servers"]] == list(range(spec["nodes"]))
    else:
        assert not any("rank" in s for s in spec["servers"]), "a rank outside a group"
    models = spec["requirements"]["models"]
    local = MODEL_PATH if kind == "vllm" else MODEL_ID  # vLLM's recipes may name a directory
    assert models and all(MODEL_ID.match(m) or local.match(m) for m in models), f"models: {models}"
    assert models[0] in spec["servers"][0]["argv"], "the served model is not in argv"
    if kind == "rbln":
        assert re.fullmatch(r"[0-9a-f]{64}", spec["compile_fingerprint"] or "")


def check_unit(unit: str, spec: dict[str, Any]) -> None:
    """The unit systemd reads runs exactly the spec's first server, with its env; a selection
    of several nodes prints one unit a rank (each after its ``# rank N of M`` line), each
    running its rank's server."""
    units = (
        re.split(r"^# rank \d+ of \d+.*\n", unit, flags=re.M)[1:]
        if spec.get("nodes", 1) > 1
        else [unit]
    )
    assert units, unit
    for text, server in zip(units, spec["servers"], strict=True):
        argv, env = parse_unit(text)
        assert argv[0].endswith("/bin/" + server["argv"][0]), argv[0]
        assert argv[1 : len(server["argv"])] == server["argv"][1:]
        assert all(env.get(k) == v for k, v in server["env"].items())


def check(results: list[dict[str, Any]], runs: list[list[str]], kind: str) -> str:
    """Every run ended in output or one line of ServefleetError; the resolves agree with each
    other (``runs``: :func:`runs_for`'s)."""
    for run, result in zip(runs, results, strict=True):
        check_one_line(run, result)
    as_json, unit, other = results
    if "error" in as_json:
        assert "error" in unit, unit
        if runs[2][0] == "resolve":
            assert other.get("error") == as_json["error"], other
        return "refused"
    spec = json.loads(as_json["out"])
    check_spec(spec, kind)
    if "out" in unit:
        check_unit(unit["out"], spec)
    check_words(spec.get("router", []), "router argv")
    if "out" in other:
        assert other["out"].strip() and (runs[2][0] == "resolve" or json.loads(other["out"]))
        if runs[2][0] == "resolve":  # --format shell: nothing a terminal reads as a control
            shown = other["out"].replace("\n", "").replace("\t", "")
            assert shown.isprintable(), f"--format shell printed {other['out']!r}"
    return "resolved"


def runs_for(options: list[str], other: str = "shell") -> list[list[str]]:
    """The commands run on a recipe: ``resolve`` as JSON and as a unit, then ``resolve
    --format shell`` or ``recipes show`` (``other``)."""
    resolve = ["resolve", "{file}", *options, "--format"]
    third = [*resolve, "shell"] if other == "shell" else ["recipes", "show", "{file}", "--json"]
    return [[*resolve, "json"], [*resolve, "unit"], third]


def option(flag: str, choices: list[Any]) -> Any:
    return st.one_of(st.none(), st.sampled_from(choices)).map(
        lambda v: [] if v is None else [flag, str(v)]
    )


def flat(parts: Any) -> list[str]:
    return [w for p in parts for w in p]


def card_hints(touched: list[Loc]) -> list[str]:
    """The options that select what the mutations changed: the delta (``--set AXIS=VALUE``)
    and the target of the option holding it."""
    out: list[str] = []
    for loc in touched:
        if "deltas" in loc[:-1] and isinstance(loc[loc.index("deltas") + 1], str):
            out += ["--set", loc[loc.index("deltas") + 1]]
        if len(loc) > 3 and loc[0] == "strategies" and loc[2] == "options":
            try:
                target = CARD_SEED["strategies"][loc[1]]["options"][loc[3]]["target"]
            except (IndexError, KeyError, TypeError):
                continue
            out += ["--target", target]
    return out


def vllm_hints(touched: list[Loc]) -> list[str]:
    """The options that select what the mutations changed: a feature, a variant, a strategy."""
    flags = {"features": "--feature", "variants": "--variant", "strategy_overrides": "--strategy"}
    return flat(
        [flags[loc[0]], loc[1]]
        for loc in touched
        if len(loc) > 1 and loc[0] in flags and isinstance(loc[1], str)
    )


CARD_SEED = json.loads(SEED_CARD.read_text())
CARD_AXES = sorted(
    {
        f"{axis}={value}"
        for s in CARD_SEED["strategies"]
        for o in s["options"]
        for part in ("modes", "options")
        for axis, vals in (o["grid"].get(part) or {}).items()
        for value in vals
    }
)
card_options = st.tuples(
    option("--target", ["Latency", "Throughput", "throughput", *HOSTILE[:12]]),
    option("--strategy", ["aggregated", "-h", "x" * 300]),
    st.lists(st.sampled_from([*CARD_AXES, "lmcache", "=x", "x=", "\n=\n"]), max_size=2).map(
        lambda sets: [w for s in sets for w in ("--set", s)]
    ),
    st.sampled_from([[], ["--recommended"]]),
    option("--sku", ["RBLN-CR13", "RBLN-CA12", "\n"]),
    option("--compiler-version", ["0.12.0", "9" * 40, "x\ny"]),
).map(flat)

VLLM_SEEDS = [yaml.safe_load(p.read_text()) for p in (SEED_VLLM, *MORE_VLLM)]
SITE_JSON_SEED = json.loads(SEED_SITE_JSON.read_text())
vllm_options = st.tuples(
    option("--hardware", ["h200", "h100", "b200", "mi300x", "mi355x", "dgx_spark_gb10", "-h"]),
    option("--strategy", ["single_node_tp", "multi_node_tp", "multi_node_dep", "nope"]),
    option("--variant", ["default", "amd_fp8", "nope", "\n"]),
    option("--tp", [1, 2, 8, 0, -1, 10**6]),
    st.lists(
        st.sampled_from(["tool_calling", "spec_decoding", "spec_decoding=x", "=", "\n"]),
        max_size=2,
    ).map(lambda fs: [w for f in fs for w in ("--feature", f)]),
    option("--no-feature", ["tool_calling", "nope"]),
    option("--kv-offload", ["lmcache", "nope"]),
    option("--task", ["t2v", "nope"]),
).map(flat)


@st.composite
def card_case(draw: Any, yaml_form: bool = False) -> tuple[str | None, list[list[str]]]:
    """A mutated card's text and the commands to run on it."""
    doc, raws, touched = draw(mutated(CARD_SEED, yaml_form=yaml_form))
    text = dump(doc, raws, yaml_form=yaml_form)
    if text is not None and not yaml_form and draw(st.booleans()):
        text = f"gpt-oss-120b\n{text}\nNotes: {{not json}}\n"  # as the page: title, card, prose
    text = text if text is None else with_raw_control(draw, text)
    other = draw(st.sampled_from(["shell", "show"]))
    options = draw(st.one_of(st.just([]), card_options))  # half the time: the defaults
    return text, runs_for([*options, *card_hints(touched)], other)


@st.composite
def vllm_case(draw: Any, site_json: bool = False) -> tuple[str | None, list[list[str]]]:
    """A mutated vLLM recipe's text (with ``site_json``, of the site's JSON form) and the
    commands to run on it."""
    if site_json:
        seed = SITE_JSON_SEED
    else:
        seed = draw(st.sampled_from(VLLM_SEEDS[:1] * 2 + VLLM_SEEDS[1:]))  # gpt-oss-120b first
    focus = "recommended_command" if site_json else None  # what only the JSON form has
    doc, raws, touched = draw(mutated(seed, yaml_form=not site_json, focus=focus))
    options = [*draw(st.one_of(st.just([]), vllm_options)), *vllm_hints(touched)]
    text = dump(doc, raws, yaml_form=not site_json)
    text = text if text is None else with_raw_control(draw, text)
    return text, runs_for(options, draw(st.sampled_from(["shell", "show"])))


@fuzz("card")
@given(case=card_case())
def test_a_mutated_card_resolves_or_is_one_line(worker: Worker, case: Any) -> None:
    text, runs = case
    if text is not None:
        check(worker.ask("card.json", text, runs), runs, "rbln")


@fuzz("card_yaml")
@given(case=card_case(yaml_form=True))
def test_a_mutated_card_written_as_yaml_is_one_line(worker: Worker, case: Any) -> None:
    """A card written as YAML (with aliases and tags) is no card: one line, never a crash."""
    text, runs = case
    if text is not None:
        for run, result in zip(runs, worker.ask("card.yaml", text, runs), strict=True):
            check_one_line(run, result)


@fuzz("vllm")
@given(case=vllm_case())
def test_a_mutated_vllm_recipe_resolves_or_is_one_line(worker: Worker, case: Any) -> None:
    text, runs = case
    if text is not None:
        check(worker.ask("vllm/fuzz.yaml", text, runs), runs, "vllm")


@fuzz("vllm_json")
@given(case=vllm_case(site_json=True))
def test_a_mutated_site_json_recipe_resolves_or_is_one_line(worker: Worker, case: Any) -> None:
    """The recipes site's JSON form: its recommended_command picks the default selection."""
    text, runs = case
    if text is not None:
        check(worker.ask("vllm/fuzz.json", text, runs), runs, "vllm")


def test_the_seeds_resolve_through_the_worker(worker: Worker) -> None:
    """The harness can tell a resolved spec: each unmutated seed resolves and its unit parses."""
    card = runs_for([], "show")
    assert check(worker.ask("card.json", SEED_CARD.read_text(), card), card, "rbln") == "resolved"
    vllm = runs_for(["--hardware", "h200"])
    outcome = check(worker.ask("vllm/fuzz.yaml", SEED_VLLM.read_text(), vllm), vllm, "vllm")
    assert outcome == "resolved"
    site = runs_for([])
    outcome = check(worker.ask("vllm/fuzz.json", SEED_SITE_JSON.read_text(), site), site, "vllm")
    assert outcome == "resolved"


def test_the_harness_reports_crashes_memory_blow_ups_and_hangs(worker: Worker) -> None:
    """The harness can fail: an exception other than ServefleetError is a crash naming its
    frame, a run past the memory budget ends in MemoryError, a hang is killed at its deadline,
    and the next request gets a fresh worker."""
    runs = [["resolve", "{file}", "--tp", "1"]]
    (refused,) = worker.ask("card.json", SEED_CARD.read_text(), runs)
    assert "--tp" in refused["error"] and "crash" not in refused  # one line, not a crash
    (crash,) = worker.send({"selftest": "crash"}, HARD_SECONDS)
    assert crash["crash"] == "KeyError" and "fuzz_worker.py" in crash["where"]
    with pytest.raises(AssertionError, match="KeyError"):
        check_one_line(["selftest"], crash)
    (blow_up,) = worker.send({"selftest": "allocate"}, HARD_SECONDS)
    assert blow_up["crash"] == "MemoryError"
    with pytest.raises(AssertionError, match="no answer within 1 s"):
        worker.send({"selftest": "hang"}, 1.0)
    assert worker.proc is None  # killed
    (again,) = worker.ask("card.json", SEED_CARD.read_text(), runs)
    assert again == {**refused, "seconds": again["seconds"]}
