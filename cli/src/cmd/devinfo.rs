//! `ibal devinfo`: the soft fabric's and RoCEv2 devices (and, built with
//! `rdma`, the machine's RDMA devices), as text or JSON.

use std::process::ExitCode;

use super::parse::parse_ip_port;
use super::print_report;

// `ibal devinfo`'s flags.
#[derive(clap::Args)]
pub struct DevinfoArgs {
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Also list a RoCEv2 device with one port bound to this IP
    /// address (and UDP port; 0 or none: any free one). Repeatable;
    /// default: one on 127.0.0.1.
    #[arg(long, value_name = "IP[:UDP_PORT]")]
    roce: Vec<String>,
    /// The RoCEv2 devices' `max_qp` [default: 1048576; at most 16777214].
    #[arg(long, value_name = "N")]
    max_qp: Option<u32>,
}

impl DevinfoArgs {
    /// Lists the devices; the exit status is `ibv_devinfo`'s.
    pub fn run(self) -> Result<ExitCode, String> {
        devinfo(self.json, &self.roce, self.max_qp)
    }
}

/// Exit status 255: what `ibv_devinfo` returns (`-1`) when there is no
/// device or libibverbs cannot list any.
#[cfg(feature = "rdma")]
const NO_RDMA_DEVICES_EXIT: u8 = 255;

fn devinfo(json: bool, roce: &[String], max_qp: Option<u32>) -> Result<ExitCode, String> {
    use ibal_cli::devinfo::{query_all, query_roce, reports_to_json, roce_provider_with};
    use ibal_testkit::devices::default_provider;
    let addrs = if roce.is_empty() {
        vec!["127.0.0.1:0".parse().expect("a literal address")]
    } else {
        roce.iter()
            .map(|a| parse_ip_port(a, 0))
            .collect::<Result<Vec<_>, _>>()?
    };
    let soft = query_all(&default_provider()).map_err(|e| e.to_string())?;
    let mut limits = ibal::roce::RoceLimits::default();
    if let Some(n) = max_qp {
        limits.max_qp = n;
    }
    let roce = query_roce(&roce_provider_with(&addrs, limits))
        .map_err(|e| format!("cannot open a RoCEv2 port on {addrs:?}: {e}"))?;
    #[allow(unused_mut)]
    let mut text = format!("{}{}", soft.to_text(), roce.to_text());
    #[allow(unused_mut)]
    let mut reports = vec![soft, roce];
    #[allow(unused_mut)]
    let mut code = ExitCode::SUCCESS;
    #[cfg(feature = "rdma")]
    {
        let none = |why: String| {
            eprintln!("ibal: {why}");
            ibal_cli::devinfo::DevinfoReport {
                provider: "rdma".into(),
                devices: Vec::new(),
            }
        };
        let rdma = match ibal_cli::devinfo::rdma_report() {
            Ok(r) if r.devices.is_empty() => none(format!(
                "{} (ibv_get_device_list listed none)",
                ibal::rdma::NO_DEVICES
            )),
            Ok(r) => r,
            Err(e @ al::Error::NotFound(_)) => {
                none(e.to_string().trim_start_matches("not found: ").into())
            }
            Err(e) => return Err(format!("cannot query the RDMA devices: {e}")),
        };
        if rdma.devices.is_empty() {
            code = ExitCode::from(NO_RDMA_DEVICES_EXIT);
        } else {
            text.push_str(&rdma.to_text());
        }
        reports.push(rdma);
    }
    print_report(json, reports_to_json(&reports), text);
    Ok(code)
}
