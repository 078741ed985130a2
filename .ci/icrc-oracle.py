#!/usr/bin/python3
"""An independent ICRC check of a RoCEv2 capture (issue 31, deliver 1).

Reads a pcap or pcapng file with scapy and, for every IPv4/UDP datagram to one of the
RoCEv2 ports (4791 and any --port), recomputes the ICRC with scapy's own RoCEv2 code
(scapy.contrib.roce: BTH.compute_icrc, the pseudo-LRH of ones and the IPv4 TOS, TTL,
header checksum, UDP checksum and BTH Resv8a masked) and compares it with the four bytes
the packet carries. Nothing here shares code with ibal: scapy is the oracle.

scapy takes a few milliseconds a packet, so every packet is also checked by a short CRC-32
written here from the RoCEv2 annex (the same masks), and scapy recomputes every
--scapy-every'th packet (1: all of them): both must agree with the packet, so the short
check is itself checked against scapy in every run.

Fails (exit 1, naming the frame) on any mismatch, on a datagram too short to hold a BTH and
an ICRC, and when no packet was checked. Prints how many packets carried each IPv4
identification class: a GSO super-datagram's segments carry 0, 1, 2, ... (FINDINGS.md), so
packets with an identification other than 0 from an unconnected DF socket are the proof
that the sender used GSO; --require-gso N fails unless at least N such packets were seen
from the --gso-source addresses (ibal's; rxe numbers its identifications its own way).

--tshark-icrc CSV (lines "frame,icrc" from `tshark -T fields -e frame.number -e
infiniband.invariant.crc`) also requires tshark to have read the same ICRC from every
checked frame, i.e. tshark and scapy agree on where each packet ends.

Needs python3-scapy (Debian 12: 2.5.0, which has scapy.contrib.roce).
"""
import argparse
import collections
import struct
import sys
import zlib

from scapy.all import IP, UDP, RawPcapReader, conf  # noqa: E402
from scapy.contrib.roce import BTH  # noqa: E402


def ip_of(data, link):
    """The IPv4 packet inside a captured frame, or None."""
    if link == 1:  # Ethernet (lo, tap, veth)
        return data[14:] if data[12:14] == b"\x08\x00" else None
    if link == 113:  # Linux cooked capture
        return data[16:] if data[14:16] == b"\x08\x00" else None
    if link in (101, 228):  # raw IP / raw IPv4
        return data if data[:1] and data[0] >> 4 == 4 else None
    return None


def short_icrc(raw_ip, ihl):
    """The ICRC by the RoCEv2 annex: CRC-32 over 8 bytes of ones (the LRH's place), the IPv4
    header with TOS, TTL and checksum as ones, the UDP header with its checksum as ones,
    the BTH with byte 4 (FECN, BECN, Resv6) as ones, and the rest but the ICRC; sent least
    significant byte first."""
    p = bytearray(b"\xff" * 8 + raw_ip[:-4])
    ip = 8
    p[ip + 1] = 0xFF                      # TOS (DSCP, ECN)
    p[ip + 8] = 0xFF                      # TTL
    p[ip + 10:ip + 12] = b"\xff\xff"      # header checksum
    udp = ip + ihl
    p[udp + 6:udp + 8] = b"\xff\xff"      # UDP checksum
    p[udp + 8 + 4] = 0xFF                 # BTH byte 4
    return struct.pack("<I", zlib.crc32(bytes(p)) & 0xFFFFFFFF)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pcap")
    ap.add_argument("--port", type=int, action="append", default=[],
                    help="another UDP destination port carrying RoCEv2 (4791 always does)")
    ap.add_argument("--gso-source", action="append", default=[],
                    help="source address whose identifications != 0 count as GSO segments")
    ap.add_argument("--require-gso", type=int, default=0, metavar="N",
                    help="fail unless at least N packets from --gso-source carry identification != 0")
    ap.add_argument("--tshark-icrc", metavar="CSV",
                    help="frame,icrc lines from tshark: each checked frame's ICRC must match")
    ap.add_argument("--min-packets", type=int, default=1,
                    help="fail when fewer packets were checked (default 1)")
    ap.add_argument("--frames", metavar="FIRST-LAST",
                    help="check only the frames numbered FIRST to LAST (from 1, as tshark counts)")
    ap.add_argument("--scapy-every", type=int, default=1, metavar="K",
                    help="scapy recomputes every K'th packet's ICRC (default 1: every one)")
    a = ap.parse_args()

    ports = {4791, *a.port}
    conf.verb = 0

    tshark = None
    if a.tshark_icrc:
        tshark = {}
        for line in open(a.tshark_icrc):
            f = line.strip().split(",")
            if len(f) >= 2 and f[0] and f[1]:
                tshark[int(f[0])] = int(f[1], 0)

    first, last = (int(x) for x in a.frames.split("-")) if a.frames else (1, float("inf"))
    checked = 0
    by_scapy = 0
    wakeups = 0
    bad = []
    bad_frames = set()

    def flag(frame, what):
        bad.append(what)
        bad_frames.add(frame)
    ids = collections.Counter()  # (source, "id 0" | "id != 0") -> packets
    opcodes = collections.Counter()
    gso_ids = 0
    reader = RawPcapReader(a.pcap)
    link = getattr(reader, "linktype", 1)
    for frame, (data, _meta) in enumerate(reader, start=1):
        if frame < first or frame > last:
            continue
        if isinstance(data, tuple):  # some scapy versions give (bytes, metadata) pairs
            data = data[0]
        raw_ip = ip_of(data, link)
        if raw_ip is None or len(raw_ip) < 28 or raw_ip[9] != 17:
            continue
        ihl = (raw_ip[0] & 0x0F) * 4
        total = struct.unpack_from("!H", raw_ip, 2)[0]
        # the IP header's own length, so a link-layer trailer is never taken for the packet
        raw_ip = raw_ip[:total]
        if len(raw_ip) < ihl + 8 or struct.unpack_from("!H", raw_ip, 2 + ihl)[0] not in ports:
            continue
        if struct.unpack_from("!H", raw_ip, 6)[0] & 0x1FFF or raw_ip[6] & 0x20:
            continue  # a fragment: not a RoCEv2 packet (ours carry DF)
        src = ".".join(map(str, raw_ip[12:16]))
        dst = ".".join(map(str, raw_ip[16:20]))
        ident = struct.unpack_from("!H", raw_ip, 4)[0]
        payload = raw_ip[ihl + 8:]
        if not payload and src == dst and raw_ip[ihl:ihl + 2] == raw_ip[ihl + 2:ihl + 4]:
            # An empty datagram a port sends itself (ibal wakes its blocked receive thread
            # so at close): no RoCEv2 packet, and never on a wire.
            wakeups += 1
            continue
        if len(payload) < 12 + 4:
            flag(frame, f"frame {frame}: {src} -> {dst}: {len(payload)} bytes of UDP payload, "
                       f"too short for a BTH and an ICRC")
            continue
        carried = payload[-4:]
        opcode, dqpn, psn = payload[0], int.from_bytes(payload[5:8], "big"), int.from_bytes(payload[9:12], "big")
        where = (f"frame {frame}: {src} -> {dst} IPv4 id {ident} BTH opcode {opcode} QP {dqpn:#x} "
                 f"PSN {psn:#x}")
        checked += 1
        opcodes[opcode] += 1
        ids[(src, "id 0" if ident == 0 else "id != 0")] += 1
        if ident != 0 and src in a.gso_source:
            gso_ids += 1
        short = short_icrc(raw_ip, ihl)
        if short != carried:
            flag(frame, f"{where}: ICRC carried {carried.hex()}, computed {short.hex()}")
        if (checked - 1) % a.scapy_every == 0:
            by_scapy += 1
            ip = IP(raw_ip)
            udp = ip[UDP]
            # The BTH starts the UDP payload whatever scapy would guess from the ports.
            udp.remove_payload()
            udp.add_payload(BTH(payload))
            bth = ip[BTH]
            if struct.pack("!I", bth.icrc) != carried:
                flag(frame, f"{where}: scapy reads the ICRC as {bth.icrc:#010x}, the packet ends "
                           f"with {carried.hex()}")
            expected = bth.compute_icrc(None)  # scapy's ICRC of the packet as captured
            if expected != carried:
                flag(frame, f"{where}: ICRC carried {carried.hex()}, scapy computes {expected.hex()}")
            if expected != short:
                flag(frame, f"{where}: scapy's ICRC {expected.hex()} and this script's "
                           f"{short.hex()} disagree")
        if tshark is not None:
            t = tshark.get(frame)
            if t is None or struct.pack("!I", t) != carried:
                flag(frame, f"{where}: tshark's infiniband.invariant.crc "
                           f"{'missing' if t is None else f'{t:#010x}'} differs from the "
                           f"packet's last four bytes {carried.hex()}")

    print(f"icrc-oracle: {a.pcap}: {checked} RoCEv2 packets checked (UDP ports "
          f"{sorted(ports)}), {by_scapy} of them by scapy too, {len(bad_frames)} bad"
          + (f"; {wakeups} empty datagrams from a port to itself left out" if wakeups else ""))
    for (src, klass), n in sorted(ids.items()):
        print(f"  from {src}: {n} packets with IPv4 {klass}")
    print("  BTH opcodes: " + ", ".join(f"{op}: {n}" for op, n in sorted(opcodes.items())))
    if a.gso_source:
        print(f"  {gso_ids} packets from {', '.join(a.gso_source)} with identification != 0 "
              f"(GSO segments after the first of their super-datagram)")
    for b in bad[:20]:
        print("ICRC ORACLE FAILED:", b)
    if len(bad) > 20:
        print(f"ICRC ORACLE FAILED: ... and {len(bad) - 20} more")
    fail = bool(bad)
    if checked < a.min_packets:
        print(f"ICRC ORACLE FAILED: {checked} packets checked, at least {a.min_packets} required")
        fail = True
    if gso_ids < a.require_gso:
        print(f"ICRC ORACLE FAILED: {gso_ids} GSO segments (identification != 0) from "
              f"{a.gso_source}, at least {a.require_gso} required")
        fail = True
    sys.exit(1 if fail else 0)


if __name__ == "__main__":
    main()
