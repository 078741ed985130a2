#!/usr/bin/env bash
# Boots the rxe-vm harness's VM (../shared/rxe-vm: its kernel, initramfs, /init and command
# channel, all unchanged) with a SECOND virtio NIC, so that two rxe devices of one guest talk
# over a wire instead of looping back inside one device:
#
#   netns $NS: br0 192.168.77.1/24 = { tap0, tap1 }      (a bridge: the "wire")
#   guest: eth0 192.168.77.2/24 -> rxe0  (as the harness sets it up)
#          eth1 192.168.78.3/24 -> rxe1  (set up here, after boot, through cmd.sh)
#
# Linux would deliver a packet from 192.168.77.2 to its own 192.168.78.3 locally (and rxe
# never sees it cross a link), so the guest's policy routing is, in order:
#   5, 6:   a packet that ARRIVED on eth0 or eth1 looks at the local table first (so what
#           came over the wire is delivered, never forwarded);
#   10, 11: 77.2 -> 78.3 leaves through eth0 (table 100), 78.3 -> 77.2 through eth1 (101);
#   100:    the local table (moved from 0, where it would answer first).
# Rules 10 and 11 also answer rdma_cm's own check that a REQ arrived on the netdev that
# routes back to its sender (cma.c's validate_net_dev: a lookup without an input device),
# which an "iif lo" rule would not. Each packet goes guest eth0 -> tap0 -> br0 -> tap1 ->
# guest eth1 (or back), and the host sees it on tap0 and tap1. accept_local lets eth1 take
# a packet whose source is a local address; arp_ignore=1 keeps each NIC answering ARP for
# its own address only. Everything else (eth0 <-> the host, rdma_cm on one address) stays
# as the harness has it. Checked by hand: ibv_rc_pingpong rxe0 -> rxe1 and rping -c -I
# 192.168.77.2 -> rping -s -a 192.168.78.3 complete, and tap1's packet counters grow by the
# traffic (about 500 packets for 100 ping-pong iterations).
#
# This is a copy of what the harness's run.sh does for one NIC (netns, tap, qemu -daemonize,
# wait for RXE-READY), plus the bridge and eth1; the harness's stop.sh stops it (it kills the
# qemu by its saved pid and deletes the namespace, which takes br0 and both taps with it).
# Usage: [RXE_VM=dir] [WORK=dir] [ACCEL=tcg|kvm] [BOOT_TIMEOUT=180] .ci/rxe-vm-two-links.sh
# Exit 0 when the guest has rxe0 and rxe1 ACTIVE and the routing in place; 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
RXE_VM=${RXE_VM:-$ROOT/../shared/rxe-vm}
WORK=${WORK:-/var/tmp/rxe-vm-work}
NS=${NS:-rxetest}
ACCEL=${ACCEL:-tcg}
BOOT_TIMEOUT=${BOOT_TIMEOUT:-180}
HOST_CIDR=192.168.77.1/24
GUEST0_CIDR=192.168.77.2/24
GUEST1_IP=192.168.78.3
export WORK NS
LOG=$WORK/console.log
PIDF=$WORK/qemu.pid
SOCK=$WORK/cmd.sock

say() { printf '[two-links %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
fail() { echo "rxe-vm-two-links: FAILED: $*" >&2; exit 1; }

[ -f "$WORK/vmlinuz" ] && [ -f "$WORK/initramfs.cpio.gz" ] || fail "no VM in $WORK: run $RXE_VM/build.sh"
if [ -f "$PIDF" ] && kill -0 "$(cat "$PIDF")" 2>/dev/null; then
    fail "a VM is running already (pid $(cat "$PIDF")); run $RXE_VM/stop.sh first"
fi

# ---- the namespace: two taps on one bridge, the host's address on the bridge
ip netns list | grep -qw "$NS" || ip netns add "$NS"
ip -n "$NS" link set lo up
ip -n "$NS" link show br0 >/dev/null 2>&1 || ip -n "$NS" link add br0 type bridge
for t in tap0 tap1; do
    ip -n "$NS" link show "$t" >/dev/null 2>&1 || ip -n "$NS" tuntap add dev "$t" mode tap
    ip -n "$NS" link set "$t" master br0
    ip -n "$NS" link set "$t" up
done
ip -n "$NS" addr replace "$HOST_CIDR" dev br0
ip -n "$NS" link set br0 up

rm -f "$LOG" "$PIDF" "$SOCK"
cpu=max
[ "$ACCEL" = kvm ] && cpu=host
ip netns exec "$NS" qemu-system-x86_64 \
    -name rxe-vm -accel "$ACCEL" -cpu "$cpu" -smp 2 -m 1024 \
    -kernel "$WORK/vmlinuz" -initrd "$WORK/initramfs.cpio.gz" \
    -append "console=ttyS0 panic=-1 rxeip=$GUEST0_CIDR" \
    -display none -monitor none -no-reboot \
    -serial "file:$LOG" \
    -device virtio-serial-pci,id=vser0 \
    -chardev "socket,id=cmdch,path=$SOCK,server=on,wait=off" \
    -device virtserialport,bus=vser0.0,chardev=cmdch,name=rxecmd \
    -netdev "tap,id=n0,ifname=tap0,script=no,downscript=no" \
    -device "virtio-net-pci,netdev=n0,mac=52:54:00:77:00:02" \
    -netdev "tap,id=n1,ifname=tap1,script=no,downscript=no" \
    -device "virtio-net-pci,netdev=n1,mac=52:54:00:77:00:03" \
    -pidfile "$PIDF" -daemonize
say "qemu pid $(cat "$PIDF") (accel $ACCEL), waiting for RXE-READY"
t0=$(date +%s)
until grep -q RXE-READY "$LOG" 2>/dev/null; do
    kill -0 "$(cat "$PIDF")" 2>/dev/null || { tail -30 "$LOG" >&2; fail "qemu died while booting"; }
    [ $(( $(date +%s) - t0 )) -lt "$BOOT_TIMEOUT" ] || { tail -30 "$LOG" >&2; fail "no RXE-READY in ${BOOT_TIMEOUT}s"; }
    sleep 1
done
say "RXE-READY after $(( $(date +%s) - t0 ))s"

# ---- the guest's second link and its rxe device, and the routing over the wire
guest() { TIMEOUT=${T:-60} "$RXE_VM/cmd.sh" "$@"; }
setup="set -e
ip link set eth1 up
ip addr add $GUEST1_IP/24 dev eth1
for i in all default eth0 eth1; do
  echo 1 > /proc/sys/net/ipv4/conf/\$i/accept_local
  echo 0 > /proc/sys/net/ipv4/conf/\$i/rp_filter
  echo 1 > /proc/sys/net/ipv4/conf/\$i/arp_ignore
done
ip route add 192.168.78.0/24 dev eth0 table 100
ip route add 192.168.77.0/24 dev eth1 table 101
ip rule add pref 5 iif eth0 lookup local
ip rule add pref 6 iif eth1 lookup local
ip rule add pref 10 from ${GUEST0_CIDR%/*} to $GUEST1_IP lookup 100
ip rule add pref 11 from $GUEST1_IP to ${GUEST0_CIDR%/*} lookup 101
ip rule add pref 100 lookup local
ip rule del pref 0
rdma link add rxe1 type rxe netdev eth1
i=0
while [ \$i -lt 100 ]; do
  s0=\$(cat /sys/class/infiniband/rxe0/ports/1/state)
  s1=\$(cat /sys/class/infiniband/rxe1/ports/1/state 2>/dev/null || true)
  case \"\$s0 \$s1\" in *ACTIVE*ACTIVE*) break ;; esac
  sleep 0.1; i=\$((i+1))
done
ip rule show
rdma link show
cat /sys/class/infiniband/rxe1/ports/1/state"
# cmd.sh sends one line (newlines become spaces): ship the script base64-encoded.
out=$(guest "echo $(printf '%s\n' "$setup" | base64 -w0) | base64 -d | sh" 2>&1) || { echo "$out" >&2; fail "setting up eth1/rxe1 in the guest"; }
echo "$out" | grep -q 'rxe1.*state ACTIVE' || { echo "$out" >&2; fail "rxe1 is not ACTIVE"; }
say "guest: rxe0 on eth0 (${GUEST0_CIDR%/*}), rxe1 on eth1 ($GUEST1_IP), routed over the bridge"
