//! SIDR: a client asks a UD service for its QP number and Q_Key through the
//! CM (SIDR_REQ / SIDR_REP); the SIDR CEP goes by itself after the answer.
//!
//! `cargo run --example sidr`

use std::sync::mpsc;
use std::time::Duration;

mod common;
use common::{end, two_hcas};
use ibal::prelude::*;

const SERVICE: u64 = 0x1000_0000_0000_0103;

fn main() -> Result<()> {
    let provider = two_hcas()?;
    let al = Al::open()?;
    let a = end(&al, &provider, 0xa, 64, |cq| QpCreate::new(QpType::Ud, cq))?;
    let b = end(&al, &provider, 0xb, 64, |cq| QpCreate::new(QpType::Ud, cq))?;
    let service_qpn = b.qp.query(&al)?.qpn;

    // The service answers every SIDR request with its UD QP.
    let inst = Arc::clone(&al);
    let on_request: ListenHandler = Arc::new(move |_l, cep, _ev| {
        let reply = SidrReplyParams {
            qpn: service_qpn,
            qkey: 0x1111_2222,
            ..SidrReplyParams::default()
        };
        cep.sidr_reply(&inst, reply).expect("sidr_reply");
    });
    b.ca.listen(&al, 1, SERVICE, on_request, Arc::new(|_, _| {}))?;

    let (tx, answer) = mpsc::channel();
    let on_event: CmHandler = Arc::new(move |_cep, ev| {
        if let Event::SidrReply { rep, .. } = ev {
            let _ = tx.send((rep.status, rep.qpn, rep.qkey));
        }
    });
    let peer = PeerAddr {
        lid: 2,
        gid: [0; 16],
    };
    a.ca.sidr_request(&al, SidrParams::new(SERVICE, peer), 1, on_event)?;
    let (status, qpn, qkey) = answer
        .recv_timeout(Duration::from_secs(5))
        .map_err(|_| Error::Timeout("no SIDR reply".into()))?;
    println!("SIDR reply: {status:?}, QPN {qpn:#x}, Q_Key {qkey:#x}");
    assert_eq!((qpn, qkey), (service_qpn, 0x1111_2222));
    assert!(al.close()?.is_clean());
    Ok(())
}
