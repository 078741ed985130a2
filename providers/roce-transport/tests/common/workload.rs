//! A mixed RC workload and its checks.

use std::time::Duration;

use provider::{Access, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus};

use super::{pattern, Net, Rng};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    Cas,
    Fadd,
}

#[derive(Debug, Clone, Copy)]
pub struct Msg {
    pub kind: Kind,
    pub len: u32,
    pub src_off: u64,
    pub dst_off: u64,
}

pub const SRC: u64 = 0x10_0000;
pub const RBUF: u64 = 0x20_0000;
pub const RECV: u64 = 0x30_0000;
pub const DST: u64 = 0x40_0000;

/// Bytes a message of `len` takes in every buffer: rounded up to 8 (atomics
/// need alignment) plus an 8-byte gap that catches overruns.
fn slot(len: u32) -> u64 {
    u64::from(len.max(8)).div_ceil(8) * 8 + 8
}

pub struct Workload {
    pub msgs: Vec<Msg>,
    pub keys: Keys,
    /// Added to every data pattern's seed.
    pub seed: u64,
}

#[derive(Debug, Clone, Copy)]
pub struct Keys {
    pub src: u32,
    pub rbuf: u32,
    pub recv: u32,
    pub dst_l: u32,
    pub dst_r: u32,
}

impl Workload {
    /// Registers memory on both sides of `net` for `msgs` and fills it.
    pub fn new(net: &mut Net, kinds: &[(Kind, u32)]) -> Workload {
        Workload::seeded(net, kinds, 0)
    }

    /// As [`Workload::new`], with data patterns drawn from `seed` (so two
    /// workloads on one net carry different bytes).
    pub fn seeded(net: &mut Net, kinds: &[(Kind, u32)], seed: u64) -> Workload {
        // The same stride as the layout below (8-byte aligned, 8 bytes
        // apart), so the last message always fits.
        let total: u64 = kinds.iter().map(|&(_, l)| slot(l)).sum::<u64>() + 64;
        let a = &mut net.sides[0].mem;
        let (src, _) = a.register(SRC, total as usize, Access::NONE);
        let (rbuf, _) = a.register(RBUF, total as usize, Access::LOCAL_WRITE);
        let b = &mut net.sides[1].mem;
        let (recv, _) = b.register(RECV, total as usize, Access::LOCAL_WRITE);
        let all = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC;
        let (dst_l, dst_r) = b.register(DST, total as usize, all);
        let keys = Keys {
            src,
            rbuf,
            recv,
            dst_l,
            dst_r,
        };
        let mut off = 0u64;
        let mut msgs = Vec::new();
        for (i, &(kind, len)) in kinds.iter().enumerate() {
            let len = if matches!(kind, Kind::Cas | Kind::Fadd) {
                8
            } else {
                len
            };
            let m = Msg {
                kind,
                len,
                src_off: off,
                dst_off: off,
            };
            off += slot(len);
            let data = pattern(seed + i as u64 * 7 + 1, len as usize);
            net.sides[0].mem.write(src, SRC + m.src_off, &data);
            match kind {
                Kind::Read => {
                    let remote = pattern(seed + i as u64 * 7 + 2, len as usize);
                    net.sides[1].mem.write(dst_l, DST + m.dst_off, &remote);
                }
                Kind::Cas | Kind::Fadd => {
                    net.sides[1].mem.write(
                        dst_l,
                        DST + m.dst_off,
                        &(i as u64 * 1000).to_ne_bytes(),
                    );
                }
                _ => {}
            }
            msgs.push(m);
        }
        Workload { msgs, keys, seed }
    }

    /// Posts the receives on B and the sends on A.
    pub fn post(&self, net: &mut Net) {
        for (i, m) in self.msgs.iter().enumerate() {
            if matches!(m.kind, Kind::Send | Kind::SendImm | Kind::WriteImm) {
                let sge = [Sge {
                    addr: RECV + m.dst_off,
                    length: m.len,
                    lkey: self.keys.recv,
                }];
                net.sides[1]
                    .t
                    .post_recv(&RecvWr {
                        wr_id: 1000 + i as u64,
                        sg_list: &sge,
                    })
                    .expect("recv");
            }
        }
        for (i, m) in self.msgs.iter().enumerate() {
            self.post_one(net, i, m);
        }
    }

    pub fn post_one(&self, net: &mut Net, i: usize, m: &Msg) {
        let k = self.keys;
        let remote_addr = DST + m.dst_off;
        let rkey = k.dst_r;
        let imm = 0xabc0_0000 + i as u32;
        let (op, sge) = match m.kind {
            Kind::Send => (
                SendOp::Send,
                Sge {
                    addr: SRC + m.src_off,
                    length: m.len,
                    lkey: k.src,
                },
            ),
            Kind::SendImm => (
                SendOp::SendImm(imm),
                Sge {
                    addr: SRC + m.src_off,
                    length: m.len,
                    lkey: k.src,
                },
            ),
            Kind::Write => (
                SendOp::Write { remote_addr, rkey },
                Sge {
                    addr: SRC + m.src_off,
                    length: m.len,
                    lkey: k.src,
                },
            ),
            Kind::WriteImm => (
                SendOp::WriteImm {
                    remote_addr,
                    rkey,
                    imm,
                },
                Sge {
                    addr: SRC + m.src_off,
                    length: m.len,
                    lkey: k.src,
                },
            ),
            Kind::Read => (
                SendOp::Read { remote_addr, rkey },
                Sge {
                    addr: RBUF + m.src_off,
                    length: m.len,
                    lkey: k.rbuf,
                },
            ),
            Kind::Cas => (
                SendOp::CompareSwap {
                    remote_addr,
                    rkey,
                    compare: i as u64 * 1000,
                    swap: 0x5157_0000 + i as u64,
                },
                Sge {
                    addr: RBUF + m.src_off,
                    length: 8,
                    lkey: k.rbuf,
                },
            ),
            Kind::Fadd => (
                SendOp::FetchAdd {
                    remote_addr,
                    rkey,
                    add: 3 + i as u64,
                },
                Sge {
                    addr: RBUF + m.src_off,
                    length: 8,
                    lkey: k.rbuf,
                },
            ),
        };
        let sg = [sge];
        let wr: SendWr<'_, ()> = SendWr::new(i as u64, op, &sg);
        let s = &mut net.sides[0];
        s.t.post_send(&wr, &mut s.mem).expect("post");
    }

    /// Whether every send has completed on A.
    pub fn all_done(&self, net: &Net) -> bool {
        net.sides[0].wcs.len() >= self.msgs.len()
    }

    /// Runs the network until every send completes (or `limit`).
    pub fn run(&self, net: &mut Net, limit: Duration) -> bool {
        let n = self.msgs.len();
        net.run_until(limit, |net| net.sides[0].wcs.len() >= n)
    }

    /// Checks every completion (exactly once, success) and every byte.
    pub fn check(&self, net: &mut Net) {
        let a = &net.sides[0].wcs;
        assert_eq!(a.len(), self.msgs.len(), "send completions: {a:?}");
        for (i, wc) in a.iter().enumerate() {
            assert_eq!(wc.wr_id, i as u64, "in order: {a:?}");
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        }
        let mut recvs = net.sides[1].wcs.iter();
        for (i, m) in self.msgs.iter().enumerate() {
            let want_src = pattern(self.seed + i as u64 * 7 + 1, m.len as usize);
            match m.kind {
                Kind::Send | Kind::SendImm | Kind::WriteImm => {
                    let wc = recvs.next().expect("a receive completion");
                    assert_eq!(wc.wr_id, 1000 + i as u64);
                    assert_eq!(wc.status, WcStatus::Success);
                    assert_eq!(wc.byte_len, m.len);
                    let imm = (m.kind != Kind::Send).then_some(0xabc0_0000 + i as u32);
                    assert_eq!(wc.imm, imm);
                    let (key, base) = if m.kind == Kind::WriteImm {
                        assert_eq!(wc.opcode, WcOpcode::RecvRdmaWithImm);
                        (self.keys.dst_l, DST)
                    } else {
                        assert_eq!(wc.opcode, WcOpcode::Recv);
                        (self.keys.recv, RECV)
                    };
                    let got = net.sides[1].mem.read(key, base + m.dst_off, m.len as usize);
                    assert!(
                        got == want_src,
                        "message {i} ({:?}, {} bytes) differs",
                        m.kind,
                        m.len
                    );
                }
                Kind::Write => {
                    let got =
                        net.sides[1]
                            .mem
                            .read(self.keys.dst_l, DST + m.dst_off, m.len as usize);
                    assert!(got == want_src, "write {i} differs");
                }
                Kind::Read => {
                    let want = pattern(self.seed + i as u64 * 7 + 2, m.len as usize);
                    let got =
                        net.sides[0]
                            .mem
                            .read(self.keys.rbuf, RBUF + m.src_off, m.len as usize);
                    assert!(got == want, "read {i} ({} bytes) differs", m.len);
                    assert_eq!(a[i].opcode, WcOpcode::RdmaRead);
                }
                Kind::Cas | Kind::Fadd => {
                    let initial = i as u64 * 1000;
                    let orig = net.sides[0].mem.read(self.keys.rbuf, RBUF + m.src_off, 8);
                    assert_eq!(orig, initial.to_ne_bytes(), "atomic {i} original");
                    let now = net.sides[1].mem.read(self.keys.dst_l, DST + m.dst_off, 8);
                    let want = if m.kind == Kind::Cas {
                        0x5157_0000 + i as u64
                    } else {
                        initial + 3 + i as u64
                    };
                    assert_eq!(now, want.to_ne_bytes(), "atomic {i} applied exactly once");
                }
            }
        }
        assert!(recvs.next().is_none(), "no extra receive completion");
    }
}

/// A random mix of `n` messages of up to `max_len` bytes.
pub fn random_kinds(rng: &mut Rng, n: usize, max_len: u32) -> Vec<(Kind, u32)> {
    (0..n)
        .map(|_| {
            let kind = match rng.below(7) {
                0 => Kind::Send,
                1 => Kind::SendImm,
                2 => Kind::Write,
                3 => Kind::WriteImm,
                4 => Kind::Read,
                5 => Kind::Cas,
                _ => Kind::Fadd,
            };
            let len = match rng.below(4) {
                0 => rng.below(16) as u32,
                _ => rng.below(u64::from(max_len) + 1) as u32,
            };
            (kind, len)
        })
        .collect()
}
