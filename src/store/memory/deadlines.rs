//! The queues of deadlines `MemoryStore` evicts by, with the earliest one
//! readable without taking the queue's lock.

use super::lock;
use super::record::{Id, Nanos};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;

/// A completion's retention deadline. When it is due, the record with its id
/// is evicted if that record is expired: the same completion's, or a later
/// record of the same key that expired too (its own entry then finds nothing).
pub(super) struct Deadline {
    pub(super) at: Nanos,
    pub(super) id: Id,
}

/// Deadlines in the order they were queued (which, for a store's fixed
/// retention or tombstone window, is about the order they come due).
pub(super) struct Deadlines {
    queue: Mutex<VecDeque<Deadline>>,
    /// The first deadline's time (`Nanos::MAX` when there is none), set
    /// under the lock at every change: every claim checks for something due,
    /// and almost always finds nothing, without the lock.
    front: AtomicI64,
}

impl Deadlines {
    pub(super) fn new() -> Self {
        Self {
            queue: Mutex::new(VecDeque::new()),
            front: AtomicI64::new(Nanos::MAX),
        }
    }

    pub(super) fn push(&self, deadline: Deadline) {
        self.extend([deadline]);
    }

    pub(super) fn extend(&self, deadlines: impl IntoIterator<Item = Deadline>) {
        let mut queue = lock(&self.queue);
        queue.extend(deadlines);
        self.mirror(&queue);
    }

    /// The first deadline, taken off the queue if it is due at `now`.
    pub(super) fn pop_due(&self, now: Nanos) -> Option<Deadline> {
        if self.front.load(Ordering::Acquire) > now {
            return None;
        }
        let mut queue = lock(&self.queue);
        let due = match queue.front() {
            Some(first) if first.at <= now => queue.pop_front(),
            _ => None,
        };
        // A queue never shrinks by itself: after a burst its buffer would
        // stay at the peak size for good.
        let (len, capacity) = (queue.len(), queue.capacity());
        if due.is_some() && capacity > 1024 && len < capacity / 4 {
            queue.shrink_to(len * 2);
        }
        self.mirror(&queue);
        due
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        lock(&self.queue).len()
    }

    fn mirror(&self, queue: &VecDeque<Deadline>) {
        let front = queue.front().map_or(Nanos::MAX, |first| first.at);
        self.front.store(front, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(at: Nanos) -> Deadline {
        Deadline {
            at,
            id: Id::for_test(at as u64),
        }
    }

    #[test]
    fn deadlines_come_due_in_order_and_after_the_queue_ran_empty() {
        let deadlines = Deadlines::new();
        assert!(deadlines.pop_due(Nanos::MAX - 1).is_none());
        deadlines.push(at(10));
        deadlines.extend([at(20), at(30)]);
        assert!(deadlines.pop_due(9).is_none());
        assert_eq!(deadlines.pop_due(25).map(|d| d.at), Some(10));
        assert_eq!(deadlines.pop_due(25).map(|d| d.at), Some(20));
        assert!(deadlines.pop_due(25).is_none(), "30 is not due at 25");
        assert_eq!(deadlines.pop_due(30).map(|d| d.at), Some(30));
        assert!(deadlines.pop_due(1_000).is_none());
        // Queued into an empty queue: found without a stale "nothing due".
        deadlines.push(at(40));
        assert_eq!(deadlines.pop_due(40).map(|d| d.at), Some(40));
        assert_eq!(deadlines.len(), 0);
    }
}
