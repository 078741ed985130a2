//! A client and a server as two tasks on one executor (feature `async`):
//! the server listens and accepts, the client connects, they exchange a
//! few messages with SEND/RECV whose completions are awaited through CQ
//! streams, the client disconnects, and the AL closes with nothing left.
//!
//! `cargo run --example async_client_server --features async`

use futures::executor::LocalPool;
use futures::stream::StreamExt;
use futures::task::LocalSpawnExt;
use ibal::prelude::*;

const SERVICE: u64 = 0x1000_0000_0000_0a51;
const ROUNDS: u8 = 4;
const LEN: u32 = 64;

/// One side: a CA with the CM attached, a streamable CQ, an RC QP and a
/// registered buffer (the first half to send from, the second to receive
/// into).
struct Side {
    ca: Handle<Ca>,
    cq: AsyncCq,
    qp: Handle<Qp>,
    buf: RegisteredBuffer,
    lkey: u32,
}

fn side(al: &Al, provider: &SoftProvider, guid: u64) -> Result<Side> {
    let ca = al.open_ca(provider, guid)?;
    ca.attach_cm(al)?;
    let pd = ca.alloc_pd(al)?;
    let cq = ca.create_cq_async(al, 64)?;
    let qp = pd.create_qp(al, QpCreate::new(QpType::Rc, cq.handle()))?;
    let buf = RegisteredBuffer::new(2 * LEN as usize);
    let lkey = pd.register(al, &buf, Access::LOCAL_WRITE)?.keys(al)?.0;
    Ok(Side {
        ca,
        cq,
        qp,
        buf,
        lkey,
    })
}

impl Side {
    fn send_sge(&self) -> [Sge; 1] {
        [Sge {
            addr: 0,
            length: LEN,
            lkey: self.lkey,
        }]
    }
    fn recv_sge(&self) -> [Sge; 1] {
        [Sge {
            addr: LEN as u64,
            length: LEN,
            lkey: self.lkey,
        }]
    }
    /// Move the QP to INIT and post `ROUNDS` receives, before the CM moves
    /// it on (connect and accept keep a QP that is in INIT, with its
    /// receives): every message then finds its receive waiting. (The soft
    /// provider retries a SEND that found none only when the fabric is
    /// ticked, `Fabric::progress`, which nothing here does.)
    fn post_receives(&self, al: &Al) -> Result<()> {
        self.qp.modify(
            al,
            &QpModify::to(QpState::Init)
                .pkey_index(0)
                .port(1)
                .access(Access::LOCAL_WRITE),
        )?;
        for round in 0..ROUNDS {
            self.qp.post_recv(
                al,
                &[RecvWr {
                    wr_id: u64::from(round),
                    sg_list: &self.recv_sge(),
                }],
            )?;
        }
        Ok(())
    }

    /// The received half of the buffer.
    fn received(&self) -> Vec<u8> {
        self.buf.to_vec()[LEN as usize..].to_vec()
    }
}

/// The next completion of `cq`, checked: it must be a success of `opcode`.
async fn completion(cq: &mut CqStream, opcode: WcOpcode) -> Result<Wc> {
    let wc = cq
        .next()
        .await
        .ok_or_else(|| Error::Other("the CQ stream ended".into()))??;
    if wc.status != WcStatus::Success || wc.opcode != opcode {
        return Err(Error::Other(
            format!("unexpected completion: {wc:?}").into(),
        ));
    }
    Ok(wc)
}

/// Accept one connection, then answer each message with its bytes plus one.
async fn server(al: Arc<AlInstance>, me: Side, mut listener: Listener) -> Result<()> {
    let mut cq = me.cq.stream()?;
    let request = listener
        .next()
        .await
        .ok_or_else(|| Error::Other("the listener ended".into()))?;
    println!(
        "server: request from LID {} saying {:?}",
        request.peer().map_or(0, |p| p.lid),
        String::from_utf8_lossy(&request.private_data()[..5])
    );
    let conn = request
        .accept(me.qp, &AcceptReply::default().private_data(b"welcome"))
        .await?;
    drop(listener); // one client is enough: stop listening
    println!("server: established");
    for round in 0..ROUNDS {
        let wc = completion(&mut cq, WcOpcode::Recv).await?;
        let got = me.received();
        assert_eq!(wc.byte_len, LEN);
        assert!(got.iter().all(|&b| b == got[0]), "torn message");
        me.buf.write(0, &[got[0].wrapping_add(1); LEN as usize])?;
        me.qp.post_send(
            &al,
            &[SendWr::new(u64::from(round), SendOp::Send, &me.send_sge())],
        )?;
        completion(&mut cq, WcOpcode::Send).await?;
    }
    // The client disconnects; this only waits for the CEP's release.
    conn.disconnect(&[]).await?;
    println!("server: released");
    Ok(())
}

/// Connect, send `ROUNDS` messages and check each answer, disconnect.
async fn client(al: Arc<AlInstance>, me: Side) -> Result<()> {
    let mut cq = me.cq.stream()?;
    let request = ConnectRequest::new(SERVICE, 2).private_data(b"hello");
    let conn = me.qp.connect_async(&al, &request).await?;
    println!(
        "client: established, server said {:?}",
        String::from_utf8_lossy(&conn.private_data()[..7])
    );
    for round in 0..ROUNDS {
        let byte = 0x10 * (round + 1);
        me.buf.write(0, &[byte; LEN as usize])?;
        me.qp.post_send(
            &al,
            &[SendWr::new(u64::from(round), SendOp::Send, &me.send_sge())],
        )?;
        completion(&mut cq, WcOpcode::Send).await?;
        completion(&mut cq, WcOpcode::Recv).await?;
        let got = me.received();
        assert!(got.iter().all(|&b| b == byte + 1), "wrong answer");
        println!("client: sent {byte:#04x}, got {:#04x} back", byte + 1);
    }
    conn.disconnect(b"bye").await?;
    println!("client: disconnected and released");
    Ok(())
}

fn main() -> Result<()> {
    let fabric = Fabric::new();
    fabric.add_hca(HcaConfig::new(0xa, &[1]))?;
    fabric.add_hca(HcaConfig::new(0xb, &[2]))?;
    let provider = SoftProvider::new(fabric);
    let al = Al::open()?;
    let (a, b) = (side(&al, &provider, 0xa)?, side(&al, &provider, 0xb)?);
    a.post_receives(&al)?;
    b.post_receives(&al)?;

    // The server listens before either task runs, so the client's REQ
    // finds it (a REQ for a service nobody listens on is rejected).
    let listener = b.ca.listen_async(&al, 1, SERVICE)?;

    // Both tasks on one single-threaded executor.
    let mut pool = LocalPool::new();
    let spawner = pool.spawner();
    let server = spawner
        .spawn_local_with_handle(server(Arc::clone(&al), b, listener))
        .map_err(|e| Error::Other(e.to_string().into()))?;
    let client = spawner
        .spawn_local_with_handle(client(Arc::clone(&al), a))
        .map_err(|e| Error::Other(e.to_string().into()))?;
    // The first error ends both (a dropped task handle cancels its task):
    // a failing client does not leave the server waiting forever.
    pool.run_until(futures::future::try_join(server, client))?;

    let stats = al.close()?;
    println!("closed: {stats}");
    assert!(stats.is_clean());
    Ok(())
}
