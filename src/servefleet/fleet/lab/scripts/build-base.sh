#!/bin/bash
# build-base.sh OUT CACHE KEY MIRROR SUITE PKGS    (driven by servefleet.fleet.lab.base)
# The read-only root filesystem shared (as overlayfs lower dir) by every lab host: Debian minbase
# plus what a fresh Debian server has (systemd, sshd, python3, ...). Built with mmdebstrap from
# MIRROR (this machine's own apt mirror) once, and cached as CACHE/base-KEY.tar.zst, so a rebuild
# is an unpack. The image has no apt sources, no DNS, no host keys and no machine-id. Its nginx
# is as a deploy's install of the router's proxy leaves it: Debian's nginx.service disabled.
set -euo pipefail
OUT=$1 CACHE=$2 KEY=$3 MIRROR=$4 SUITE=$5 PKGS=$6
TAR=$CACHE/base-$KEY.tar.zst
mkdir -p "$CACHE"
if [ -e "$OUT/usr/lib/systemd/systemd" ] && [ "$(cat "$OUT/.servefleet-base-key" 2>/dev/null)" = "$KEY" ]; then
  echo "base up to date: $OUT"; exit 0
fi
rm -rf "$OUT" "$OUT.tmp"; mkdir -p "$OUT.tmp"
if [ -f "$TAR" ]; then
  zstd -dc "$TAR" | tar -C "$OUT.tmp" --numeric-owner -xpf -
else
  mmdebstrap --quiet --variant=minbase --mode=root --include="$PKGS" \
    --customize-hook='chroot "$1" systemctl mask -q apt-daily.timer apt-daily-upgrade.timer getty@tty1.service console-getty.service e2scrub_all.timer e2scrub_reap.service fstrim.timer dpkg-db-backup.timer systemd-pstore.service' \
    --customize-hook='chroot "$1" systemctl disable -q nginx.service' \
    --customize-hook='rm -f "$1"/etc/ssh/ssh_host_*; printf "HostKey /etc/ssh/ssh_host_ed25519_key\nHostKey /etc/ssh/ssh_host_ecdsa_key\nPermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\n" > "$1"/etc/ssh/sshd_config.d/servefleet-lab.conf' \
    --customize-hook='echo "# lab host: no DNS" > "$1"/etc/resolv.conf; : > "$1"/etc/machine-id' \
    --customize-hook='echo "# lab host: no apt sources (a deploy adds the lab repository)" > "$1"/etc/apt/sources.list; rm -f "$1"/etc/apt/sources.list.d/*' \
    "$SUITE" "$OUT.tmp" "$MIRROR"
  tar -C "$OUT.tmp" --numeric-owner -cf - . | zstd -q -T0 -3 -o "$TAR.part"
  mv "$TAR.part" "$TAR"
fi
echo "$KEY" > "$OUT.tmp/.servefleet-base-key"
mv "$OUT.tmp" "$OUT"
echo "base built: $OUT, cache $TAR"
