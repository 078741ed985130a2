//! Wireshark reads our frames: packets of several opcodes are written to a
//! pcap (Ethernet, IPv4, UDP to 4791) and tshark's own `infiniband`
//! dissector (reached through its UDP port 4791 registration) must show the
//! fields we set. Skipped, with the reason printed, when tshark is absent.
//!
//! `ROCE_TSHARK_KEEP=path` keeps the pcap for a look with `tshark -r path -V`.

use std::net::Ipv4Addr;
use std::process::Command;

use roce::{
    icrc, Aeth, AtomicAckEth, AtomicEth, Bth, Deth, Frame, Headers, Ieth, ImmDt, IpHeader,
    Ipv4Header, NakCode, Opcode, Packet, Reth, Syndrome, ROCE_UDP_PORT,
};

/// One packet we send, and what tshark must print for it.
struct Case {
    headers: Headers,
    payload: Vec<u8>,
    /// (tshark field, expected value as tshark prints it)
    expect: Vec<(&'static str, String)>,
}

fn bth(op: Opcode, qp: u32, psn: u32) -> Bth {
    Bth {
        pkey: 0x8001,
        ..Bth::new(op, qp, psn)
    }
}

fn cases() -> Vec<Case> {
    let mut v = Vec::new();

    let mut h = Headers::new(Bth {
        ack_req: true,
        ..bth(Opcode::RcWriteFirst, 0x12, 100)
    });
    h.reth = Some(Reth {
        va: 0x1122_3344_5566_7788,
        rkey: 0xabcd_1234,
        dma_len: 8192,
    });
    v.push(Case {
        headers: h,
        payload: (0..=255).collect(),
        expect: vec![
            ("infiniband.bth.opcode", "6".into()),
            ("infiniband.bth.a", "1".into()),
            ("infiniband.reth.va", "0x1122334455667788".into()),
            ("infiniband.reth.r_key", "0xabcd1234".into()),
            ("infiniband.reth.dmalen", "8192".into()),
        ],
    });

    let mut h = Headers::new(bth(Opcode::RcAck, 0x34, 100));
    h.aeth = Some(Aeth {
        syndrome: Syndrome::Ack { credits: 31 },
        msn: 7,
    });
    v.push(Case {
        headers: h,
        payload: vec![],
        expect: vec![
            ("infiniband.bth.opcode", "17".into()),
            ("infiniband.aeth.syndrome", "31".into()),
            ("infiniband.aeth.syndrome.opcode", "0".into()),
            ("infiniband.aeth.syndrome.credit_count", "31".into()),
            ("infiniband.aeth.msn", "7".into()),
        ],
    });

    let mut h = Headers::new(bth(Opcode::RcAck, 0x34, 101));
    h.aeth = Some(Aeth {
        syndrome: Syndrome::Nak(NakCode::RemoteAccessError),
        msn: 8,
    });
    v.push(Case {
        headers: h,
        payload: vec![],
        expect: vec![
            ("infiniband.aeth.syndrome", "98".into()), // 0x62
            ("infiniband.aeth.syndrome.opcode", "3".into()),
            ("infiniband.aeth.syndrome.error_code", "2".into()),
            ("infiniband.aeth.msn", "8".into()),
        ],
    });

    let mut h = Headers::new(Bth {
        solicited: true,
        ..bth(Opcode::UdSendOnlyImm, 0x77, 0x00ab_cdef)
    });
    h.deth = Some(Deth {
        qkey: 0x8001_0000,
        src_qp: 0x00_0101,
    });
    h.imm = Some(ImmDt { value: 0xdead_beef });
    v.push(Case {
        headers: h,
        payload: b"thirteen byte".to_vec(),
        expect: vec![
            ("infiniband.bth.opcode", "101".into()),
            ("infiniband.bth.se", "1".into()),
            ("infiniband.bth.padcnt", "3".into()),
            ("infiniband.bth.psn", "11259375".into()),
            ("infiniband.deth.q_key", "0x0000000080010000".into()),
            ("infiniband.deth.srcqp", "0x00000101".into()),
            ("infiniband.immdt", "deadbeef".into()),
        ],
    });

    let mut h = Headers::new(bth(Opcode::RcSendLastInvalidate, 0x56, 7));
    h.ieth = Some(Ieth { rkey: 0x55aa_55aa });
    v.push(Case {
        headers: h,
        payload: vec![1, 2, 3, 4],
        expect: vec![
            ("infiniband.bth.opcode", "22".into()),
            ("infiniband.ieth", "55aa55aa".into()),
        ],
    });

    let mut h = Headers::new(bth(Opcode::RcCompareSwap, 0x78, 9));
    h.atomic_eth = Some(AtomicEth {
        va: 0x1000,
        rkey: 0x99,
        swap_add: 0x0102_0304_0506_0708,
        compare: 0x1112_1314_1516_1718,
    });
    v.push(Case {
        headers: h,
        payload: vec![],
        expect: vec![
            ("infiniband.bth.opcode", "19".into()),
            // Wireshark shows the AtomicETH address and key with the RETH fields.
            ("infiniband.reth.va", "0x0000000000001000".into()),
            ("infiniband.reth.r_key", "0x00000099".into()),
            (
                "infiniband.atomiceth.swapdt",
                0x0102_0304_0506_0708u64.to_string(),
            ),
            (
                "infiniband.atomiceth.cmpdt",
                0x1112_1314_1516_1718u64.to_string(),
            ),
        ],
    });

    let mut h = Headers::new(bth(Opcode::RcAtomicAck, 0x78, 9));
    h.aeth = Some(Aeth {
        syndrome: Syndrome::Ack { credits: 3 },
        msn: 2,
    });
    h.atomic_ack_eth = Some(AtomicAckEth {
        original: 0x0a0b_0c0d_0e0f_1011,
    });
    v.push(Case {
        headers: h,
        payload: vec![],
        expect: vec![
            ("infiniband.bth.opcode", "18".into()),
            ("infiniband.aeth.syndrome.credit_count", "3".into()),
            ("infiniband.aeth.msn", "2".into()),
            (
                "infiniband.atomicacketh.origremdt",
                0x0a0b_0c0d_0e0f_1011u64.to_string(),
            ),
        ],
    });

    let mut h = Headers::new(bth(Opcode::RcReadRequest, 0x9a, 200));
    h.reth = Some(Reth {
        va: 0x7f00_0000_0000,
        rkey: 0x4242,
        dma_len: 1 << 20,
    });
    v.push(Case {
        headers: h,
        payload: vec![],
        expect: vec![
            ("infiniband.bth.opcode", "12".into()),
            ("infiniband.reth.dmalen", "1048576".into()),
            ("infiniband.reth.va", "0x00007f0000000000".into()),
            ("infiniband.reth.r_key", "0x00004242".into()),
        ],
    });

    let mut h = Headers::new(bth(Opcode::RcReadResponseFirst, 0x9b, 200));
    h.aeth = Some(Aeth {
        syndrome: Syndrome::Ack { credits: 0 },
        msn: 0,
    });
    v.push(Case {
        headers: h,
        payload: vec![0x5a; 1024],
        expect: vec![
            ("infiniband.bth.opcode", "13".into()),
            ("infiniband.aeth.syndrome", "0".into()),
        ],
    });
    v
}

/// Fields every packet is checked on, from its headers.
fn common(h: &Headers) -> Vec<(&'static str, String)> {
    vec![
        ("infiniband.bth.p_key", "32769".into()), // 0x8001
        ("infiniband.bth.destqp", format!("0x{:06x}", h.bth.dest_qp)),
        ("infiniband.bth.psn", h.bth.psn.to_string()),
        ("infiniband.bth.tver", "0".into()),
    ]
}

fn pcap(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&4u16.to_le_bytes());
    out.extend_from_slice(&0i32.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&65535u32.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes()); // LINKTYPE_ETHERNET
    for (i, ip) in frames.iter().enumerate() {
        let mut eth = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x08, 0x00];
        eth.extend_from_slice(ip);
        out.extend_from_slice(&(i as u32).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(eth.len() as u32).to_le_bytes());
        out.extend_from_slice(&(eth.len() as u32).to_le_bytes());
        out.extend_from_slice(&eth);
    }
    out
}

#[test]
fn tshark_decodes_our_frames() {
    if Command::new("tshark").arg("--version").output().is_err() {
        println!("skipped: tshark is not installed (Debian package `tshark`)");
        return;
    }
    let cases = cases();
    let mut frames = Vec::new();
    let mut icrcs = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let f = Frame {
            ip: IpHeader::V4(Ipv4Header {
                tos: 0x02,
                identification: 0,
                dont_fragment: true,
                ttl: 64,
                src: Ipv4Addr::new(10, 0, 0, 1),
                dst: Ipv4Addr::new(10, 0, 0, 2),
            }),
            src_port: 0xc000 | i as u16,
            dst_port: ROCE_UDP_PORT,
            udp_checksum: true,
            packet: Packet::new(c.headers, &c.payload),
        };
        let bytes = f.encode().unwrap();
        let tail = &bytes[bytes.len() - 4..];
        icrcs.push(u32::from_be_bytes([tail[0], tail[1], tail[2], tail[3]]));
        assert_eq!(
            icrc::from_wire([tail[0], tail[1], tail[2], tail[3]]),
            icrc::icrc_over_headers(&bytes[..28], &bytes[28..bytes.len() - 4]).unwrap()
        );
        frames.push(bytes);
    }
    let path = std::env::var("ROCE_TSHARK_KEEP").map_or_else(
        |_| std::env::temp_dir().join(format!("roce-tshark-{}.pcap", std::process::id())),
        std::path::PathBuf::from,
    );
    std::fs::write(&path, pcap(&frames)).unwrap();

    let mut fields: Vec<&str> = vec![
        "frame.number",
        "infiniband.invariant.crc",
        "udp.checksum.status",
        "_ws.malformed",
        "_ws.col.Protocol",
        "data.data",
    ];
    for c in &cases {
        for (f, _) in c.expect.iter().chain(common(&c.headers).iter()) {
            if !fields.contains(f) {
                fields.push(f);
            }
        }
    }
    let mut cmd = Command::new("tshark");
    cmd.arg("-r")
        .arg(&path)
        .args(["-o", "udp.check_checksum:TRUE"])
        // Heuristic dissectors that would claim our payloads (SDP, and
        // NFS's RPC-over-RDMA, which takes SEND with Invalidate).
        .args(["--disable-protocol", "infiniband_sdp"])
        .args(["--disable-protocol", "rpcordma"])
        .args(["-T", "fields", "-E", "separator=|", "-E", "occurrence=f"]);
    for f in &fields {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().unwrap();
    if std::env::var("ROCE_TSHARK_KEEP").is_err() {
        let _ = std::fs::remove_file(&path);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<Vec<&str>> = stdout.lines().map(|l| l.split('|').collect()).collect();
    assert_eq!(rows.len(), cases.len(), "tshark printed:\n{stdout}");
    for (i, (c, row)) in cases.iter().zip(&rows).enumerate() {
        let get = |name: &str| row[fields.iter().position(|f| *f == name).unwrap()];
        println!("packet {i}: {}", c.headers.bth.opcode);
        assert_eq!(
            get("_ws.malformed"),
            "",
            "packet {i}: tshark calls it malformed"
        );
        assert_eq!(
            get("_ws.col.Protocol"),
            "RRoCE",
            "packet {i}: not decoded as RoCEv2"
        );
        // Wireshark shows the ICRC as the wire bytes read big-endian.
        assert_eq!(
            get("infiniband.invariant.crc"),
            format!("0x{:08x}", icrcs[i]),
            "packet {i} ICRC"
        );
        // Wireshark's checksum status: 0 bad, 1 good, 2 unverified.
        assert_eq!(
            get("udp.checksum.status"),
            "1",
            "packet {i}: UDP checksum not good"
        );
        // The payload reaches Wireshark's data dissector with its pad
        // (Wireshark 4.0 does not strip it), so pad bytes are zeros here.
        let pad = Packet::new(c.headers, &c.payload).pad_count() as usize;
        let data: String = c
            .payload
            .iter()
            .chain(std::iter::repeat_n(&0u8, pad))
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(get("data.data"), data, "packet {i} payload");
        for (name, want) in c.expect.iter().chain(common(&c.headers).iter()) {
            assert_eq!(
                get(name),
                want,
                "packet {i} ({}) field {name}",
                c.headers.bth.opcode
            );
        }
    }
}
