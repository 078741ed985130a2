//! [`LazyDeque`]: a queue that costs one pointer until its first entry.

use std::collections::VecDeque;

/// A `VecDeque` allocated on first use: 8 bytes in its owner instead of
/// 32, for the queues of a QP that most QPs never use (sends held in
/// SQD, READs and atomics awaiting their responses). Once allocated it
/// stays, so a QP that uses it pays the allocation once. (The box is the
/// point: clippy's `box_collection` weighs the extra allocation, not the
/// 24 bytes every QP saves.)
#[allow(clippy::box_collection)]
pub(crate) struct LazyDeque<T>(Option<Box<VecDeque<T>>>);

impl<T> LazyDeque<T> {
    pub(crate) const fn new() -> Self {
        LazyDeque(None)
    }

    pub(crate) fn push_back(&mut self, v: T) {
        self.0.get_or_insert_with(Box::default).push_back(v);
    }

    pub(crate) fn pop_front(&mut self) -> Option<T> {
        self.0.as_mut()?.pop_front()
    }

    pub(crate) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |q| q.len())
    }

    /// The capacity of its queue, once made.
    pub(crate) fn capacity(&self) -> Option<usize> {
        self.0.as_ref().map(|q| q.capacity())
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes every entry, oldest first.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.0.iter_mut().flat_map(|q| q.drain(..))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lazy_deque_is_a_pointer_until_used_and_a_fifo_after() {
        assert_eq!(std::mem::size_of::<LazyDeque<[u64; 8]>>(), 8);
        let mut q = LazyDeque::new();
        assert!(q.is_empty() && q.pop_front().is_none());
        assert_eq!(q.drain().count(), 0);
        q.push_back(1);
        q.push_back(2);
        q.push_back(3);
        assert_eq!((q.len(), q.pop_front()), (3, Some(1)));
        assert_eq!(q.drain().collect::<Vec<_>>(), [2, 3]);
        assert!(q.is_empty());
    }
}
