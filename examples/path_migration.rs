//! Path migration on a connected RC pair. Each HCA has two ports: the
//! connection runs on port 1 (LIDs 1 and 2), and A proposes port 2 (LIDs
//! 3 and 4) as the alternate path with a LAP. B loads it into its QP and
//! accepts with an APR; A loads it too, both migrate, and traffic flows on
//! port 2.
//!
//! The CM carries the LAP and APR; loading the path and migrating are QP
//! modifies (RTS to RTS with `alt_av` and `path_mig_state`), the
//! application's job as in IBAL. The soft provider arms a loaded path at
//! once and does not migrate on a peer's MigReq bit, so each side migrates
//! by its own modify (`docs/soft-provider.md`).
//!
//! `cargo run --example path_migration`

use std::sync::mpsc;
use std::time::Duration;

mod common;
use common::{connect_qps_with, end, one_completion, End};
use ibal::prelude::*;

/// One SEND from `from` to `to`, `fill` in every byte, checked on arrival.
fn send_checked(al: &Al, from: &End, to: &End, fill: u8) -> Result<()> {
    from.buf.fill(fill)?;
    to.buf.fill(0)?;
    to.qp.post_recv(
        al,
        &[RecvWr {
            wr_id: 2,
            sg_list: &to.sge(0, 64),
        }],
    )?;
    from.qp
        .post_send(al, &[SendWr::new(1, SendOp::Send, &from.sge(0, 64))])?;
    one_completion(al, from.cq)?;
    let wc = one_completion(al, to.cq)?;
    assert_eq!((wc.wr_id, wc.byte_len), (2, 64));
    assert!(to.buf.to_vec().iter().all(|&b| b == fill), "data differs");
    Ok(())
}

/// Load `alt` as the QP's alternate path, ready to migrate to.
fn load_alternate(al: &Arc<AlInstance>, qp: Handle<Qp>, alt: AvAttr) -> Result<()> {
    let m = QpModify::to(QpState::Rts)
        .alt_av(alt)
        .path_mig_state(MigState::Rearm);
    qp.modify(al, &m)
}

fn main() -> Result<()> {
    let fabric = Fabric::new();
    fabric.add_hca(HcaConfig::new(0xa0, &[1, 3]))?;
    fabric.add_hca(HcaConfig::new(0xb0, &[2, 4]))?;
    let provider = SoftProvider::new(fabric);
    let al = Al::open()?;
    let a = end(&al, &provider, 0xa0, 64, |cq| QpCreate::new(QpType::Rc, cq))?;
    let b = end(&al, &provider, 0xb0, 64, |cq| QpCreate::new(QpType::Rc, cq))?;

    // B answers a LAP: load the proposed path (towards the LAP sender's
    // LID, from B's port 2), then accept it with an APR.
    let (tx_lap, lap_seen) = mpsc::channel();
    let (inst, qp_b) = (Arc::clone(&al), b.qp);
    let on_b: CmHandler = Arc::new(move |cep, ev| {
        if let Event::LapReceived { lap, .. } = ev {
            let path = lap.alternate_path;
            load_alternate(&inst, qp_b, AvAttr::lid(2, path.local_lid)).expect("load on B");
            cep.apr(&inst, ApStatus::Success, b"loaded").expect("apr");
            let _ = tx_lap.send((path.local_lid, path.remote_lid));
        }
    });
    let (tx_apr, apr_seen) = mpsc::channel();
    let on_a: CmHandler = Arc::new(move |_cep, ev| {
        if let Event::AprReceived { status, apr, .. } = ev {
            let _ = tx_apr.send((*status, apr.private_data.as_bytes()[..6].to_vec()));
        }
    });
    let cep = connect_qps_with(&al, a.qp, b.ca, b.qp, 0x1000_0000_0000_0301, on_a, on_b)?;
    send_checked(&al, &a, &b, 0x11)?;
    println!("connected on port 1: 64 bytes checked");

    // A proposes port 2 (its LID 3 to B's LID 4) as the alternate path.
    let alternate_path = PathInfo {
        local_lid: 3,
        remote_lid: 4,
        subnet_local: true,
        local_ack_timeout: 14,
        ..PathInfo::default()
    };
    let lap = LapParams::new(alternate_path).private_data(b"port 2?")?;
    cep.lap(&al, lap)?;
    let wait = Duration::from_secs(5);
    let timeout = |what: &str| Error::Timeout(format!("no {what}").into());
    let lids = lap_seen.recv_timeout(wait).map_err(|_| timeout("LAP"))?;
    assert_eq!(lids, (3, 4), "B got the path A proposed");
    let (status, data) = apr_seen.recv_timeout(wait).map_err(|_| timeout("APR"))?;
    assert_eq!((status, &data[..]), (ApStatus::Success, &b"loaded"[..]));
    println!("LAP 3 -> 4 answered: APR {status:?}");

    // A loads the same path from its side; then both migrate to it.
    load_alternate(&al, a.qp, AvAttr::lid(2, 4))?;
    for qp in [a.qp, b.qp] {
        assert_eq!(qp.query(&al)?.path_mig_state, MigState::Armed);
        let migrate = QpModify::to(QpState::Rts).path_mig_state(MigState::Migrated);
        qp.modify(&al, &migrate)?;
        let attr = qp.query(&al)?;
        assert_eq!((attr.state, attr.port), (QpState::Rts, 2), "on port 2 now");
    }
    for fill in [0x22, 0x33] {
        send_checked(&al, &a, &b, fill)?;
        send_checked(&al, &b, &a, fill)?;
    }
    println!("migrated to port 2: traffic flows both ways, every byte checked");

    cep.disconnect(&al, &[])?;
    assert!(al.close()?.is_clean());
    Ok(())
}
