//! Where the futures and streams remember the task to wake: one rule
//! for all of them, below every one.

use std::task::{Context, Waker};

/// Remember the task to wake: keep the stored waker if it wakes the same
/// task, else replace it.
pub(super) fn park(slot: &mut Option<Waker>, cx: &Context<'_>) {
    match slot {
        Some(w) if w.will_wake(cx.waker()) => {}
        _ => *slot = Some(cx.waker().clone()),
    }
}
