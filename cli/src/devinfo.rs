//! `ibal devinfo`: the devices and ports of a provider, listed the way
//! `ibv_devinfo -v` lists them (the embedded default fabric it lists is
//! [`ibal_testkit::devices::default_fabric`]).
//!
//! Everything printed comes through the provider interface
//! ([`Provider::devices`], [`Device::query`], [`Device::query_port`]), so
//! the same code lists any provider's devices.
//!
//! The provider interface has no firmware version or system image GUID;
//! `fw_ver` is printed as `0.0.0` and `sys_image_guid` as the node GUID
//! (what software HCAs such as rdma_rxe report).

use provider::{
    AtomicCap, Device, DeviceAttr, DeviceInfo, LinkLayer, PortAttr, PortState, Provider,
};

/// The RoCEv2 provider with one device per address of `addrs` (`roce0`,
/// `roce1`, ...; node GUIDs 0x0002_c903_00c0_0001 upwards), each with one
/// port bound to that IP address and UDP port (0: any free port), and the
/// default limits.
pub fn roce_provider(addrs: &[std::net::SocketAddr]) -> ibal::roce::RoceProvider {
    roce_provider_with(addrs, ibal::roce::RoceLimits::default())
}

/// [`roce_provider`] with these limits on every device.
pub fn roce_provider_with(
    addrs: &[std::net::SocketAddr],
    limits: ibal::roce::RoceLimits,
) -> ibal::roce::RoceProvider {
    let devices = addrs
        .iter()
        .enumerate()
        .map(|(i, &addr)| {
            ibal::roce::DeviceConfig::new(
                format!("roce{i}"),
                0x0002_c903_00c0_0001 + ((i as u64) << 16),
                vec![ibal::roce::PortConfig::new(addr)],
            )
            .limits(limits)
        })
        .collect();
    ibal::roce::RoceProvider::new(devices)
}

/// The machine's RDMA devices through libibverbs (feature `rdma`), opened
/// and queried like any provider's. `Err` (`NotFound`, "no RDMA devices
/// found: ibv_get_device_list: ... (errno N, NAME)") when libibverbs cannot
/// list at all (no RDMA support in the kernel); an empty report when it
/// lists none. Either way `ibal devinfo` says "no RDMA devices found" and
/// exits as `ibv_devinfo` does then (255).
#[cfg(feature = "rdma")]
pub fn rdma_report() -> al::Result<DevinfoReport> {
    let provider = ibal::rdma::RdmaProvider::new();
    // Listing through `list` first keeps the reason an empty `devices()`
    // would hide.
    provider.list()?;
    query_all(&provider)
}

/// Several providers' reports as one JSON object:
/// `{"providers":[{"provider":..,"devices":[..]},..]}`.
pub fn reports_to_json(reports: &[DevinfoReport]) -> String {
    let parts: Vec<String> = reports.iter().map(DevinfoReport::to_json).collect();
    format!("{{\"providers\":[{}]}}", parts.join(","))
}

/// What devinfo prints about one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceReport {
    /// As listed by the provider.
    pub info: DeviceInfo,
    /// Device attributes.
    pub attr: DeviceAttr,
    /// Attributes of ports 1..=`attr.num_ports`.
    pub ports: Vec<PortAttr>,
    /// Each port's counters by name, where the provider has them (the
    /// RoCEv2 provider's `PortCounters`: traffic and drops by reason);
    /// empty otherwise.
    pub counters: Vec<CounterList>,
}

/// Counters by name, in their declaration order (`PortCounters::fields`).
pub type CounterList = Vec<(&'static str, u64)>;

/// `counters` as one JSON object: `{"rx_datagrams":12,...}`.
pub fn counters_json(counters: &[(&'static str, u64)]) -> String {
    let fields: Vec<String> = counters
        .iter()
        .map(|(k, v)| format!("\"{k}\":{v}"))
        .collect();
    format!("{{{}}}", fields.join(","))
}

/// Everything devinfo prints: the provider's name and its devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevinfoReport {
    /// Provider name.
    pub provider: String,
    /// Devices in the provider's order.
    pub devices: Vec<DeviceReport>,
}

/// Open every device of `provider` and query it and its ports.
pub fn query_all<P: Provider>(provider: &P) -> al::Result<DevinfoReport> {
    query_with_counters(provider, |_, _| Vec::new())
}

/// [`query_all`] on the RoCEv2 provider, with each port's counters.
pub fn query_roce(provider: &ibal::roce::RoceProvider) -> al::Result<DevinfoReport> {
    query_with_counters(provider, |dev, port| {
        dev.port_counters(port)
            .map(|c| c.fields())
            .unwrap_or_default()
    })
}

/// [`query_all`], with `counters` read for each port.
fn query_with_counters<P: Provider>(
    provider: &P,
    counters: impl Fn(&P::Device, u8) -> CounterList,
) -> al::Result<DevinfoReport> {
    let mut devices = Vec::new();
    for info in provider.devices() {
        let dev = provider.open(info.node_guid)?;
        let attr = dev.query();
        let ports = (1..=attr.num_ports)
            .map(|p| dev.query_port(p))
            .collect::<al::Result<Vec<_>>>()?;
        let counters = (1..=attr.num_ports).map(|p| counters(&dev, p)).collect();
        devices.push(DeviceReport {
            info,
            attr,
            ports,
            counters,
        });
    }
    Ok(DevinfoReport {
        provider: provider.name().to_string(),
        devices,
    })
}

/// A GUID the way `ibv_devinfo` prints it: `0002:c903:00a0:0001`.
pub fn format_guid(guid: u64) -> String {
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        (guid >> 48) & 0xffff,
        (guid >> 32) & 0xffff,
        (guid >> 16) & 0xffff,
        guid & 0xffff
    )
}

/// A GID as eight groups of four hex digits (`fe80:0000:...`).
pub fn format_gid(gid: &[u8; 16]) -> String {
    gid.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// `ibv_port_state` name and value.
fn port_state(s: PortState) -> (&'static str, u8) {
    match s {
        PortState::Down => ("PORT_DOWN", 1),
        PortState::Init => ("PORT_INIT", 2),
        PortState::Armed => ("PORT_ARMED", 3),
        PortState::Active => ("PORT_ACTIVE", 4),
    }
}

/// A GID as `ibv_devinfo -v` prints it: colon-separated 16-bit groups on
/// an InfiniBand port; on an Ethernet (RoCEv2) port the IPv6 form of the
/// address it is, and its type (`::ffff:192.0.2.1, RoCE v2`).
fn port_gid(p: &PortAttr, gid: &[u8; 16]) -> String {
    match p.link_layer {
        LinkLayer::InfiniBand => format_gid(gid),
        LinkLayer::Ethernet => format!("{}, RoCE v2", std::net::Ipv6Addr::from(*gid)),
    }
}

fn link_layer(l: LinkLayer) -> &'static str {
    match l {
        LinkLayer::InfiniBand => "InfiniBand",
        LinkLayer::Ethernet => "Ethernet",
    }
}

/// The device's limits as `ibv_devinfo -v` names them, in its order:
/// what a deployment sizes against (`docs/roce-provider.md`, "Limits").
/// `max_ah` is the provider interface's `max_av`; `atomic_cap` is
/// `ibv_atomic_cap`'s name.
pub fn device_limits(a: &DeviceAttr) -> Vec<(&'static str, u64)> {
    vec![
        ("max_mr_size", a.max_mr_size),
        ("max_qp", a.max_qp.into()),
        ("max_qp_wr", a.max_qp_wr.into()),
        ("max_sge", a.max_sge.into()),
        ("max_cq", a.max_cq.into()),
        ("max_cqe", a.max_cqe.into()),
        ("max_mr", a.max_mr.into()),
        ("max_pd", a.max_pd.into()),
        ("max_qp_rd_atom", a.max_qp_rd_atomic.into()),
        ("max_qp_init_rd_atom", a.max_qp_init_rd_atomic.into()),
        ("max_ah", a.max_av.into()),
        ("max_srq", a.max_srq.into()),
        ("max_srq_wr", a.max_srq_wr.into()),
        ("max_msg_sz", a.max_msg_size.into()),
    ]
}

fn atomic_cap(c: AtomicCap) -> &'static str {
    match c {
        AtomicCap::None => "ATOMIC_NONE (0)",
        AtomicCap::Hca => "ATOMIC_HCA (1)",
        AtomicCap::Global => "ATOMIC_GLOB (2)",
    }
}

/// The transport every device of the provider interface has.
const TRANSPORT: &str = "InfiniBand";
/// Printed for `fw_ver`: the provider interface has no firmware version.
const FW_VER: &str = "0.0.0";

impl DevinfoReport {
    /// Text in `ibv_devinfo -v` layout (the fields listed in the module doc).
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        if self.devices.is_empty() {
            s.push_str("No IB devices found\n");
            return s;
        }
        for d in &self.devices {
            let a = &d.attr;
            s.push_str(&format!("hca_id:\t{}\n", d.info.name));
            s.push_str(&format!("\ttransport:\t\t\t{TRANSPORT} (0)\n"));
            s.push_str(&format!("\tfw_ver:\t\t\t\t{FW_VER}\n"));
            s.push_str(&format!("\tnode_guid:\t\t\t{}\n", format_guid(a.node_guid)));
            s.push_str(&format!(
                "\tsys_image_guid:\t\t\t{}\n",
                format_guid(a.node_guid)
            ));
            s.push_str(&format!("\tvendor_id:\t\t\t{:#06x}\n", a.vendor_id));
            s.push_str(&format!("\tvendor_part_id:\t\t\t{}\n", a.vendor_part_id));
            s.push_str(&format!("\thw_ver:\t\t\t\t{:#x}\n", a.hw_ver));
            s.push_str(&format!("\tphys_port_cnt:\t\t\t{}\n", a.num_ports));
            for (name, value) in device_limits(a) {
                // Values start at column 40, as the fixed lines' do.
                let tabs = "\t".repeat(5usize.saturating_sub((9 + name.len()) / 8).max(1));
                s.push_str(&format!("\t{name}:{tabs}{value}\n"));
            }
            s.push_str(&format!(
                "\tatomic_cap:\t\t\t{}\n",
                atomic_cap(a.atomic_cap)
            ));
            for p in &d.ports {
                let (state, code) = port_state(p.state);
                s.push_str(&format!("\t\tport:\t{}\n", p.port_num));
                s.push_str(&format!("\t\t\tstate:\t\t\t{state} ({code})\n"));
                s.push_str(&format!(
                    "\t\t\tmax_mtu:\t\t{} ({})\n",
                    p.max_mtu.bytes(),
                    p.max_mtu.ibta_code()
                ));
                s.push_str(&format!(
                    "\t\t\tactive_mtu:\t\t{} ({})\n",
                    p.active_mtu.bytes(),
                    p.active_mtu.ibta_code()
                ));
                s.push_str(&format!("\t\t\tsm_lid:\t\t\t{}\n", p.sm_lid));
                s.push_str(&format!("\t\t\tport_lid:\t\t{}\n", p.lid));
                s.push_str(&format!("\t\t\tport_lmc:\t\t{:#04x}\n", p.lmc));
                s.push_str(&format!(
                    "\t\t\tlink_layer:\t\t{}\n",
                    link_layer(p.link_layer)
                ));
                // Unused (all-zero) entries are skipped, as ibv_devinfo
                // does; the others keep their index.
                for (i, g) in p.gid_table.iter().enumerate() {
                    if g == &[0; 16] {
                        continue;
                    }
                    s.push_str(&format!("\t\t\tGID[{i:3}]:\t\t{}\n", port_gid(p, g)));
                }
                let pkeys: Vec<String> = p.pkey_table.iter().map(|k| format!("{k:#06x}")).collect();
                s.push_str(&format!("\t\t\tP_Key table:\t\t{}\n", pkeys.join(" ")));
            }
            s.push('\n');
        }
        s
    }

    /// One JSON object: `{"provider":..,"devices":[{..,"ports":[..]}]}`.
    /// GUIDs and GIDs are strings in the text layout.
    pub fn to_json(&self) -> String {
        let mut s = format!(
            "{{\"provider\":\"{}\",\"devices\":[",
            json_escape(&self.provider)
        );
        for (i, d) in self.devices.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            let a = &d.attr;
            s.push_str(&format!(
                "{{\"hca_id\":\"{}\",\"transport\":\"{TRANSPORT}\",\"fw_ver\":\"{FW_VER}\",\
                 \"node_guid\":\"{}\",\"sys_image_guid\":\"{}\",\"vendor_id\":{},\
                 \"vendor_part_id\":{},\"hw_ver\":{},\"phys_port_cnt\":{},\"limits\":{},\
                 \"atomic_cap\":\"{}\",\"ports\":[",
                json_escape(&d.info.name),
                format_guid(a.node_guid),
                format_guid(a.node_guid),
                a.vendor_id,
                a.vendor_part_id,
                a.hw_ver,
                a.num_ports,
                counters_json(&device_limits(a)),
                atomic_cap(a.atomic_cap)
            ));
            for (j, p) in d.ports.iter().enumerate() {
                if j > 0 {
                    s.push(',');
                }
                let gids: Vec<String> = p
                    .gid_table
                    .iter()
                    .map(|g| format!("\"{}\"", port_gid(p, g)))
                    .collect();
                let pkeys: Vec<String> = p.pkey_table.iter().map(|k| k.to_string()).collect();
                let counters = match d.counters.get(j) {
                    Some(c) if !c.is_empty() => format!(",\"counters\":{}", counters_json(c)),
                    _ => String::new(),
                };
                s.push_str(&format!(
                    "{{\"port\":{},\"state\":\"{}\",\"max_mtu\":{},\"active_mtu\":{},\
                     \"sm_lid\":{},\"port_lid\":{},\"port_lmc\":{},\"link_layer\":\"{}\",\
                     \"gids\":[{}],\"pkeys\":[{}]{counters}}}",
                    p.port_num,
                    port_state(p.state).0,
                    p.max_mtu.bytes(),
                    p.active_mtu.bytes(),
                    p.sm_lid,
                    p.lid,
                    p.lmc,
                    link_layer(p.link_layer),
                    gids.join(","),
                    pkeys.join(",")
                ));
            }
            s.push_str("]}");
        }
        s.push_str("]}");
        s
    }
}

fn json_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ibal_testkit::devices::{
        default_provider, DEFAULT_LIDS, DEFAULT_NAMES, DEFAULT_NODE_GUIDS,
    };

    #[test]
    fn the_default_fabric_lists_two_hcas_through_the_provider() {
        let report = query_all(&default_provider()).unwrap();
        assert_eq!(report.provider, "soft");
        assert_eq!(report.devices.len(), 2);
        for (i, d) in report.devices.iter().enumerate() {
            assert_eq!(d.attr.node_guid, DEFAULT_NODE_GUIDS[i]);
            assert_eq!(d.info.name, DEFAULT_NAMES[i]);
            assert_eq!(d.ports.len(), 1);
            assert_eq!(d.ports[0].lid, DEFAULT_LIDS[i]);
            assert_eq!(d.ports[0].state, PortState::Active);
        }
        let text = report.to_text();
        assert!(
            text.contains("node_guid:\t\t\t0002:c903:00a0:0001"),
            "{text}"
        );
        assert!(text.contains("0002:c903:00b0:0001"));
        assert!(text.contains("PORT_ACTIVE (4)"));
        assert!(text.contains("GID[  0]:\t\tfe80:0000:0000:0000:0002:c903:00a0:0002"));
        let json = report.to_json();
        assert!(json.starts_with('{') && json.ends_with('}'));
        assert!(json.contains("\"node_guid\":\"0002:c903:00b0:0001\""));
        assert!(json.contains("\"port_lid\":2"));
    }

    #[test]
    fn guids_and_gids_format_like_ibv_devinfo() {
        assert_eq!(format_guid(0x0002_c903_00a0_0001), "0002:c903:00a0:0001");
        let mut gid = [0u8; 16];
        gid[0] = 0xfe;
        gid[1] = 0x80;
        gid[15] = 1;
        assert_eq!(format_gid(&gid), "fe80:0000:0000:0000:0000:0000:0000:0001");
        assert_eq!(json_escape("a\"b\\c\n"), "a\\\"b\\\\c\\u000a");
    }

    #[test]
    fn a_roce_port_lists_as_ethernet_with_its_address_as_gid() {
        let provider = roce_provider(&["127.0.0.1:0".parse().unwrap()]);
        let report = query_roce(&provider).unwrap();
        assert_eq!(report.provider, "roce");
        assert_eq!(report.devices.len(), 1);
        let port = &report.devices[0].ports[0];
        assert_eq!(port.link_layer, LinkLayer::Ethernet);
        let text = report.to_text();
        assert!(text.contains("link_layer:\t\tEthernet"), "{text}");
        assert!(
            text.contains("GID[  0]:\t\t::ffff:127.0.0.1, RoCE v2"),
            "{text}"
        );
        let max_qp = report.devices[0].attr.max_qp;
        let json = reports_to_json(&[query_all(&default_provider()).unwrap(), report]);
        assert!(
            json.starts_with("{\"providers\":[{\"provider\":\"soft\""),
            "{json}"
        );
        assert!(json.contains("\"provider\":\"roce\""), "{json}");
        // The device's limits, text and JSON (issue 28: sizing needs them).
        assert_eq!(max_qp, ibal::roce::RoceLimits::default().max_qp);
        assert!(
            text.contains(&format!("\tmax_qp:\t\t\t\t{max_qp}\n")),
            "{text}"
        );
        assert!(text.contains("\tmax_qp_init_rd_atom:\t\t16\n"), "{text}");
        assert!(
            text.contains("\tatomic_cap:\t\t\tATOMIC_HCA (1)\n"),
            "{text}"
        );
        assert!(
            json.contains(&format!(
                "\"limits\":{{\"max_mr_size\":4294967295,\"max_qp\":{max_qp},"
            )),
            "{json}"
        );
        let raised = ibal::roce::RoceLimits {
            max_qp: 200_000,
            ..Default::default()
        };
        let provider = roce_provider_with(&["127.0.0.1:0".parse().unwrap()], raised);
        let text = query_roce(&provider).unwrap().to_text();
        assert!(text.contains("\tmax_qp:\t\t\t\t200000\n"), "{text}");
        // The RoCEv2 port's counters, every drop reason by name.
        assert!(json.contains("\"counters\":{\"rx_datagrams\":0"), "{json}");
        assert!(json.contains("\"rx_wrong_source\":0"), "{json}");
    }
}
