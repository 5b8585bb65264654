"""Models: the serve user (a system user without a login shell), the Hugging Face token, and
each missing model fetched (from the store, the hub, or the wheelhouse copy) into
``$HF_HOME/hub`` by ``remote/fetch_model.py``, checked against its sha256 and revision. With
``serve_verify``, a model whose files differ from its fetch counts as missing: it is fetched
again whole into root's staging and renamed over the drifted copy (#36)."""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.operations import server

from servefleet.base.remote.layout import HF_TOKEN_FILE
from servefleet.entry.steps import ensure
from servefleet.entry.steps.credentials import hf_token
from servefleet.entry.steps.lib import command
from servefleet.hostplan.types import NOLOGIN, HostPlan


def serve_user(plan: HostPlan) -> None:
    s = plan.settings
    if plan.account_ok:
        return
    server.group(name=f"Create group {s.serve_user}", group=s.serve_user, system=True)
    server.user(
        name=f"Create system user {s.serve_user}",
        user=s.serve_user,
        group=s.serve_user,
        system=True,
        home=s.serve_home,
        create_home=False,  # made by trees.py, checked on the host (serve_trees)
        shell=NOLOGIN,
    )


def serve_trees(plan: HostPlan) -> None:
    """The serve user's directories (its HOME with a new account, HF_HOME, the compile cache),
    made by ``remote/trees.py``, which checks each again on the host before it gives it to the
    serve user: strictly below a root meant for it, no link nor bind mount on the way, and a
    directory that is there already only when it is the serve user's (#31 finding 3)."""
    s = plan.settings
    paths = [] if plan.account_ok else [s.serve_home]
    paths += [p for p in (s.models_hf_home, s.serve_cache_root)
              if not plan.has(p, "dir", "755", s.serve_user)]  # fmt: skip
    if paths:
        server.shell(
            name=f"Make the serve user's directories {', '.join(paths)}",
            commands=[command(s.serve_root, "trees.py", s.serve_user, "755", *paths)],
        )


def fetch(plan: HostPlan) -> None:
    s = plan.settings
    serve_user(plan)
    serve_trees(plan)
    token = []
    secret = hf_token(plan)
    if secret:
        ensure.secret(plan, "Write the Hugging Face token (0600)", HF_TOKEN_FILE, secret)
        token = ["--token-file", HF_TOKEN_FILE]
    for line in plan.model_drift:
        logger.warning(f"{host.print_prefix}{line}")
    for model in host.loop(plan.missing_models):
        again = any(line.startswith(f"model {model}: ") for line in plan.model_drift)
        copy = plan.from_wheelhouse("models", model)
        if copy:
            source = ["--archive", copy.dest]
        elif s.models_store_url:
            source = ["--store", s.models_store_url]
        else:  # the release's huggingface_hub, at models_hub_url or its own default hub
            endpoint = ["--endpoint", s.models_hub_url] if s.models_hub_url else []
            source = ["--hub", f"{plan.release.path}/bin/python", *endpoint]
        pins = []
        if model in s.models_revisions:
            pins += ["--revision", s.models_revisions[model]]
        sha256 = s.models_sha256.get(model) or (copy.sha256 if copy else None)
        if sha256:
            pins += ["--sha256", sha256]
        # options first, then ``--``: no positional is ever read as an option (#18 finding 13)
        cmd = command(s.serve_root, "fetch_model.py", *source, *token, "--token-env",
                      s.creds_hf_token_env, *pins, "--lock-timeout", str(s.models_lock_timeout),
                      "--", model, s.models_hf_home, s.serve_user)  # fmt: skip
        # no pyinfra _retries: the fetcher tries a transient failure again itself (retry.py) and
        # never a refusal, which shows its line once; exit 3 "could not reach", 1 "refused"
        what = f"{'Unpack' if copy else 'Fetch'} {model}{' again (drifted)' if again else ''}"
        server.shell(name=f"{what} into {s.models_hf_home}/hub", commands=[cmd])
