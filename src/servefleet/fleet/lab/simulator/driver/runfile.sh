#!/bin/sh
# rebellions-x86_64-@VERSION@.run: a SIMULATION for the servefleet lab, not the Rebellions
# driver installer. It checks the driver's prerequisites (dkms and linux-headers-$(uname -r)
# installed, as dpkg-query reports them), installs the simulated /usr/bin/rbln-smi, records
# the driver version in /etc/rbln-sim/driver.json and prepares /run/rbln-sim (plus a
# tmpfiles.d entry recreating it at boot) and /var/log/rbln-sim for the simulated vllm.
# Usage: sh rebellions-x86_64-@VERSION@.run --silent      (run as root)
# RBLN_SIM_ROOT, when set (tests only), prefixes every path it writes.
set -eu

VERSION="@VERSION@"
ME="rebellions-x86_64-$VERSION.run"
R="${RBLN_SIM_ROOT:-}"

usage() {
    echo "usage: sh $ME --silent" >&2
    echo "  --silent  install without prompting (the only mode this installer supports)" >&2
    exit 2
}

SILENT=0
for arg in "$@"; do
    case "$arg" in
        --silent) SILENT=1 ;;
        *) echo "$ME: unknown option: $arg" >&2; usage ;;
    esac
done
[ "$SILENT" = 1 ] || { echo "$ME: interactive installation is not supported" >&2; usage; }

if [ -z "$R" ] && [ "$(id -u)" != 0 ]; then
    echo "$ME: the RBLN driver must be installed as root" >&2
    exit 1
fi

installed() {
    [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" = "install ok installed" ]
}
KERNEL="$(uname -r)"
for pkg in dkms "linux-headers-$KERNEL"; do
    if ! installed "$pkg"; then
        echo "$ME: ERROR: package $pkg is not installed; the RBLN driver builds its kernel" \
             "module with DKMS and needs dkms and linux-headers-$KERNEL" >&2
        exit 1
    fi
done

STATE="$R/etc/rbln-sim/driver.json"
if [ -f "$STATE" ]; then
    OLD="$(sed -n 's/.*"version": *"\([^"]*\)".*/\1/p' "$STATE")"
    if [ "$OLD" = "$VERSION" ] && [ -x "$R/usr/bin/rbln-smi" ]; then
        echo "RBLN driver $VERSION is already installed; nothing to do"
        exit 0
    fi
    echo "Replacing RBLN driver ${OLD:-unknown} with $VERSION"
else
    echo "Installing RBLN driver $VERSION"
fi

mkdir -p "$R/usr/bin" "$R/usr/lib/rbln-sim" "$R/etc/rbln-sim" "$R/etc/tmpfiles.d" \
    "$R/run/rbln-sim" "$R/var/log/rbln-sim"
TMP="$R/usr/lib/rbln-sim/.rbln_smi.py.$$"
cat > "$TMP" <<'RBLN_SMI_PAYLOAD_END'
@RBLN_SMI@
RBLN_SMI_PAYLOAD_END
chmod 755 "$TMP"
mv -f "$TMP" "$R/usr/lib/rbln-sim/rbln_smi.py"
# The real rbln-smi is a native binary that answers in a few ms. The simulation renders with
# Python once per content of hardware.json (and of this driver) and answers from /run after that.
TMP="$R/usr/bin/.rbln-smi.$$"
cat > "$TMP" <<'RBLN_SMI_WRAPPER_END'
#!/bin/sh
# rbln-smi: a SIMULATION for the servefleet lab (the renderer: /usr/lib/rbln-sim/rbln_smi.py)
root=${RBLN_SIM_ROOT:-}
py=$root/usr/lib/rbln-sim/rbln_smi.py
dir=$root/run/rbln-sim
case "$*" in
    "") out=table ;; -j|--json) out=json ;; *) exec python3 "$py" "$@" ;;
esac
[ -d "$dir" ] && [ -w "$dir" ] || exec python3 "$py" "$@"
key=$(cat "$root/etc/rbln-sim/hardware.json" "$py" 2>/dev/null | cksum | tr ' ' '-')
cache="$dir/rbln-smi.$out.$key"
[ -s "$cache" ] && exec cat "$cache"
python3 "$py" "$@" > "$cache.$$" || { rc=$?; cat "$cache.$$"; rm -f "$cache.$$"; exit $rc; }
mv -f "$cache.$$" "$cache" 2>/dev/null || { cat "$cache.$$"; rm -f "$cache.$$"; exit 0; }
exec cat "$cache"
RBLN_SMI_WRAPPER_END
chmod 755 "$TMP"
mv -f "$TMP" "$R/usr/bin/rbln-smi"

chmod 1777 "$R/run/rbln-sim" "$R/var/log/rbln-sim"
[ -e "$R/var/log/rbln-sim/compile.log" ] || : > "$R/var/log/rbln-sim/compile.log"
chmod 666 "$R/var/log/rbln-sim/compile.log"
cat > "$R/etc/tmpfiles.d/rbln-sim.conf" <<'TMPFILES_END'
# servefleet lab simulation: runtime dir of the simulated RBLN stack (device locks, records)
d /run/rbln-sim 1777 root root -
d /var/log/rbln-sim 1777 root root -
TMPFILES_END

printf '{"version": "%s", "runfile": "%s", "simulated": true}\n' "$VERSION" "$ME" > "$STATE.tmp"
mv -f "$STATE.tmp" "$STATE"
echo "RBLN driver $VERSION installed (simulated): $R/usr/bin/rbln-smi"
