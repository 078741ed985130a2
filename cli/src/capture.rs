//! `--capture FILE`: write every datagram the embedded fabric carries (all
//! the CM's MADs among them) to a capture file that Wireshark and tshark
//! decode with their `infiniband` dissector, with no option needed.
//!
//! Each packet is built by [`UdPacket::encode`] from what the
//! sending port put on its link (LRH, GRH when routed by GID, BTH, DETH,
//! payload, ICRC, VCRC) and written as an ERF InfiniBand record
//! ([`ibal::verbs::erf`]). `tshark -r FILE -V` shows every CM field by name;
//! `docs/capture.md` describes the checks the tests run on such a file.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use ibal::verbs::erf::ErfWriter;
use ibal::verbs::packet::UdPacket;
use ibal::verbs::Fabric;

struct Sink {
    writer: Option<ErfWriter<BufWriter<File>>>,
    /// The first failure to encode or write; later packets are skipped.
    error: Option<String>,
}

/// A capture in progress on one fabric.
pub struct FabricCapture {
    fabric: Fabric,
    path: PathBuf,
    sink: Arc<Mutex<Sink>>,
}

impl FabricCapture {
    /// Create `path` (replacing it) and capture `fabric`'s datagrams into it.
    pub fn start(fabric: &Fabric, path: &Path) -> Result<FabricCapture, String> {
        let file = File::create(path).map_err(|e| format!("creating {}: {e}", path.display()))?;
        let writer = ErfWriter::new(BufWriter::new(file));
        let sink = Arc::new(Mutex::new(Sink {
            writer: Some(writer),
            error: None,
        }));
        let tap_sink = sink.clone();
        let tap_path = path.to_path_buf();
        fabric.set_capture(Some(Arc::new(move |p: &UdPacket| {
            let mut s = tap_sink.lock().unwrap_or_else(|e| e.into_inner());
            if s.error.is_some() {
                return;
            }
            let at = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default();
            let result = match (p.encode(), s.writer.as_mut()) {
                (Ok(bytes), Some(w)) => w
                    .write(at, &bytes)
                    .map_err(|e| format!("writing {}: {e}", tap_path.display())),
                (Err(e), _) => Err(format!("encoding a captured datagram: {e}")),
                (_, None) => Ok(()),
            };
            if let Err(e) = result {
                s.error = Some(e);
            }
        })));
        Ok(FabricCapture {
            fabric: fabric.clone(),
            path: path.to_path_buf(),
            sink,
        })
    }

    /// Stop capturing, flush the file, and return how many packets it holds.
    pub fn finish(self) -> Result<u64, String> {
        self.fabric.set_capture(None);
        let mut s = self.sink.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = s.error.take() {
            return Err(e);
        }
        let Some(w) = s.writer.take() else {
            return Ok(0);
        };
        let n = w.records();
        w.finish()
            .map_err(|e| format!("writing {}: {e}", self.path.display()))?;
        Ok(n)
    }
}

impl Drop for FabricCapture {
    fn drop(&mut self) {
        // A run that fails half way still stops the tap.
        self.fabric.set_capture(None);
    }
}
