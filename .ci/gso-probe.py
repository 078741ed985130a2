#!/usr/bin/python3
"""Sends one UDP GSO super-datagram the way ibal's RoCEv2 port does (issue 31; FINDINGS.md).

An unconnected IPv4 socket with IP_MTU_DISCOVER = IP_PMTUDISC_DO (DF) and UDP_SEGMENT =
SEG writes one datagram of COUNT segments (the last one SEG / 2 bytes) to DST:PORT from
SRC. Captured where the kernel segments it (lo in a namespace with tx-udp-segmentation
off), its segments must carry IPv4 identifications 0, 1, ..., COUNT - 1, all with DF:
.ci/gso-capture.sh checks that before it trusts identifications as the sign of GSO.
usage: gso-probe.py SRC DST PORT SEG COUNT
"""
import socket
import sys

IP_MTU_DISCOVER, IP_PMTUDISC_DO, UDP_SEGMENT = 10, 2, 103

src, dst, port, seg, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((src, 0))
s.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
s.setsockopt(socket.SOL_UDP, UDP_SEGMENT, seg)
data = b"".join(bytes([k]) * seg for k in range(count - 1)) + b"z" * (seg // 2)
sent = s.sendto(data, (dst, port))
assert sent == len(data), f"sent {sent} of {len(data)} bytes"
