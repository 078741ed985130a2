//! A conformance suite for ibal providers: the verbs behaviours every
//! provider must show, written once, generic over the provider.
//!
//! * [`Fixture`]: what a provider gives the suite (two devices that reach
//!   each other, their addressing, a progress hook, bounded waits, and
//!   the few capabilities providers may legitimately differ in).
//! * [`checks`]: the checks, `pub fn check<F: Fixture>(f: &F)`.
//! * [`suite!`]: one `#[test]` per check for a fixture constructor:
//!
//! ```ignore
//! // conformance/tests/soft.rs
//! ibal_conformance::suite!(soft, SoftFixture::new);
//! ```
//!
//! `docs/conformance.md` describes the contract and how to add a provider.

pub mod checks;
pub mod fixture;
pub mod harness;

pub use fixture::{Endpoint, Fixture, Side};

/// Says that `what` did not run and why: `SKIPPED <what>: <why>` on the
/// process's stderr, written directly so that the test harness's output
/// capture does not swallow it (a check that cannot run is reported, never
/// a silent pass).
pub fn skipped(what: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED {what}: {why}");
}

/// Expand to a module `$name` holding one `#[test]` per check of the
/// suite, each running the check on a fresh fixture from `$make()` (any
/// path or closure returning a [`Fixture`], resolved in the caller's
/// module). Run one provider's suite with `cargo test -p ibal-conformance
/// $name::`.
///
/// `suite!(name, make, skip_when_absent)` is for a provider that may have
/// no device on this machine: `make()` returns `Result<fixture, String>`
/// and, when it returns `Err(why)`, every check passes without running but
/// says so: one more test, `skipped_checks_summary`, prints `SKIPPED N of N
/// checks of <suite>: <why>` on stderr, past the test harness's output
/// capture ([`skipped`]), and each check its own `SKIPPED <suite>::<check>`
/// line (captured: `--nocapture` shows them). A run without a device is
/// never silent.
#[macro_export]
macro_rules! suite {
    ($name:ident, $make:expr) => {
        $crate::__with_checks!(required $name, $make);
    };
    ($name:ident, $make:expr, skip_when_absent) => {
        $crate::__with_checks!(optional $name, $make);
    };
}

/// Every check of the suite, handed to [`__suite_tests!`] (not for direct
/// use): one list for both forms of [`suite!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __with_checks {
    ($mode:ident $name:ident, $make:expr) => {
        $crate::__suite_tests!(
            $mode $name,
            $make,
            [
                objects::pd_alloc_and_dealloc,
                objects::cq_create_poll_and_destroy,
                objects::cq_overflow_raises_the_async_event,
                objects::cq_arm_and_notify,
                objects::mr_registration_rules,
                objects::srq_shared_by_several_qps,
                objects::av_create_and_bounds,
                qp_state::qp_state_machine_rc,
                qp_state::qp_state_machine_uc,
                qp_state::qp_state_machine_ud,
                qp_state::qp_cur_state_and_posting_states,
                qp_state::qp_missing_and_unexpected_attributes_are_named,
                qp_state::ud_qp_attributes,
                qp_state::qp_psns_are_24_bits,
                ops::rc_send_and_send_with_immediate,
                ops::rc_rdma_write_and_write_with_immediate,
                ops::rc_rdma_read,
                ops::rc_atomics,
                ops::uc_operations_and_refusals,
                ops::ud_send_and_refusals,
                ops::multi_sge_gather_and_scatter,
                ops::signaled_and_unsignaled_sends,
                errors::bad_lkey_is_local_protection_error,
                errors::stale_lkey_is_local_protection_error,
                errors::lkey_of_another_pd_is_local_protection_error,
                errors::local_out_of_bounds_is_local_protection_error,
                errors::read_into_mr_without_local_write_is_local_protection_error,
                errors::bad_rkey_is_remote_access_error,
                errors::remote_out_of_bounds_is_remote_access_error,
                errors::remote_write_up_to_the_end_is_exact,
                errors::missing_mr_remote_rights_are_remote_access_error,
                errors::qp_access_and_misaligned_atomic_are_remote_invalid_request,
                errors::rd_atomic_depths_of_0_are_none,
                errors::receive_errors_complete_both_sides,
                errors::rc_without_responder_is_retry_exceeded,
                flush::modify_to_err_flushes_everything,
                flush::an_error_flushes_the_rest,
                flush::sqd_holds_sends_until_rts,
                flush::rnr_retry_then_success,
                flush::rnr_retry_exceeded,
                datagram::ud_qkey_mismatch_is_dropped,
                datagram::ud_grh_area,
                datagram::ud_message_larger_than_mtu_is_refused,
                datagram::uc_send_without_receive_is_dropped,
            ]
        );
    };
}

/// The expansion of [`suite!`] (not for direct use). `required`: `$make()`
/// is the fixture; `optional`: `$make()` is `Result<fixture, String>`, and
/// `Err(why)` (no device) passes the check without running it, after
/// [`skipped`] said so.
#[doc(hidden)]
#[macro_export]
macro_rules! __suite_tests {
    (required $name:ident, $make:expr, [$( $(#[$meta:meta])* $module:ident :: $check:ident ),* $(,)?]) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[test]
                $(#[$meta])*
                fn $check() {
                    let fixture = ($make)();
                    $crate::checks::$module::$check(&fixture);
                }
            )*
        }
    };
    (optional $name:ident, $make:expr, [$( $(#[$meta:meta])* $module:ident :: $check:ident ),* $(,)?]) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[test]
                $(#[$meta])*
                fn $check() {
                    let fixture = match ($make)() {
                        Ok(f) => f,
                        Err(why) => {
                            // Captured (seen with --nocapture); the summary
                            // test below says it uncaptured, once.
                            eprintln!(
                                "SKIPPED {}::{}: {why}",
                                stringify!($name),
                                stringify!($check)
                            );
                            return;
                        }
                    };
                    $crate::checks::$module::$check(&fixture);
                }
            )*

            /// Without a device: how many checks did not run, and why.
            #[test]
            fn skipped_checks_summary() {
                const CHECKS: &[&str] = &[$(stringify!($check)),*];
                if let Err(why) = ($make)() {
                    $crate::skipped(
                        &format!(
                            "{} of {} checks of {}",
                            CHECKS.len(),
                            CHECKS.len(),
                            stringify!($name)
                        ),
                        &why,
                    );
                }
            }
        }
    };
}
