#!/usr/bin/env bash
# Runs a command inside a fresh network namespace whose lo has UDP segmentation offload
# turned off (`ethtool -K lo tx-udp-segmentation off`), then deletes the namespace.
#
# Why: ibal's RoCEv2 port sends bursts as GSO super-datagrams (UDP_SEGMENT). On an
# ordinary lo the kernel passes a super-datagram through whole, so a capture on lo shows
# one big datagram with only its first packet's headers; with the offload off the kernel
# cuts it into its packets before the capture tap, and tshark sees every packet as a wire
# would carry it, with the IPv4 identification it carries (FINDINGS.md). The command sees
# only lo (127.0.0.0/8) in there.
#
# usage: .ci/gso-netns.sh COMMAND [ARG...]     (root; exit status: the command's; 2: cannot)
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "gso-netns: needs root" >&2; exit 2; }
command -v ethtool >/dev/null || {
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q ethtool >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q ethtool >/dev/null 2>&1; } \
        || { echo "gso-netns: cannot install ethtool" >&2; exit 2; }
}
NS=ibal-gso-lo-$$
trap 'ip netns del "$NS" 2>/dev/null || true' EXIT
ip netns add "$NS"
ip -n "$NS" link set lo up
ip netns exec "$NS" ethtool -K lo tx-udp-segmentation off
ip netns exec "$NS" ethtool -k lo | grep -q '^tx-udp-segmentation: off' \
    || { echo "gso-netns: lo in $NS keeps tx-udp-segmentation on" >&2; exit 2; }
rc=0
ip netns exec "$NS" "$@" || rc=$?
exit $rc
