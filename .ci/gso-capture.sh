#!/usr/bin/env bash
# GSO segments on the wire (issue 31, deliver 1's checks): two ibal processes move RDMA
# WRITEs, READs and long SENDs over RoCEv2 while tshark captures every packet as the wire
# carries it; tshark must decode every one, and scapy (.ci/icrc-oracle.py, no code shared
# with ibal) must compute the same ICRC as each packet carries.
#
# Where: a fresh network namespace whose lo has UDP segmentation offload turned off
# (`ethtool -K lo tx-udp-segmentation off`). On an ordinary lo the kernel passes a GSO
# super-datagram through whole and a capture sees one big datagram (only the first packet's
# headers); with the offload off the kernel cuts it in software before the capture tap, and
# every segment shows with the IPv4 identification it carries on a wire (0, 1, 2, ... from
# an unconnected DF socket: checked first with a probe super-datagram, FINDINGS.md).
#
# Runs (both processes in the namespace, 127.0.0.1 and 127.0.0.2, UDP 4791 and 4792):
#   1. qp-exchange --rdma-bulk 2M at MTU 1024: one RDMA WRITE and one RDMA READ of 2 MiB
#   2. qp-exchange --rdma-bulk 16M at MTU 4096
#   3. pingpong (through the CM) of 1 MiB SENDs each way, 4 round trips, MTU 4096; its
#      --json port counters say whether the sides used GSO (tx_gso_sends, tx_gso_refused)
#   4. qp-exchange --mode ud, 200 round trips of 1024 bytes (DETH packets)
# Each process is bounded by timeout; the namespace is deleted on exit.
#
# GSO_REQUIRED=1: fail unless the capture holds GSO segments (identifications != 0 from
# ibal) and the pingpong's counters show GSO sends; .ci/run sets it once the provider
# sends GSO. Without it the same checks run and their figures are printed.
# Exit 0: all passed. 1: a check failed. 2: cannot run here (not root).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${OUT:-$ROOT/target/gso-capture}
BIN=${BIN:-$ROOT/target/release/ibal}
GSO_REQUIRED=${GSO_REQUIRED:-0}
NS=ibal-gso-$$
A=127.0.0.1
B=127.0.0.2
PA=4791
PB=4792

say() { printf '[gso-capture %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
[ "$(id -u)" = 0 ] || { echo "gso-capture: needs root (network namespace, ethtool, capture)" >&2; exit 2; }
[ -x "$BIN" ] || { echo "gso-capture: no ibal binary at $BIN (cargo build --release -p ibal-cli)" >&2; exit 1; }

apt_install() { # package...: installs what is missing (apt-get update only if needed)
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends "$@" >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends "$@" >/dev/null 2>&1; }
}
command -v tshark >/dev/null || apt_install tshark || { echo "gso-capture: cannot install tshark" >&2; exit 1; }
command -v ethtool >/dev/null || apt_install ethtool || { echo "gso-capture: cannot install ethtool" >&2; exit 1; }
# The oracle needs scapy with contrib.roce (Debian 12's python3-scapy 2.5.0 has it); the
# python3 first on PATH may be another interpreter without it.
PY=""
for p in /usr/bin/python3 python3; do
    if "$p" -c 'import scapy.contrib.roce' 2>/dev/null; then PY=$p; break; fi
done
if [ -z "$PY" ]; then
    apt_install python3-scapy || true
    /usr/bin/python3 -c 'import scapy.contrib.roce' 2>/dev/null && PY=/usr/bin/python3
fi
[ -n "$PY" ] || { echo "gso-capture: no python3 with scapy.contrib.roce (apt-get install python3-scapy)" >&2; exit 1; }

mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/*.err "$OUT"/*.pcap "$OUT"/*.csv "$OUT"/*.log

PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    ip netns del "$NS" 2>/dev/null || true
}
trap cleanup EXIT
ip netns add "$NS"
ip -n "$NS" link set lo up
ip netns exec "$NS" ethtool -K lo tx-udp-segmentation off
ip netns exec "$NS" ethtool -k lo | grep -q '^tx-udp-segmentation: off' \
    || { echo "gso-capture: lo in $NS still has tx-udp-segmentation on" >&2; exit 1; }
in_ns() { ip netns exec "$NS" "$@"; }

# capture FILE FILTER: starts tshark in the namespace (bounded), waits until it writes.
capture() {
    in_ns timeout 300 tshark -q -i lo -B 64 -f "$2" -a duration:290 -w "$1" >"$1.log" 2>&1 &
    TSHARK=$!; PIDS+=("$TSHARK")
    for _ in $(seq 50); do [ -s "$1" ] && break; sleep 0.1; done
    [ -s "$1" ] || { echo "gso-capture: tshark did not start: $(cat "$1.log")" >&2; exit 1; }
    sleep 0.3
}
stop_capture() {
    sleep 0.3
    kill -TERM "$TSHARK" 2>/dev/null || true  # (SIGINT: ignored by a background job)
    wait "$TSHARK" 2>/dev/null || true
}

# ---- 0. the premise: the kernel cuts a super-datagram here, identifications 0..n-1 with DF
say "probe: one GSO super-datagram of 5 segments (1000 bytes each, the last 500) from an unconnected DF socket"
capture "$OUT/probe.pcap" "udp dst port 9"
in_ns "$PY" .ci/gso-probe.py $A $A 9 1000 5
stop_capture
probe=$(tshark -r "$OUT/probe.pcap" -T fields -E separator=, -e ip.id -e ip.flags.df -e udp.length 2>/dev/null | tr '\n' ' ')
if [ "$probe" != "0x0000,1,1008 0x0001,1,1008 0x0002,1,1008 0x0003,1,1008 0x0004,1,508 " ]; then
    echo "gso-capture: the probe's segments are not 5 datagrams with identifications 0..4 and DF:" \
         "[$probe] (the kernel does not segment before the capture, or numbers differently)" >&2
    exit 1
fi
say "probe: 5 segments, identifications 0..4, DF on each, as ibal's ICRCs assume"

# ---- the ibal runs, all captured in one file
CAP=$OUT/gso.pcap
capture "$CAP" "udp port $PA or udp port $PB"
FAILED=0
fail() { FAILED=1; echo "FAIL [$1]: $2" >&2; for f in "$OUT/$1".*.err; do echo "---- $f:" >&2; tail -5 "$f" >&2; done; }

# qpx NAME ARGS...: a qp-exchange pair (listener on A, client from B); both must exit 0.
qpx() {
    local name=$1; shift
    in_ns timeout 120 "$BIN" qp-exchange --listen $A:18515 --local $A --udp-port $PA \
        --peer-udp-port $PB --timeout 30 --json "$@" >"$OUT/$name.server.json" 2>"$OUT/$name.server.err" &
    local srv=$!; PIDS+=("$srv")
    for _ in $(seq 100); do grep -q "listening on" "$OUT/$name.server.err" 2>/dev/null && break; sleep 0.1; done
    local rc=0
    in_ns timeout 120 "$BIN" qp-exchange --connect $A:18515 --local $B --udp-port $PB \
        --peer-udp-port $PA --timeout 30 --json "$@" >"$OUT/$name.client.json" 2>"$OUT/$name.client.err" || rc=$?
    wait "$srv" || rc=$((rc ? rc : $?))
    return $rc
}

T=bulk-2M-mtu1024
say "$T: qp-exchange --rdma-bulk 2M --mtu 1024 (2048 packets each way)"
if qpx $T --rdma-bulk 2M --mtu 1024 && grep -q '"verdict":"ibal-qpx/1 bulk-verdict ok' "$OUT/$T.client.json"; then
    say "$T: PASS ($(grep -o '"write_seconds":[0-9.]*,"read_seconds":[0-9.]*' "$OUT/$T.client.json"))"
else
    fail $T "the exchange failed"
fi
T=bulk-16M-mtu4096
say "$T: qp-exchange --rdma-bulk 16M --mtu 4096 (4096 packets each way)"
if qpx $T --rdma-bulk 16M --mtu 4096 && grep -q '"verdict":"ibal-qpx/1 bulk-verdict ok' "$OUT/$T.client.json"; then
    say "$T: PASS ($(grep -o '"write_seconds":[0-9.]*,"read_seconds":[0-9.]*' "$OUT/$T.client.json"))"
else
    fail $T "the exchange failed"
fi

T=send-1M-mtu4096
say "$T: pingpong through the CM, 4 round trips of 1 MiB SENDs (256 packets each) at MTU 4096"
in_ns timeout 120 "$BIN" pingpong --listen $A:7471 --udp-port $PA --peer-udp-port $PB --mtu 4096 \
    --timeout 30 --json >"$OUT/$T.server.json" 2>"$OUT/$T.server.err" &
srv=$!; PIDS+=("$srv")
# The listen must exist before the REQ (else REJ): wait for its UDP port, then a little.
for _ in $(seq 100); do in_ns grep -qi ":$(printf %04X $PA) " /proc/net/udp && break; sleep 0.1; done
sleep 0.3
rc=0
in_ns timeout 120 "$BIN" pingpong --connect $A:7471 --local $B --udp-port $PB --peer-udp-port $PA \
    --mtu 4096 --size 1048576 --iterations 4 --timeout 30 --json \
    >"$OUT/$T.client.json" 2>"$OUT/$T.client.err" || rc=$?
wait "$srv" || rc=$((rc ? rc : $?))
if [ $rc = 0 ]; then
    say "$T: PASS"
else
    fail $T "the ping-pong failed (exit $rc)"
fi

T=ud-1024
say "$T: qp-exchange --mode ud, 200 round trips of 1024 bytes"
if qpx $T --mode ud --iters 200; then say "$T: PASS"; else fail $T "the exchange failed"; fi
stop_capture

# ---- GSO in use, by the senders' own counts (pingpong reports its port's counters)
"$PY" - "$OUT/send-1M-mtu4096.server.json" "$OUT/send-1M-mtu4096.client.json" "$GSO_REQUIRED" <<'PY' || FAILED=1
import json, sys
required = sys.argv[3] == "1"
bad = False
for side, path in (("listener", sys.argv[1]), ("connecting side", sys.argv[2])):
    try:
        c = json.load(open(path)).get("port_counters") or {}
    except Exception as e:
        print(f"gso-capture: no JSON report from the pingpong {side} ({path}): {e}")
        bad = True
        continue
    figs = {k: c.get(k) for k in ("tx_packets", "tx_gso_sends", "tx_gso_segments", "tx_gso_refused")}
    print(f"gso-capture: pingpong {side}'s port counters: {figs}")
    if required and not (c.get("tx_gso_sends") or 0) > 0:
        print(f"GSO CHECK FAILED: the pingpong {side} sent no GSO super-datagram"
              f" (tx_gso_refused {c.get('tx_gso_refused')})")
        bad = True
sys.exit(1 if bad else 0)
PY

# ---- tshark: every datagram to the RoCEv2 ports decodes as InfiniBand, none is flagged,
# and none is larger than a packet (a super-datagram would mean the capture missed segments)
say "capture: $(du -h "$CAP" | cut -f1) in $CAP ($(grep -o '[0-9]* packets dropped' "$CAP.log" || echo "no drop reported") by tshark)"
# RoCEv2 on both ports; no guessing what a payload holds (Wireshark's heuristics take some
# SEND payloads for RPCoRDMA or an ethertype and flag them malformed).
DEC="-d udp.port==$PB,infiniband -o infiniband.identify_payload:FALSE"
for p in rpcordma smc smb_direct nvme-rdma lnet iser fcoib infiniband_sdp; do DEC="$DEC --disable-protocol $p"; done
# Not counted: the empty datagrams a port sends itself to wake its receive thread.
ports="(udp.dstport==$PA || udp.dstport==$PB) && !icmp && !(udp.length==8 && ip.src==ip.dst && udp.srcport==udp.dstport)"
n_udp=$(tshark -r "$CAP" $DEC -Y "$ports" 2>/dev/null | wc -l)
n_ib=$(tshark -r "$CAP" $DEC -Y "$ports && infiniband.bth.opcode" 2>/dev/null | wc -l)
n_flag=$(tshark -r "$CAP" $DEC -Y "$ports && (_ws.malformed || _ws.expert.severity >= 0x00600000)" 2>/dev/null | wc -l)
max_udp=$(tshark -r "$CAP" $DEC -Y "$ports" -T fields -e udp.length 2>/dev/null | sort -n | tail -1)
say "tshark: $n_udp datagrams to UDP $PA/$PB, $n_ib decoded as RoCEv2 (BTH), $n_flag malformed or" \
    "with an expert warning, the largest UDP length ${max_udp:-none}"
if [ "$n_udp" = 0 ] || [ "$n_ib" != "$n_udp" ] || [ "$n_flag" != 0 ]; then
    echo "TSHARK CHECK FAILED: every datagram must decode as RoCEv2 unflagged" >&2
    tshark -r "$CAP" $DEC -Y "$ports && (!infiniband.bth.opcode || _ws.malformed || _ws.expert)" 2>/dev/null | head -5 >&2
    FAILED=1
fi
# MTU 4096: UDP 8 + BTH 12 + RETH 16 + 4096 + ICRC 4 = 4136 at most.
if [ "${max_udp:-0}" -gt 4136 ]; then
    echo "TSHARK CHECK FAILED: a datagram of UDP length $max_udp is no RoCEv2 packet (an unsegmented super-datagram?)" >&2
    FAILED=1
fi

# ---- the ICRC oracle over every packet, tshark's ICRC field beside it
tshark -r "$CAP" $DEC -Y "$ports" -T fields -E separator=, -e frame.number \
    -e infiniband.invariant.crc >"$OUT/tshark-icrc.csv" 2>/dev/null
req=(); [ "$GSO_REQUIRED" = 1 ] && req=(--require-gso 1)
if ! "$PY" .ci/icrc-oracle.py "$CAP" --port $PB --gso-source $A --gso-source $B \
        --tshark-icrc "$OUT/tshark-icrc.csv" --min-packets "$n_udp" "${req[@]}"; then
    FAILED=1
fi

# ---- negative controls: the oracle must fail on a copy with one byte changed, once in a
# packet's payload and once in its IPv4 identification (an ICRC computed for the wrong
# segment index is exactly that mistake)
for what in payload ipid; do
    k=$("$PY" - "$CAP" "$OUT/gso-$what.pcap" "$what" <<'PY'
import struct, sys
src, dst, what = sys.argv[1], sys.argv[2], sys.argv[3]
b = bytearray(open(src, "rb").read())
# tshark -w writes pcapng unless told otherwise: read either format
assert b[:4] in (b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\xc3\xd4", b"\x0a\x0d\x0d\x0a"), "unknown capture format"
if b[:4] == b"\x0a\x0d\x0d\x0a":
    # pcapng: walk blocks, Enhanced Packet Blocks (type 6) hold the packets
    off, recs = 0, []
    while off + 12 <= len(b):
        btype, blen = struct.unpack_from("<II", b, off)
        if btype == 6:
            caplen = struct.unpack_from("<I", b, off + 20)[0]
            recs.append((off + 28, caplen))
        off += blen
else:
    off, recs = 24, []
    while off + 16 <= len(b):
        caplen = struct.unpack_from("<I", b, off + 8)[0]
        recs.append((off + 16, caplen))
        off += 16 + caplen
# RoCEv2 frames on lo (Ethernet header of 14 bytes, IPv4, UDP): take the middle one
roce = [(o, n) for o, n in recs if n > 14 + 20 + 8 + 16 and b[o + 12:o + 14] == b"\x08\x00" and b[o + 23] == 17]
# (for the identification: a GSO segment after the first of its super-datagram if any)
if what == "ipid" and any(b[o + 18:o + 20] != b"\0\0" for o, _ in roce):
    roce = [(o, n) for o, n in roce if b[o + 18:o + 20] != b"\0\0"]
o, n = roce[len(roce) // 2]
at = o + n - 5 if what == "payload" else o + 14 + 5  # the byte before the ICRC / the identification's low byte
b[at] ^= 0x01
open(dst, "wb").write(bytes(b))
k = recs.index((o, n)) + 1
print(k)
print(f"gso-capture: {dst}: flipped bit 0 of byte {at} ({what}) in RoCEv2 frame {k}", file=sys.stderr)
PY
    ) || { FAILED=1; continue; }
    # The 41 frames around it (all through scapy too; the whole file takes a minute).
    if "$PY" .ci/icrc-oracle.py "$OUT/gso-$what.pcap" --port $PB --frames $((k - 20))-$((k + 20)) \
            >"$OUT/gso-$what.log" 2>&1; then
        cat "$OUT/gso-$what.log"
        echo "NEGATIVE CONTROL FAILED: the oracle passed a capture with one $what byte changed" >&2
        FAILED=1
    elif grep -q "ICRC ORACLE FAILED: frame $k: .*ICRC carried" "$OUT/gso-$what.log"; then
        say "negative control ($what, frame $k): the oracle refused it: $(grep -m1 'ICRC ORACLE FAILED' "$OUT/gso-$what.log" | cut -c1-220)"
    else
        cat "$OUT/gso-$what.log"
        echo "NEGATIVE CONTROL FAILED: the oracle failed, but without naming the packet's ICRC" >&2
        FAILED=1
    fi
done

if [ "$FAILED" = 0 ]; then
    say "ALL PASSED (GSO_REQUIRED=$GSO_REQUIRED); outputs in $OUT"
else
    say "FAILED; outputs in $OUT"
fi
exit $FAILED
