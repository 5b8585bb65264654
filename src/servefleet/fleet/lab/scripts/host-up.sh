#!/bin/bash
# host-up.sh NAME IP BASE HOSTDIR NETNS VETH CGROUP BRIDGE PREFIX [INIT_ARGS]
# (driven by servefleet.fleet.lab.hosts; INIT_ARGS: extra words for systemd as PID 1)
# Boot one lab host: its own network namespace (veth on BRIDGE, no default route, no DNS), its
# own overlayfs root over BASE (upper/work/merged under HOSTDIR), the files of HOSTDIR/extra laid
# over it (host keys, authorized_keys, the simulation's files), and systemd as PID 1 in new
# pid/mount/uts/ipc/cgroup/time namespaces. The launcher's pid goes to HOSTDIR/pid, the cgroups
# made for the host to HOSTDIR/cgroups, the console to HOSTDIR/console.log.
set -euo pipefail
NAME=$1 IP=$2 BASE=$3 H=$4 NS=$5 VETH=$6 CG=$7 BR=$8 PREFIX=$9 INIT_ARGS=${10:-}
M=$H/merged

# --- network: netns + veth on the bridge; hosts reach only the bridge subnet
ip netns add "$NS"
ip link add "$VETH" type veth peer name eth0 netns "$NS"
ip link set "$VETH" master "$BR" up
ip -n "$NS" addr add "$IP/$PREFIX" dev eth0
ip -n "$NS" link set eth0 up
ip -n "$NS" link set lo up

# --- root filesystem: overlay over the shared read-only base, then this host's own files
mkdir -p "$H/upper" "$H/work" "$M"
mount -t overlay "sf-ovl-$NAME" -o "lowerdir=$BASE,upperdir=$H/upper,workdir=$H/work" "$M"
echo "$NAME" > "$M/etc/hostname"
printf '127.0.0.1 localhost\n%s %s\n' "$IP" "$NAME" > "$M/etc/hosts"
: > "$M/etc/machine-id"            # empty: systemd generates one at boot
tar -C "$H/extra" -cf - . | tar -C "$M" --no-overwrite-dir --numeric-owner -xpf -

# --- cgroups: a sub-cgroup in the name=systemd (v1) and unified (v2) hierarchies, under this
# process's current cgroup; resource controllers are left alone.
CGS=""
for spec in "name=systemd:/sys/fs/cgroup/systemd" ":/sys/fs/cgroup/unified"; do
  key=${spec%%:*} mnt=${spec#*:}
  mountpoint -q "$mnt" || continue
  cur=$(awk -F: -v k="$key" '$2==k {print $3}' /proc/self/cgroup)
  mkdir -p "$mnt${cur%/}/$CG"; CGS="$CGS $mnt${cur%/}/$CG"
done
echo "$CGS" > "$H/cgroups"

# --- boot: PID 1 = systemd. The inner script runs inside the new namespaces.
# (nsenter, not "ip netns exec": the latter remounts /sys and hides the cgroup mounts)
: > "$H/console.log"
setsid /bin/bash -c '
  M=$1 NAME=$2 CGS=$3 NS=$4 H=$5 INIT_ARGS=$6
  for c in $CGS; do echo $$ > $c/cgroup.procs; done
  # loop: "reboot" inside makes the kernel kill the PID-ns init with SIGHUP (rc 129)
  # time namespace: /proc/uptime restarts at 0 on every boot (pyinfra server.reboot checks it)
  while :; do
  up=$(cut -d. -f1 /proc/uptime)
  nsenter --net=/run/netns/$NS unshare --pid --fork --mount --uts --ipc --cgroup --time --boottime -$up --monotonic -$up --propagation private /bin/bash -c "
    set -e
    hostname $NAME
    mount -t proc proc $M/proc
    mount --bind $M/proc/sys $M/proc/sys && mount -o remount,bind,ro $M/proc/sys
    mount -t sysfs -o ro,nosuid,nodev,noexec sysfs $M/sys
    mount -t tmpfs -o mode=755,nosuid,size=64m,nr_inodes=64k tmpfs $M/dev
    # own device nodes: never bind-mount the machine s nodes, the guest chmods/chowns them
    mknod -m 666 $M/dev/null c 1 3; mknod -m 666 $M/dev/zero c 1 5; mknod -m 666 $M/dev/full c 1 7
    mknod -m 666 $M/dev/random c 1 8; mknod -m 666 $M/dev/urandom c 1 9; mknod -m 666 $M/dev/tty c 5 0
    touch $M/dev/console; mount --bind $H/console.log $M/dev/console
    mkdir -p $M/dev/pts $M/dev/shm
    mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts $M/dev/pts
    ln -s pts/ptmx $M/dev/ptmx
    ln -s /proc/self/fd $M/dev/fd
    mount -t tmpfs -o mode=1777 tmpfs $M/dev/shm
    mount -t tmpfs -o mode=755,size=128m tmpfs $M/run
    mount -t tmpfs -o mode=755 tmpfs $M/sys/fs/cgroup
    for c in $CGS; do
      d=\$(echo \$c | cut -d/ -f5); mkdir -p $M/sys/fs/cgroup/\$d
      mount --bind \$c $M/sys/fs/cgroup/\$d
    done
    mount -o remount,ro,bind $M/sys/fs/cgroup
    cd $M && mkdir -p .oldroot && pivot_root . .oldroot && umount -l /.oldroot && rmdir /.oldroot
    exec env -i container=other TERM=dumb /lib/systemd/systemd --log-target=console $INIT_ARGS
  "
  rc=$?; echo "[launcher] init exited rc=$rc"; [ $rc = 129 ] || exit $rc
  done
' _ "$M" "$NAME" "$CGS" "$NS" "$H" "$INIT_ARGS" >> "$H/console.log" 2>&1 < /dev/null &
echo $! > "$H/pid"
