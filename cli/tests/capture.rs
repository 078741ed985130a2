//! `ibal pingpong --capture FILE`: the file holds, as InfiniBand packets,
//! exactly the CM exchange of the run (REQ, REP, RTU, DREQ, DREP), each
//! with the headers a QP1-to-QP1 MAD carries and both CRCs right, and the
//! MADs inside decode to one consistent connection. `cep/tests/wireshark.rs`
//! has tshark read the same kind of packets.

use std::path::PathBuf;

use cep::wire::{self, CmMessage};
use ibal::verbs::erf;
use ibal::verbs::packet::UdPacket;
use ibal_cli::pingpong::{run, PingPongConfig};
use ibal_testkit::devices::DEFAULT_LIDS;
use provider::GSI_QKEY;

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ibal-capture-{}-{name}.erf", std::process::id()))
}

#[test]
fn a_captured_pingpong_is_the_cm_exchange_as_standard_packets() {
    let path = temp("pingpong");
    let report = run(&PingPongConfig {
        iterations: 5,
        size: 64,
        capture: Some(path.clone()),
    })
    .unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).ok();
    let records = erf::read(&bytes).unwrap();
    assert_eq!(report.captured_packets, Some(records.len() as u64));
    assert_eq!(report.cm_mads_sent, records.len() as u64);

    let packets: Vec<UdPacket> = records
        .iter()
        .map(|r| UdPacket::decode(&r.data).expect("a captured packet decodes, CRCs included"))
        .collect();
    let mads: Vec<CmMessage> = packets
        .iter()
        .map(|p| {
            wire::decode(&p.payload)
                .expect("a captured MAD decodes")
                .message
        })
        .collect();
    let kinds: Vec<&str> = mads.iter().map(|m| m.message_kind()).collect();
    assert_eq!(kinds, ["REQ", "REP", "RTU", "DREQ", "DREP"]);

    // Active side: LID 1 (soft0); passive: LID 2 (soft1). DREQ from the
    // active side, which disconnected.
    let (a, b) = (DEFAULT_LIDS[0], DEFAULT_LIDS[1]);
    let routes = [(a, b), (b, a), (a, b), (a, b), (b, a)];
    let mut last_psn = std::collections::HashMap::new();
    for (i, (p, (slid, dlid))) in packets.iter().zip(routes).enumerate() {
        assert_eq!((p.slid, p.dlid), (slid, dlid), "packet {i}: LIDs");
        assert_eq!((p.src_qpn, p.dest_qpn), (1, 1), "packet {i}: QP1 to QP1");
        assert_eq!(p.qkey, GSI_QKEY, "packet {i}: Q_Key");
        assert_eq!(p.pkey, 0xffff, "packet {i}: default P_Key");
        assert_eq!(p.payload.len(), 256, "packet {i}: one whole MAD");
        assert!(p.grh.is_none() && p.immediate.is_none());
        // Each port numbers its QP1's packets one after another.
        if let Some(prev) = last_psn.insert(p.slid, p.psn) {
            assert_eq!(p.psn, (prev + 1) & 0xff_ffff, "packet {i}: PSN");
        }
    }
    for r in records.windows(2) {
        assert!(r[0].at <= r[1].at, "records in time order");
    }

    // One connection: every message names the ids the others chose.
    let (CmMessage::Req(req), CmMessage::Rep(rep), CmMessage::Rtu(rtu)) =
        (mads[0], mads[1], mads[2])
    else {
        unreachable!("kinds checked above")
    };
    let (CmMessage::Dreq(dreq), CmMessage::Drep(drep)) = (mads[3], mads[4]) else {
        unreachable!("kinds checked above")
    };
    assert_eq!(req.service_id, ibal_cli::pingpong::SERVICE_ID);
    assert_eq!(req.primary_path.local_lid, a);
    assert_eq!(req.primary_path.remote_lid, b);
    assert_eq!(rep.remote_comm_id, req.local_comm_id);
    assert_eq!(
        (rtu.local_comm_id, rtu.remote_comm_id),
        (req.local_comm_id, rep.local_comm_id)
    );
    assert_eq!(
        (
            dreq.local_comm_id,
            dreq.remote_comm_id,
            dreq.remote_qpn_eecn
        ),
        (req.local_comm_id, rep.local_comm_id, rep.local_qpn)
    );
    assert_eq!(
        (drep.local_comm_id, drep.remote_comm_id),
        (rep.local_comm_id, req.local_comm_id)
    );
}

#[test]
fn a_capture_that_cannot_be_written_fails_the_run_cleanly() {
    let dir = temp("no-such-dir");
    let path = dir.join("x.erf");
    let err = run(&PingPongConfig {
        iterations: 1,
        size: 8,
        capture: Some(path),
    })
    .unwrap_err();
    assert!(err.contains("creating"), "{err}");
}

#[test]
#[ignore = "needs tshark; .ci/run installs it and runs this with --ignored"]
fn tshark_reads_the_captured_pingpong_as_the_cm_exchange() {
    let path = temp("tshark");
    let report = run(&PingPongConfig {
        iterations: 5,
        size: 64,
        capture: Some(path.clone()),
    })
    .unwrap();
    let out = std::process::Command::new("tshark")
        .args(["--disable-protocol", "infiniband_sdp", "-r"])
        .arg(&path)
        .args([
            "-T",
            "fields",
            "-E",
            "separator=,",
            "-e",
            "infiniband.lrh.slid",
            "-e",
            "infiniband.lrh.dlid",
            "-e",
            "infiniband.bth.destqp",
            "-e",
            "infiniband.deth.srcqp",
            "-e",
            "infiniband.mad.mgmtclass",
            "-e",
            "_ws.col.Info",
        ])
        .output()
        .expect("tshark runs (install the tshark package)");
    std::fs::remove_file(&path).ok();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let want = [
        "1,2,0x000001,0x00000001,0x07,CM: ConnectRequest",
        "2,1,0x000001,0x00000001,0x07,CM: ConnectReply",
        "1,2,0x000001,0x00000001,0x07,CM: ReadyToUse",
        "1,2,0x000001,0x00000001,0x07,CM: DisconnectRequest",
        "2,1,0x000001,0x00000001,0x07,CM: DisconnectReply",
    ];
    assert_eq!(lines, want, "tshark's reading of the capture");
    assert_eq!(report.captured_packets, Some(5));
}
