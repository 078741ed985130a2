//! errno values as [`al::Error`]: which error each means, and a text that
//! names the call and the errno.

use al::Error;

/// The symbolic name of an errno value (`ENOSYS`), for the common ones.
pub fn errno_name(errno: i32) -> Option<&'static str> {
    Some(match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::ENODEV => "ENODEV",
        libc::EINVAL => "EINVAL",
        libc::ENFILE => "ENFILE",
        libc::EMFILE => "EMFILE",
        libc::ENOSPC => "ENOSPC",
        libc::ERANGE => "ERANGE",
        libc::ENOSYS => "ENOSYS",
        libc::ENODATA => "ENODATA",
        libc::EPROTONOSUPPORT => "EPROTONOSUPPORT",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::ECANCELED => "ECANCELED",
        _ => return None,
    })
}

/// `call: <strerror> (errno N, NAME)`, the text every mapped error carries.
pub fn errno_text(call: &str, errno: i32) -> String {
    let desc = std::io::Error::from_raw_os_error(errno).to_string();
    // std appends " (os error N)"; the errno is said once, below.
    let desc = desc
        .strip_suffix(&format!(" (os error {errno})"))
        .unwrap_or(&desc)
        .to_string();
    match errno_name(errno) {
        Some(name) => format!("{call}: {desc} (errno {errno}, {name})"),
        None => format!("{call}: {desc} (errno {errno})"),
    }
}

/// The [`al::Error`] for an rdma-core call `call` that failed with `errno`;
/// its message names the call and the errno ([`errno_text`]).
///
/// | errno | error |
/// |---|---|
/// | `EINVAL`, `EFAULT`, `ERANGE` | `InvalidParameter` |
/// | `ENOENT`, `ENODEV`, `ENXIO`, `ENODATA` | `NotFound` |
/// | `ENOMEM`, `EAGAIN`, `ENOSPC`, `EMFILE`, `ENFILE` | `InsufficientResources` |
/// | `EPERM`, `EACCES` | `InvalidPermission` |
/// | `EBUSY` | `ResourceBusy` |
/// | `ENOSYS`, `EOPNOTSUPP`, `EPROTONOSUPPORT` | `Unsupported` |
/// | `ETIMEDOUT` | `Timeout` |
/// | `ECANCELED` | `Canceled` |
/// | any other | `Other` |
///
/// `ENOMEM` is `InsufficientResources`, not `InsufficientMemory`: from a
/// verb it usually means a device table is full (QPs, MRs, pinned pages),
/// and `InsufficientMemory` carries no message to hold the errno.
pub fn errno_error(call: &str, errno: i32) -> Error {
    let text = errno_text(call, errno);
    match errno {
        libc::EINVAL | libc::EFAULT | libc::ERANGE => Error::InvalidParameter(text.into()),
        libc::ENOENT | libc::ENODEV | libc::ENXIO | libc::ENODATA => Error::NotFound(text.into()),
        libc::ENOMEM | libc::EAGAIN | libc::ENOSPC | libc::EMFILE | libc::ENFILE => {
            Error::InsufficientResources(text.into())
        }
        libc::EPERM | libc::EACCES => Error::InvalidPermission(text.into()),
        libc::EBUSY => Error::ResourceBusy(text.into()),
        libc::ENOSYS | libc::EOPNOTSUPP | libc::EPROTONOSUPPORT => Error::Unsupported(text.into()),
        libc::ETIMEDOUT => Error::Timeout(text.into()),
        libc::ECANCELED => Error::Canceled(text.into()),
        _ => Error::Other(text.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errnos_map_to_al_errors_that_name_the_call_and_the_errno() {
        let e = errno_error("ibv_get_device_list", libc::ENOSYS);
        assert!(matches!(e, Error::Unsupported(_)), "{e:?}");
        assert_eq!(
            e.to_string(),
            "unsupported: ibv_get_device_list: Function not implemented (errno 38, ENOSYS)"
        );
        // By IBAL status name: InsufficientResources and the rest carry text.
        let cases = [
            (libc::EINVAL, "IB_INVALID_PARAMETER"),
            (libc::EFAULT, "IB_INVALID_PARAMETER"),
            (libc::ENOENT, "IB_NOT_FOUND"),
            (libc::ENODEV, "IB_NOT_FOUND"),
            (libc::ENXIO, "IB_NOT_FOUND"),
            (libc::ENOMEM, "IB_INSUFFICIENT_RESOURCES"),
            (libc::EAGAIN, "IB_INSUFFICIENT_RESOURCES"),
            (libc::EMFILE, "IB_INSUFFICIENT_RESOURCES"),
            (libc::EPERM, "IB_INVALID_PERMISSION"),
            (libc::EACCES, "IB_INVALID_PERMISSION"),
            (libc::EBUSY, "IB_RESOURCE_BUSY"),
            (libc::EOPNOTSUPP, "IB_UNSUPPORTED"),
            (libc::ETIMEDOUT, "IB_TIMEOUT"),
            (libc::ECANCELED, "IB_CANCELED"),
            (libc::EIO, "IB_ERROR"),
        ];
        for (errno, status) in cases {
            let e = errno_error("ibv_create_qp", errno);
            assert_eq!(e.status(), status, "errno {errno}: {e:?}");
            let text = e.to_string();
            assert!(text.contains("ibv_create_qp: "), "{text}");
            assert!(text.contains(&format!("(errno {errno}")), "{text}");
            assert!(!text.contains("os error"), "{text}");
        }
        assert!(errno_text("x", 12345).ends_with("(errno 12345)"));
    }
}
