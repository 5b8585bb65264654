#!/bin/bash
# newest_versions.sh: the suite on the newest versions pyproject.toml allows (uv, pyinfra, paramiko,
# vllm-router, the dev tools), to learn early when a new release breaks something. Not in CI: CI
# runs the versions dev-constraints.txt pins (setup.sh).
#
#   bench/newest_versions.sh [--write] [PYTEST ARGS...]
#
# A venv of its own ($SERVEFLEET_NEWEST_VENV, default under /tmp), its versions printed beside the
# pinned ones, then pytest from that venv (as root for the lab tests, like the README's command).
# --write: when the suite passes, rewrite dev-constraints.txt from that venv (review the diff).
# Indexes and mirrors come from the machine's pip configuration, never from here.
set -euo pipefail
cd "$(dirname "$0")/.."
write=0
if [ "${1:-}" = "--write" ]; then write=1; shift; fi
VENV=${SERVEFLEET_NEWEST_VENV:-/tmp/servefleet-newest}
rm -rf "$VENV" && python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check --upgrade pip
"$VENV/bin/pip" install -q --disable-pip-version-check --upgrade --upgrade-strategy eager -e '.[dev]'
"$VENV/bin/python" -m compileall -q -x '/lab/simulator/' src >/dev/null
# promtool and prometheus, as setup.sh unpacked them (tests/prom_tools.py looks beside sys.prefix)
[ -d .venv/prometheus ] && ln -sfn "$PWD/.venv/prometheus" "$VENV/prometheus"
"$VENV/bin/pip" freeze --all --exclude-editable 2>/dev/null | grep -v -E '^(pip|setuptools)==' >"$VENV/freeze.txt"
echo "newest_versions: versions that differ from dev-constraints.txt (pinned -> newest):" >&2
python3 - "$VENV/freeze.txt" <<'PY' >&2
import re, sys
def pins(path):
    out = {}
    for line in open(path):
        m = re.match(r"([A-Za-z0-9_.-]+)==(\S+)", line)
        if m:
            out[re.sub(r"[-_.]+", "-", m[1]).lower()] = m[2]
    return out
old, new = pins("dev-constraints.txt"), pins(sys.argv[1])
diff = [f"  {n}: {old.get(n, '-')} -> {new.get(n, '-')}" for n in sorted({*old, *new})
        if old.get(n) != new.get(n)]
print("\n".join(diff) or "  none")
PY
status=0
"$VENV/bin/pytest" "$@" || status=$?
echo "newest_versions: pytest exited $status" >&2
if [ "$status" = 0 ] && [ "$write" = 1 ]; then
  { sed -n '/^#/p' dev-constraints.txt; cat "$VENV/freeze.txt"; } >dev-constraints.txt.new
  mv dev-constraints.txt.new dev-constraints.txt
  echo "newest_versions: wrote dev-constraints.txt; review its diff and commit it" >&2
fi
exit "$status"
