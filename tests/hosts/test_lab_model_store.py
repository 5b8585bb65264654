"""The lab's model store on a running lab: ``servefleet lab models`` lists the recipes' models
(drafts included) as the store serves them, a lab host fetches one with the fetcher the deploy
uploads, a deploy without a store fetches from the lab's Hugging Face hub with the release's real
``huggingface_hub``, and ``lab up --models`` adds models the store then serves (destructive: it
re-ups the lab and leaves a default 3-host lab behind)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from faults import run, secrets
from labhelpers import lab_up, on_host, servefleet

from servefleet.fleet.lab.chat import chat_once
from servefleet.hostplan.probe_input import REMOTE_SCRIPTS

REPO = Path(__file__).resolve().parents[2]
FETCHER = REPO / "src" / "servefleet" / "base" / "remote" / "fetch_model.py"
# the fetcher and every host program beside it, as a deploy ships them (what it imports)
PROGRAMS = [FETCHER.with_name(name) for name in REMOTE_SCRIPTS]
SEEDS = ["openai/gpt-oss-120b", "nvidia/gpt-oss-120b-Eagle3-v3"]  # the RBLN card and its draft
ADDED = ["acme/lab-extra-1", "acme/lab-extra-2"]
HOST_DIR = "/tmp/servefleet-test-fetch"


def listed() -> dict[str, tuple[str, str]]:
    """``servefleet lab models``: model -> (revision, sha256)."""
    rows = [line.split() for line in servefleet("lab", "models").stdout.splitlines()]
    assert rows and all(len(row) == 3 for row in rows), rows
    return {model: (rev, sha) for model, rev, sha in rows}


def fetch_on_host(
    state: dict[str, Any],
    host: str,
    model: str,
    source: list[str] | None = None,
    token: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the fetcher on host (its system python3) into a scratch HF_HOME, from the store (or
    ``source``), with the lab's token (or ``token``) in a 0600 file; the scratch directory is
    removed afterwards."""
    token = token or Path(state["secrets"]["HF_TOKEN"]).read_text()
    on_host(state, host, f"rm -rf {HOST_DIR} && mkdir -m 700 {HOST_DIR}")
    for program in PROGRAMS:
        on_host(state, host, f"cat > {HOST_DIR}/{program.name}", stdin=program.read_text())
    on_host(state, host, f"umask 077 && cat > {HOST_DIR}/token", stdin=token)
    cmd = [
        "python3", f"{HOST_DIR}/fetch_model.py", model, f"{HOST_DIR}/hf", "root",
        *(source or ["--store", state["model_store"]["url"]]),
        "--token-file", f"{HOST_DIR}/token", "--token-env", "HF_TOKEN",
    ]  # fmt: skip
    marker = f"{HOST_DIR}/hf/hub/models--{model.replace('/', '--')}/.servefleet-complete"
    script = f"{shlex.join(cmd)} && cat {marker}; rc=$?; rm -rf {HOST_DIR}; exit $rc"
    return on_host(state, host, script, check=False)


def test_lab_models_lists_the_recipe_models_as_served(lab: dict[str, Any]) -> None:
    models = listed()
    assert set(SEEDS) <= set(models)
    for model, entry in lab["model_store"]["models"].items():
        assert models[model] == (entry["revision"], entry["sha256"])


def test_a_host_fetches_a_seed_model_complete(lab: dict[str, Any]) -> None:
    proc = fetch_on_host(lab, "lab1", SEEDS[1])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == lab["model_store"]["models"][SEEDS[1]]["revision"]


def test_a_host_fetching_an_unknown_model_gets_one_line(lab: dict[str, Any]) -> None:
    proc = fetch_on_host(lab, "lab1", ADDED[0])
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    store = lab["model_store"]["url"].rstrip("/")
    assert proc.stderr.strip() == f"servefleet: {ADDED[0]} is not in the store ({store})"


HUB_HOME = "/var/lib/servefleet/hf/hub"
HUB = ["--data", "models_store_url=null"]  # then models_hub_url: the lab's hub (group_data)


def chat_within(address: str, seconds: float) -> str:
    """The server's first reply to a chat within seconds (it may be starting)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return chat_once(address, 8000, SEEDS[0], "Hello", max_tokens=4)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_a_deploy_without_a_store_fetches_from_the_lab_hub_with_the_real_client(
    lab: dict[str, Any],
) -> None:
    """No store: the fetch runs the release's own huggingface_hub (the real 2.4.0 that vllm pulls
    in) against the lab's hub API (HF_ENDPOINT = models_hub_url). A wrong token gets the hub's
    refusal in one line; the right one lands the model as a hub download lays it out (snapshot
    files linking into blobs), the serve user's, marked with the hub's revision, nothing left in
    /run or the hub; a server restarted on it serves."""
    top = "models--" + SEEDS[0].replace("/", "--")
    rev = lab["model_store"]["models"][SEEDS[0]]["revision"]
    address = next(h["address"] for h in lab["hosts"] if h["name"] == "lab1")
    done = run(lab, "--limit", "lab1")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    on_host(lab, "lab1", f"rm -rf {HUB_HOME}/{top}")
    python = "/opt/servefleet/current/bin/python"
    version = on_host(
        lab, "lab1", f"{python} -c 'import huggingface_hub as h; print(h.__version__)'"
    )
    assert version.stdout.strip() == "2.4.0"  # the real client, from the lab's public index
    hub = ["--hub", python, "--endpoint", lab["servers"]["hub"]["url"]]
    refused = fetch_on_host(lab, "lab1", SEEDS[0], hub, token="hf_wrong")
    assert refused.returncode == 1 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert refused.stderr.startswith(f"servefleet: the Hugging Face hub refused {SEEDS[0]} (")
    assert refused.stderr.rstrip().endswith(
        "check the HF_TOKEN environment variable on the controller"
    )
    done = run(lab, "--limit", "lab1", *HUB)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    repo = f"{HUB_HOME}/{top}"
    got = on_host(lab, "lab1", f"cat {repo}/.servefleet-complete; echo; cat {repo}/refs/main; echo; "
                  f"readlink {repo}/snapshots/{rev}/model.safetensors; "
                  f"find {repo} ! -user servefleet | wc -l; ls -a {HUB_HOME} | grep -c '^[.]fetch-'; "
                  "ls /run | grep -c servefleet-fetch-", check=False).stdout.split()  # fmt: skip
    sha = got[2].rsplit("/", 1)[-1]
    assert got == [rev, rev, f"../../blobs/{sha}", "0", "0", "0"], got
    log = Path(lab["servers"]["hub"]["log"]).read_text()
    assert f'{address} "GET /{SEEDS[0]}/resolve/{rev}/model.safetensors HTTP/1.1" 200' in log
    on_host(lab, "lab1", "systemctl restart servefleet-vllm-0.service")
    assert chat_within(address, 60)


def custom_card(model: str, max_len_flag: str = "--max-model-len") -> dict[str, Any]:
    """A card written for this test: flags the seed card does not use, 4 NPUs a server."""
    args = {
        "--override-generation-config": (
            '--override-generation-config \'{"temperature": 0.6, "top_p": 0.95}\''
        ),
        "--served-model-name": "--served-model-name 'custom moe'",
        max_len_flag: f"{max_len_flag}=32768",
        "--tensor-parallel-size": "--tensor-parallel-size 4",
    }
    grid = {
        "model": model,
        "base": [{"role": "main", "launcher": "vllm serve", "args": args, "envs": {}}],
        "modes": {},
        "options": {"sampler": ["on"]},
        "option_base": {"sampler": "on"},
        "recommended": {"sampler": "on"},
        "excluded": [],
        "deltas": {},
    }
    option = {"target": "Latency", "npus": 4, "skus": ["RBLN-CR13"], "grid": grid}
    return {
        "name": "custom-4npu",
        "model": model,
        "axes": [
            {"axis": "sampler", "title": "Sampler", "options": [{"label": "On", "value": "on"}]}
        ],
        "strategies": [{"slug": "tp4", "label": "Four devices", "options": [option]}],
    }


def deploy_card(state: dict[str, Any], card: dict[str, Any], tmp: Path, name: str) -> Any:
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(card))
    env = {**os.environ, **secrets(state), "PYINFRA_PROGRESS": "off"}
    return run(state, "--limit", "lab2", "--data", f"serve_recipe={path}", env=env)


@pytest.mark.lab_destructive
def test_lab_up_models_adds_models_the_store_serves(lab: dict[str, Any], tmp_path: Path) -> None:
    try:
        state = lab_up("--models", ",".join(ADDED))
        models = listed()
        assert set(SEEDS) | set(ADDED) <= set(models)
        proc = fetch_on_host(state, "lab2", ADDED[1])
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.splitlines()[-1] == models[ADDED[1]][0]
        # a card of our own, its model from --models: 1 instance of 4 NPUs serves on lab2
        card = custom_card(ADDED[0])
        done = deploy_card(state, card, tmp_path, "custom")
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        (tmp_path / "c.json").write_text(json.dumps(card))
        want = resolved_card(tmp_path / "c.json")
        rec = json.loads(on_host(state, "lab2", "cat /run/rbln-sim/vllm-8000.json").stdout)
        assert rec["argv"][1:] == want + ["--port", "8000", "--shutdown-timeout", "60",
                                          "--middleware", "servefleet_paths.OpenPaths"]  # fmt: skip
        assert rec["env"]["RBLN_VISIBLE_DEVICES"] == "0,1,2,3"
        units = on_host(state, "lab2", "ls /etc/systemd/system | grep servefleet-vllm").stdout
        assert units.split() == ["servefleet-vllm-0.service"]
        address = next(h["address"] for h in state["hosts"] if h["name"] == "lab2")
        assert chat_once(address, 8000, "custom moe", "Hello", max_tokens=4)
        # the same card with a misspelt flag: the pre-flight refuses it before any restart
        # (#22), argparse's line shown, and the server keeps serving
        bad = deploy_card(state, custom_card(ADDED[0], "--max-modle-len"), tmp_path, "bad")
        out = bad.stdout + bad.stderr
        assert bad.returncode != 0
        assert "servefleet: pre-flight: servefleet-vllm-0.service: --max-modle-len" in out
        assert "unrecognized arguments: --max-modle-len=32768" in out
        assert "Traceback" not in out and "Converge the instances" not in out
        assert chat_once(address, 8000, "custom moe", "Hello", max_tokens=4), "still serving"
    finally:  # leave the default lab for whoever comes next
        lab.clear()
        lab.update(lab_up())
    assert not set(ADDED) & set(listed())


def resolved_card(path: Path) -> list[str]:
    out = servefleet("resolve", str(path))
    return list(json.loads(out.stdout)["servers"][0]["argv"][1:])
