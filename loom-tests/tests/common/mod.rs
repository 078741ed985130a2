//! Shared helpers of the loom models.

/// Run `f` under loom at the preemption bound from `LOOM_MAX_PREEMPTIONS`
/// (3 unless set) and print how many executions were explored.
pub fn model(name: &str, f: impl Fn() + Sync + Send + 'static) {
    model_bounded(name, None, f);
}

/// [`model`], at most at preemption bound `cap` (a lower
/// `LOOM_MAX_PREEMPTIONS` is kept): for models whose state space at the
/// default bound is out of reach (the whole-device models).
#[allow(dead_code)] // not every model file caps its bound
pub fn model_bounded(name: &str, cap: Option<usize>, f: impl Fn() + Sync + Send + 'static) {
    static EXECUTIONS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    EXECUTIONS.store(0, std::sync::atomic::Ordering::SeqCst);
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    if let Some(cap) = cap {
        builder.preemption_bound = builder.preemption_bound.map(|b| b.min(cap));
    }
    // Models over real verbs objects build a whole soft HCA first, which
    // is thousands of (single-threaded) loom operations.
    builder.max_branches = builder.max_branches.max(100_000);
    builder.check(move || {
        EXECUTIONS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        f()
    });
    println!(
        "loom model {name}: {} executions",
        EXECUTIONS.load(std::sync::atomic::Ordering::SeqCst)
    );
}
