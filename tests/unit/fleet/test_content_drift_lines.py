"""``plan`` and ``status`` on a host whose model or compile cache differs from what root
recorded (#36, ``status --verify``): the plan's table marks the model fetched again and the cache
warmed again, status names each file in a line of its own (and exits 1 on them), and says what
each probe read and hashed."""

from __future__ import annotations

from host_inputs import converged_probe, settings

from servefleet.fleet.fleetview import plan_summary, plan_table
from servefleet.fleet.statusview import (
    missing_status,
    status_problems,
    status_summary,
    verified_lines,
)
from servefleet.hostplan.plan import plan_host

MODEL_LINE = "model.safetensors has 0 bytes, fetched with 13"
CACHE_LINE = "rbln/m/sig/rank0/mega_cache.bin differs from the sha256 it was sealed with"


def drifted() -> tuple[str, str, dict]:
    clean = plan_host(settings(), converged_probe())
    model, fp = clean.spec.requirements.models[0], clean.spec.compile_fingerprint
    probe = converged_probe(model_drift={model: [MODEL_LINE]}, cache_drift={fp: [CACHE_LINE]},
                            verified={clean.release.id: {"files": 30429, "bytes": 1_800_000_000},
                                      f"model {model}": {"files": 3, "bytes": 65_000_000,
                                                         "unchecked": 1},
                                      f"cache {fp}": {"files": 2, "bytes": 4_000_000}})  # fmt: skip
    return model, fp or "", probe


def test_plan_marks_what_it_fetches_and_warms_again() -> None:
    model, fp, probe = drifted()
    p = plan_summary(plan_host(settings(), probe))
    assert p["changes"] and p["models"] == [model] and p["recompile"]
    assert p["model_drift"] == [f"model {model}: {MODEL_LINE}"]
    assert p["cache_drift"] == [f"cache {fp}: {CACHE_LINE}"]
    row = next(line for line in plan_table({"h1": p}).splitlines() if line.startswith("h1"))
    assert f"{model} (drifted)" in row and row.endswith("yes (drifted)")


def test_status_names_each_file_and_what_it_read() -> None:
    model, fp, probe = drifted()
    plan = plan_host(settings(), probe)
    st = status_summary(plan, {str(i.port): "ok" for i in plan.instances}, "10.0.0.1")
    assert st["warm"] is False
    assert status_problems("h1", st) == [
        f"h1: model {model}: {MODEL_LINE}",
        f"h1: cache {fp}: {CACHE_LINE}",
    ]
    assert verified_lines({"h1": st}) == [
        f"h1: release {plan.release.id}: 30429 files, 1800.0 MB read and hashed",
        f"h1: model {model}: 3 files, 65.0 MB read and hashed; 1 file(s) with nothing recorded "
        "to hold them to",
        f"h1: cache {fp}: 2 files, 4.0 MB read and hashed",
    ]
    # every status has the same keys: one the run could not reach too
    assert set(missing_status({"unreachable": "x"}, "10.0.0.2", [])) - {"unreachable"} == set(st)
