"""The simulator's ``vllm serve`` flag table against the dumps of the real parser's argparse
actions (the version's reference data, servefleet/reference/vllm/<version>, verbatim copies of
the shared reference dumps, which the lab's build copies into the simulated vllm's flags/): every
spelling and no invented one, the same action kinds, dests, nargs and choices, on both
platforms; values accepted and refused as vLLM 0.30.0's value parsers do; every command line the
product renders parses."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given, settings, strategies as st
from lab_sim_support import REPO, load_sim
from rbln_cases import COMPILER, combinations, seed

from servefleet.base.errors import RecipeError
from servefleet.base.shipped import FILES
from servefleet.base.vllm_reference import MANIFEST, reference
from servefleet.kinds.rbln.resolve import resolve_rbln
from servefleet.kinds.vllm import (
    load_vllm_recipe,
    offered_hardware,
    resolve_vllm,
    single_node_strategies,
)

SIM = load_sim("servefleet_lab_vllm_sim_flags")
FLAGS = reference().root  # what the simulated wheel carries in vllm/flags (test_lab_sim.py)
REFERENCE = REPO.parent / "shared" / "reference" / "vllm-serve-flags"  # shared/ beside the repo
PLATFORMS = {"rbln": "vllm-0.30.0-rbln-0.12.0.json", "upstream": "vllm-0.30.0-upstream.json"}
# the config classes' schemas and the wheel's chat templates (test_sim_configs.py beside this)
CONFIGS = {
    "rbln": "vllm-0.30.0-rbln-0.12.0-configs.json",
    "upstream": "vllm-0.30.0-upstream-configs.json",
}
CHAT_TEMPLATES = "vllm-0.30.0-chat-templates.txt"
VLLM_RECIPES = FILES / "recipes" / "vllm"
BOOLS = ("BooleanOptionalAction", "_StoreRblnBool", "_StoreTrueAction")
# Flags the property test leaves out, each for a reason
UNMODELED = {
    "help": "prints the help and exits 0: not a value",
    "config": "vLLM reads a YAML file of arguments; the simulator takes the path as text only",
    "model": "moves to the positional (tested in test_model_flag_is_the_positional)",
}
# Flags a rendered vLLM-recipe command line uses that vLLM 0.30.0 does not know: flag -> why.
# None today: every flag of recipes/vllm is in the upstream dump (the test fails on a new one).
KNOWN_UNKNOWN_UPSTREAM: dict[str, str] = {}


def _config_fields() -> dict[str, set[str]]:
    """dest -> the fields of its config class, for the classes the configs dump has a schema of
    (the two platforms' schemas are the same: test_sim_configs.py)."""
    text = (FLAGS / CONFIGS["upstream"]).read_text()
    classes = json.loads(text)
    dests = {
        e["flags"][0]: e["dest"]
        for e in json.loads((FLAGS / PLATFORMS["upstream"]).read_text())["flags"]
    }
    return {
        dests[flag]: set(c["schema"]["properties"])
        for flag, c in classes.items()
        if "properties" in c["schema"]
    }


def dump(platform: str) -> list[dict[str, Any]]:
    flags: list[dict[str, Any]] = json.loads((FLAGS / PLATFORMS[platform]).read_text())["flags"]
    return flags


CONFIG_FIELDS = _config_fields()


def run(platform: str, argv: list[str]) -> str:
    """``ok``, ``refused`` (exit 2 with argparse's message) or ``crash`` (a ValueError)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            SIM.parse_serve_args(argv, platform)
    except SystemExit as exc:
        assert exc.code == 2 and "vllm serve: error: " in err.getvalue(), err.getvalue()
        return "refused"
    except ValueError:
        return "crash"
    return "ok"


# ---------------------------------------------------------------------------------------------
# The table, both ways


def test_vendored_dumps_are_the_platform_tables() -> None:
    assert SIM.PLATFORMS == PLATFORMS and SIM.DEFAULT_PLATFORM == "rbln"
    assert {n: t.flags.name for n, t in reference().tables.items()} == PLATFORMS
    assert {n: t.configs.name for n, t in reference().tables.items()} == CONFIGS
    assert reference().chat_templates.name == CHAT_TEMPLATES
    assert {p.name for p in FLAGS.glob("vllm-0.30.0-*.json")} == {
        *PLATFORMS.values(),
        "vllm-0.30.0-envs.json",
        "vllm-0.30.0-parsers.json",  # the registries (tests/realvllm/gen_registries.py)
        "vllm-0.30.0-metrics.json",  # the real metrics and routes (tests/realvllm/gen_surface.py)
        "vllm-0.30.0-routes.json",
        *CONFIGS.values(),
    }
    assert {p.name for p in reference().files()} == {p.name for p in FLAGS.iterdir()} - {MANIFEST}
    assert {p.name for p in FLAGS.iterdir()} == {
        MANIFEST,
        *PLATFORMS.values(),
        "vllm-0.30.0-envs.json",
        "vllm-0.30.0-parsers.json",
        "vllm-0.30.0-metrics.json",
        "vllm-0.30.0-routes.json",
        *CONFIGS.values(),
        CHAT_TEMPLATES,
    }


@pytest.mark.skipif(not REFERENCE.is_dir(), reason="the reference dumps are not on this machine")
def test_vendored_dumps_are_verbatim_copies() -> None:
    for name in [*PLATFORMS.values(), *CONFIGS.values(), CHAT_TEMPLATES]:
        assert (FLAGS / name).read_bytes() == (REFERENCE / name).read_bytes()


@pytest.mark.parametrize(
    ("platform", "actions", "spellings"), [("rbln", 321, 438), ("upstream", 301, 407)]
)
def test_table_matches_the_dump_both_ways(platform: str, actions: int, spellings: int) -> None:
    entries = dump(platform)
    parser = SIM.build_parser(platform)
    options = {s: a for a in parser._actions for s in a.option_strings}
    dumped = [f for e in entries for f in e["flags"]]
    assert len(entries) == actions and len(dumped) == len(set(dumped)) == spellings
    assert set(options) == set(dumped)  # no spelling missing, none invented
    # the dumps list options only; vllm serve's positional model is the one addition
    assert [a.dest for a in parser._actions if not a.option_strings] == ["model_tag"]
    assert len(parser._actions) == actions + 1
    for entry in entries:
        action = options[entry["flags"][0]]
        got = {
            "flags": action.option_strings,  # the --no- forms included, in the dump's order
            "action": type(action).__name__,  # bool / store / store_true / append / vllm's own
            "dest": action.dest,
            "nargs": action.nargs,
            "choices": action.choices,
        }
        assert got == {key: entry[key] for key in got}, entry["flags"][0]


def test_platforms_differ_as_vllm_rbln_makes_them() -> None:
    rbln = {e["dest"]: e for e in dump("rbln")}
    upstream = {e["dest"]: e for e in dump("upstream")}
    assert set(upstream) <= set(rbln)
    assert {d for d in upstream if upstream[d] != rbln[d]} == {
        "compilation_config",
        "additional_config",
        "gpu_memory_utilization",
    }
    assert all(d.startswith("rbln_") for d in set(rbln) - set(upstream))
    assert SIM.parse_serve_args(["m"], "rbln").gpu_memory_utilization == 0.93
    assert SIM.parse_serve_args(["m"], "upstream").gpu_memory_utilization == 0.92
    assert run("rbln", ["m", "--rbln-use-w8a8"]) == "ok"
    assert run("upstream", ["m", "--rbln-use-w8a8"]) == "refused"


def test_simulator_reads_dests_both_tables_have() -> None:
    read = {*SIM.CONFIG_FIELDS, "max_num_seqs", "num_gpu_blocks_override", "port", "host"}
    read |= {"gpu_memory_utilization", "kv_transfer_config", "speculative_config"}
    read |= {"served_model_name"}
    for platform in PLATFORMS:
        assert read <= {e["dest"] for e in dump(platform)}, platform
    assert {"rbln_" + f for f, _, _ in SIM.RBLN_FIELDS} <= {e["dest"] for e in dump("rbln")}


def test_platform_file_selects_the_table(tmp_path: Path) -> None:
    env = {"RBLN_SIM_ROOT": str(tmp_path)}
    assert SIM.sim_platform(env) == "rbln"  # no file
    switch = tmp_path / "etc/rbln-sim/platform"
    switch.parent.mkdir(parents=True)
    for text, platform in [("", "rbln"), ("upstream\n", "upstream"), (" rbln ", "rbln")]:
        switch.write_text(text)
        assert SIM.sim_platform(env) == platform
    switch.write_text("gpu\n")
    with pytest.raises(SIM.SimError, match="names platform 'gpu'; expected one of rbln, upstream"):
        SIM.sim_platform(env)


def test_model_flag_is_the_positional() -> None:
    assert SIM.parse_serve_args(["--port", "1", "--model", "a/b"]).model == "a/b"
    assert SIM.parse_serve_args(["--model=a/b"]).model == "a/b"
    assert SIM.parse_serve_args([]).model == "Qwen/Qwen3-0.6B"  # vLLM's default model
    assert run("rbln", ["a/b", "--model", "c/d"]) == "refused"  # c/d moves first: a/b is extra


def test_flexible_parser_habits() -> None:
    ns = SIM.parse_serve_args(
        [
            "m",
            "--max_model_len=32k",
            "--speculative-config",
            '{"method": "eagle3", "num_speculative_tokens": 3}',
            "--speculative_config.model",
            "d/e",
            "-cc.pass_config.fuse_rope_kvcache=True",
            "--compilation-config.cudagraph_capture_sizes+",
            "1,2",
        ]
    )
    assert ns.max_model_len == 32000
    # the dotted sub-keys' object goes after the flag's own JSON and replaces it, as in vLLM
    assert ns.speculative_config == {"model": "d/e"}
    # one object per spelling: -cc's, then --compilation-config's, which wins (the last one)
    assert ns.compilation_config == {"cudagraph_capture_sizes": ["1", "2"]}
    ns = SIM.parse_serve_args(["m", "-cc.pass_config.fuse_rope_kvcache=True"])
    assert ns.compilation_config == {"pass_config": {"fuse_rope_kvcache": "True"}}  # the text
    ns = SIM.parse_serve_args(["m", "--hf-overrides.a", "1k", "--hf-overrides.b", "2M",
                               "--hf-overrides.c", "auto", "--hf-overrides.d", "null",
                               "--hf-overrides.e", "True", "--hf-overrides.f", "1.5K"])  # fmt: skip
    assert ns.hf_overrides == {
        "a": 1000,
        "b": 2097152,
        "c": "auto",
        "d": None,
        "e": "True",
        "f": "1.5K",
    }  # fmt: skip  (as the real parser reads them)
    assert run("rbln", ["m", "--compilation-config.backend", "True"]) == "ok"
    assert run("rbln", ["m", "--compilation-config.max_cudagraph_capture_size", "1k"]) == "ok"
    cc = '{"max_cudagraph_capture_size": 1k}'  # bare human-readable numbers in the JSON too
    assert SIM.parse_serve_args(["m", "-cc", cc]).compilation_config == {
        "max_cudagraph_capture_size": 1000
    }
    assert run("rbln", ["m", "--port.x", "1"]) == "refused"  # the object goes to int()
    assert run("rbln", ["m", "--no-such.key", "1"]) == "refused"


# ---------------------------------------------------------------------------------------------
# Values: vLLM 0.30.0's value parsers, restated here as the oracle


def _int(value: str) -> bool:
    try:
        int(value)
    except ValueError:
        return False
    return True


def _json(value: str) -> tuple[bool, Any]:
    try:
        return True, json.loads(value)
    except ValueError:
        return False, None


def accepts(name: str | None, dest: str, value: str) -> bool:
    """Whether vLLM's value parser ``name`` (the dump's ``type``) takes ``value``."""
    wrapped = re.fullmatch(r"(\w+)\((.*)\)", name or "")
    if wrapped and wrapped.group(1) == "_optional_type":
        return value in ("", "None") or accepts(wrapped.group(2), dest, value)
    if wrapped and wrapped.group(1) == "_parse_type":
        return accepts(wrapped.group(2), dest, value)
    if name == "<lambda>" and dest == "device_ids":
        return all(_int(x) for x in value.split(","))
    if name in (None, "str", "<lambda>"):
        return True
    if name == "int":
        return _int(value)
    if name == "float":
        try:
            float(value)
        except ValueError:
            return False
        return True
    if name == "loads":
        return _json(value)[0]
    if name == "parse_dataclass":  # a JSON object; with a schema, of the class's fields only
        ok, obj = _json(value)
        if not (ok and isinstance(obj, dict)):
            return False
        fields = CONFIG_FIELDS.get(dest)
        if fields is None:
            return True
        assert not set(obj) & fields, f"no oracle for the values of {dest}'s fields: {value}"
        return not obj
    if name == "union_dict_and_str":
        return not re.match(r"(?s)^\s*{.*}\s*$", value) or _json(value)[0]
    if name == "human_readable_int_or_auto":
        return value.strip() in ("auto", "-1") or accepts("human_readable_int", dest, value)
    if name == "human_readable_int":
        suffixed = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value.strip())
        if suffixed:  # binary suffixes (upper case) take whole numbers only
            return suffixed.group(2).islower() or "." not in suffixed.group(1)
        return _int(value)
    raise AssertionError(f"no oracle for value type {name}")


def expected(entry: dict[str, Any], values: list[str]) -> str:
    """What vLLM makes of ``values`` given to one flag: ok, refused or crash."""
    nargs = entry["nargs"]
    if len(values) != 1 and nargs is None or not values and nargs == "+":
        return "refused"
    name, dest, choices = entry["type"], entry["dest"], entry["choices"]
    for value in values:
        if not accepts(name, dest, value):
            return "refused"
        if choices is not None:  # checked on the parsed value
            if name and name.startswith("_optional_type(") and value in ("", "None"):
                return "refused"  # None is not among the choices, not even "None"
            parsed = {"<lambda>": lambda v: v.lower().replace("-", "_"), "int": int}
            if parsed.get(name, str)(value) not in choices:
                return "refused"
    if entry["action"] == "LoRAParserAction":
        for item in values:
            if item in ("", "None"):
                continue
            if "=" in item and "," not in item:
                if item.count("=") != 1:
                    return "crash"  # vLLM's `name, path = item.split("=")`
                continue
            ok, module = _json(item)
            fields = set(module) if isinstance(module, dict) else set()
            if not ok or not {"name", "path"} <= fields <= {"name", "path", "base_model_name"}:
                return "refused"
    return "ok"


GOOD: dict[str | None, str] = {
    "int": "3",
    "float": "0.5",
    "str": "x",
    None: "x",
    "loads": '{"a": 1}',
    "parse_dataclass": "{}",
    "union_dict_and_str": "cpu",
    "human_readable_int": "32k",
    "human_readable_int_or_auto": "auto",
    "<lambda>": "0,1",
}
BAD: dict[str | None, str] = {
    "int": "eight",
    "float": "half",
    "loads": "{nope",
    "parse_dataclass": "[1]",
    "union_dict_and_str": "{nope}",
    "human_readable_int": "1.5K",
    "human_readable_int_or_auto": "sometimes",
    "<lambda>": "a,b",
}


def _samples(entry: dict[str, Any]) -> tuple[str, str | None]:
    """A value the flag takes and one it refuses (None when it takes any text)."""
    name, choices = entry["type"], entry["choices"]
    inner = name
    while inner and (wrapped := re.fullmatch(r"_(?:optional|parse)_type\((.*)\)", inner)):
        inner = wrapped.group(1)
    if choices:  # a backend name also in vLLM's other spelling: BACKEND-NAME
        good = next(str(c) for c in reversed(choices) if c not in ("", "None"))
        return good.upper().replace("_", "-") if name == "<lambda>" else good, "0"
    if entry["dest"] == "device_ids":
        return GOOD["<lambda>"], BAD["<lambda>"]
    if entry["action"] == "LoRAParserAction":
        return "adapter=/path", "{nope"
    return GOOD[inner], BAD.get(inner)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_every_flag_takes_its_values_and_refuses_bad_ones(platform: str) -> None:
    wrong = []
    for entry in dump(platform):
        if entry["dest"] in UNMODELED:
            continue
        flag = entry["flags"][-1] if entry["action"] in BOOLS else entry["flags"][0]
        cases: list[tuple[list[str], str]]
        if entry["action"] in BOOLS:
            cases = [([f], "ok") for f in entry["flags"]]
            cases += [([f"{f}=1"], "refused") for f in entry["flags"] if f.startswith("--")]
        else:
            good, bad = _samples(entry)
            cases = [([flag, good], "ok"), ([f"{flag}={good}"], "ok")]
            cases += [([flag, bad], "refused")] if bad is not None else []
            cases += [([flag], "ok" if entry["nargs"] == "?" else "refused")]
            assert expected(entry, [good]) == "ok"  # the oracle agrees with the samples
            assert bad is None or expected(entry, [bad]) == "refused"
        for args, want in cases:
            if run(platform, ["m", *args]) != want:
                wrong.append((args, want))
    assert wrong == []


# ---------------------------------------------------------------------------------------------
# Every command line the product renders


def _rbln_argvs() -> list[list[str]]:
    card = seed()
    argvs = []
    for strategy, target, selection in combinations(card):
        spec = resolve_rbln(
            card, target=target, strategy=strategy, sets=selection, compiler_version=COMPILER
        )
        argvs += [server.argv for server in spec.servers]
    return argvs


def _vllm_argvs() -> list[list[str]]:
    """recipes x hardware x single-node strategies x variants, with no feature and each one on."""
    seen: dict[str, list[str]] = {}
    for path in sorted((VLLM_RECIPES / "models").glob("*/*.yaml")):
        recipe = load_vllm_recipe(path)
        declared = [g for g, v in recipe.declared_hardware.items() if v != "unsupported"]
        for gpu in declared or offered_hardware(recipe):
            for strategy in single_node_strategies(recipe, gpu):
                for variant in recipe.variants:
                    for features in [[], *([f] for f in recipe.features)]:
                        try:
                            spec = resolve_vllm(
                                recipe,
                                hardware=gpu,
                                strategy=strategy,
                                variant=variant,
                                features=features,
                            )
                        except RecipeError:  # this variant or feature does not run there
                            continue
                        argv = spec.servers[0].argv
                        seen.setdefault(json.dumps(argv), argv)
    return list(seen.values())


RENDERED = {"rbln": _rbln_argvs(), "upstream": _vllm_argvs()}


def test_every_rendered_command_line_parses_on_its_platform() -> None:
    assert len(RENDERED["rbln"]) == 108 and len(RENDERED["upstream"]) > 100
    assert all(argv[:2] == ["vllm", "serve"] for argvs in RENDERED.values() for argv in argvs)
    refused = {p: [a for a in argvs if run(p, a[2:]) != "ok"] for p, argvs in RENDERED.items()}
    assert refused["rbln"] == []
    excused = {t.split("=")[0] for a in refused["upstream"] for t in a} & set(
        KNOWN_UNKNOWN_UPSTREAM
    )
    assert [a for a in refused["upstream"] if not excused & set(a)] == []
    assert excused == set(KNOWN_UNKNOWN_UPSTREAM)  # no stale exception either


VALUE = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=8),
    st.sampled_from(
        ["", "None", "auto", "-1", "0", "32k", "1M", "25.6k", "1.5K", "2T", "0x10", "1e3", "1_000"]
        + [" 7 ", "nan", "-inf", "{}", "[]", '{"a": [1]}', " {nope} ", "[1", "null", '"s"', "0,1"]
        + ["a=b", "a=b=c", "a=b,c", '{"name": "x", "path": "y"}', "Flashinfer-Trtllm"]
    ),
    st.integers(-(10**6), 10**12).map(str),
    st.floats().map(repr),
)
ENTRIES = {p: [e for e in dump(p) if e["dest"] not in UNMODELED] for p in PLATFORMS}


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_values_are_accepted_and_refused_like_vllm(data: st.DataObject) -> None:
    """A rendered command line plus one flag of the dump with a drawn value: accepted exactly
    when vLLM's value parser, choices and nargs take the value."""
    platform = data.draw(st.sampled_from(sorted(PLATFORMS)))
    base = data.draw(st.sampled_from(RENDERED[platform]))[2:]
    entry = data.draw(st.sampled_from(ENTRIES[platform]))
    flag = data.draw(st.sampled_from(entry["flags"]))
    if flag.startswith("--") and data.draw(st.booleans()):
        flag = "--" + flag[2:].replace("-", "_")  # vLLM reads --max_model_len as --max-model-len
    if entry["action"] in BOOLS:
        value = data.draw(st.none() | VALUE) if flag.startswith("--") else None
        unit, want = ([flag], "ok") if value is None else ([f"{flag}={value}"], "refused")
    else:
        choices = st.sampled_from([str(c) for c in entry["choices"] or [""]])
        one = choices | VALUE if entry["choices"] else VALUE
        if entry["nargs"] == "+":
            values = data.draw(st.lists(one.filter(lambda v: not v.startswith("-")), max_size=3))
        else:
            values = data.draw(st.lists(one, max_size=1))
        if len(values) == 1 and (values[0].startswith("-") or data.draw(st.booleans())):
            unit = [f"{flag}={values[0]}"]  # a value starting with "-" needs the = form
        else:
            unit = [flag, *values]
        want = expected(entry, values)
    event(want)
    assert run(platform, base + unit) == want, (platform, unit)
