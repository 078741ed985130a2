//! Parsers of flag values the subcommands share.

/// A byte count: digits with an optional K/KiB or M/MiB suffix.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (digits, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => t.split_at(i),
        None => (t, ""),
    };
    let mult: usize = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        _ => return Err(format!("unknown size unit in {s:?} (use K or M)")),
    };
    let n: usize = digits.parse().map_err(|_| format!("{s:?} is not a size"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// `IP`, `IP:PORT`, `[IPv6]:PORT` or a bare IPv6 address; `default_port`
/// when none is given.
pub fn parse_ip_port(s: &str, default_port: u16) -> Result<std::net::SocketAddr, String> {
    if let Ok(addr) = s.parse::<std::net::SocketAddr>() {
        return Ok(addr);
    }
    s.parse::<std::net::IpAddr>()
        .map(|ip| std::net::SocketAddr::new(ip, default_port))
        .map_err(|_| format!("{s:?} is not an IP address or IP:PORT"))
}

/// A path MTU from its bytes (`--mtu`).
pub fn mtu_of(bytes: u32) -> Result<ibal::prelude::Mtu, String> {
    use ibal::prelude::Mtu;
    Ok(match bytes {
        256 => Mtu::Mtu256,
        512 => Mtu::Mtu512,
        1024 => Mtu::Mtu1024,
        2048 => Mtu::Mtu2048,
        4096 => Mtu::Mtu4096,
        other => return Err(format!("--mtu {other}: use 256, 512, 1024, 2048 or 4096")),
    })
}

/// A u64 in hex, with or without `0x` (`--guid`).
pub fn parse_hex_u64(s: &str) -> Result<u64, String> {
    let digits = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    u64::from_str_radix(digits, 16).map_err(|e| format!("{s:?} is not a hex number: {e}"))
}
