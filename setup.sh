#!/bin/bash
# setup.sh: make a fresh Debian machine ready for servefleet.
#  - as root: the Debian packages the lab fleet needs (only those missing)
#  - always: .venv/ in the repo root with servefleet (editable), pyinfra and the dev tools
set -euo pipefail
cd "$(dirname "$0")"
# cmake, g++, python3-dev: the controller builds sdist-only packages (arctic-inference) once for
# the hosts, which never compile; nginx-light: the unit tests run the router's proxy on loopback
PKGS="mmdebstrap zstd apt-utils dpkg-dev gnupg gpgv openssh-client iproute2 nftables util-linux systemd python3-venv cmake g++ python3-dev nginx-light"
if [ "$(id -u)" = 0 ]; then
  missing=""
  for p in $PKGS; do
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing="$missing $p"
  done
  if [ -n "$missing" ]; then
    echo "setup.sh: installing$missing" >&2
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing >/dev/null
  fi
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
# promtool and prometheus (the monitoring kit's tests): Debian's prometheus package unpacked into
# .venv/prometheus, never installed, so no service starts, no user is made and nothing outside
# the repo changes (tests/prom_tools.py finds them there)
PROM=.venv/prometheus
if [ ! -x "$PROM/usr/bin/promtool" ] || [ ! -x "$PROM/usr/bin/prometheus" ]; then
  deb=$(mktemp -d)
  get() { (cd "$deb" && apt-get download -qq -o APT::Sandbox::User="$(id -un)" prometheus); }
  get 2>/dev/null || { [ "$(id -u)" = 0 ] && apt-get update -q >/dev/null && get; } || {
    echo "setup.sh: cannot download Debian's prometheus package (apt-get download prometheus)" >&2
    exit 1
  }
  rm -rf "$PROM.new" && dpkg-deb -x "$deb"/prometheus_*.deb "$PROM.new"
  rm -rf "$PROM" "$deb" && mv "$PROM.new" "$PROM"
fi
# the versions in dev-constraints.txt, the same on every fresh machine (bench/newest_versions.sh
# tries the newest ones pyproject.toml allows and rewrites that file on purpose)
.venv/bin/pip install -q --disable-pip-version-check -c dev-constraints.txt -e '.[dev]'
# an editable install's modules are not compiled by pip (a wheel's are): compiled here, or every
# process recompiles the ones it imports where no bytecode is written (PYTHONDONTWRITEBYTECODE)
.venv/bin/python -m compileall -q -x '/lab/simulator/' src >/dev/null
# the real-wheel tier (tests/realvllm: the real vLLM and vllm-rbln wheels without a GPU, about
# 2 minutes and 2 GB, once) is the tests' alone: pytest builds it when a run needs it
# (tests/conftest.py), so the main job does not wait for it
echo "setup.sh: ready (.venv/bin/servefleet, .venv/bin/pyinfra)" >&2
