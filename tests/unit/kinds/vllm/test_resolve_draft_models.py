"""The models a vLLM server needs (``resolve.py``'s ``_models``): the served model and the draft
model of a ``--speculative-config`` in either form, as the mutation campaign (#37) found the
recipes' argv never holds the one-token form, a local draft directory, a bad config before a
good one, or the flag last."""

from __future__ import annotations

from servefleet.kinds.vllm.resolve import _models

SPEC = '{"method": "eagle3", "model": "acme/draft", "note": "a=b"}'


def test_the_draft_model_of_either_form() -> None:
    assert _models("acme/m", ["--speculative-config", SPEC]) == ["acme/m", "acme/draft"]
    # the value after the first "=" only, an "=" in the JSON kept
    assert _models("acme/m", ["--speculative-config=" + SPEC]) == ["acme/m", "acme/draft"]
    assert _models("acme/m", ["--speculative-config=" + SPEC, "--speculative-config", SPEC]) == [
        "acme/m",
        "acme/draft",
    ]


def test_a_local_draft_directory_is_a_model() -> None:
    spec = '{"method": "eagle3", "model": "/models/draft"}'
    assert _models("acme/m", ["--speculative-config", spec]) == ["acme/m", "/models/draft"]


def test_only_the_speculative_config_names_a_draft() -> None:
    other = '{"model": "acme/not-a-draft"}'
    assert _models("acme/m", ["--hf-overrides", other, "--port", "8000"]) == ["acme/m"]


def test_a_bad_config_or_the_flag_last_names_none_and_stops_nothing() -> None:
    argv = ["--speculative-config", "not json", "--speculative-config", SPEC]
    assert _models("acme/m", argv) == ["acme/m", "acme/draft"]
    assert _models("acme/m", ["--port", "1", "--speculative-config"]) == ["acme/m"]
