"""A model or a compile cache that differs from what root recorded (#36, ``serve_verify``): the
plan fetches a drifted model again (it counts as missing) and warms a drifted cache again (it is
not warm), and names each difference."""

from __future__ import annotations

from host_inputs import converged_probe, settings

from servefleet.hostplan.plan import plan_host

LINE = "model.safetensors has 0 bytes, fetched with 13"


def test_a_drifted_model_is_missing_and_named() -> None:
    clean = plan_host(settings(), converged_probe())
    model = clean.spec.requirements.models[0]
    assert clean.converged and clean.missing_models == () and clean.model_drift == ()
    plan = plan_host(settings(), converged_probe(model_drift={model: [LINE]}))
    assert plan.missing_models == (model,)
    assert plan.model_drift == (f"model {model}: {LINE}",)
    # the servers keep running what they loaded: only the model is fetched again
    assert plan.converged and plan.release_complete
    # a model the host does not serve (another recipe's) is not fetched for it
    other = plan_host(settings(), converged_probe(model_drift={"acme/other": [LINE]}))
    assert other.missing_models == () and other.model_drift == ()


def test_a_drifted_cache_is_not_warm_and_named() -> None:
    clean = plan_host(settings(), converged_probe())
    fp = clean.spec.compile_fingerprint
    assert fp and clean.warm and clean.cache_drift == ()
    line = "rbln/m/sig/rank0/mega_cache.bin differs from the sha256 it was sealed with"
    plan = plan_host(settings(), converged_probe(cache_drift={fp: [line]}))
    assert not plan.warm and not plan.converged  # the deploy drops it and warms it again
    assert plan.cache_drift == (f"cache {fp}: {line}",)
    assert all(i.converged for i in plan.instances)  # nothing restarts but what drop stops
    # another fingerprint's cache (a recipe the host ran before) is no business of this plan
    old = plan_host(settings(), converged_probe(cache_drift={"0" * 64: [line]}))
    assert old.warm and old.converged and old.cache_drift == ()
