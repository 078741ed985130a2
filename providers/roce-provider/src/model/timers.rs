//! The timer heap and the timer thread's loop, as the device runs them
//! (`loom-tests/tests/roce_timers.rs`): a model gives the loop a QP of its
//! own (implementing [`Armed`]) and a fire hook standing for `on_timer`,
//! and publishes and forgets deadlines as the QP's drive and destroy do.

pub use crate::timer_thread::run;
pub use crate::timers::{Armed, TimerStats, Timers, NO_DEADLINE};
