//! How numbers and addresses look in the library's `tracing` events
//! (`docs/tracing.md`): QPNs, comm ids and keys in hex as the IBTA tools
//! print them, GIDs as IPv6 addresses (a RoCEv2 GID of an IPv4 address
//! reads `::ffff:127.0.0.1`). Plain `Display` wrappers: a field holding
//! one is formatted only when a subscriber records the event, so an event
//! nobody listens to costs no formatting.

use core::fmt;

/// A number shown as `0x...` (`qpn = %Hex(qpn)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hex<T>(pub T);

impl<T: fmt::LowerHex> fmt::Display for Hex<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// A 16-byte GID shown as the IPv6 address it is (`gid = %Gid(gid)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gid(pub [u8; 16]);

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&std::net::Ipv6Addr::from(self.0), f)
    }
}

#[cfg(test)]
mod tests {
    use super::{Gid, Hex};

    #[test]
    fn hex_and_gid_read_as_the_tools_print_them() {
        assert_eq!(Hex(0x11u32).to_string(), "0x11");
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[127, 0, 0, 1]);
        assert_eq!(Gid(g).to_string(), "::ffff:127.0.0.1");
    }
}
