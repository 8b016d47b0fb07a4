//! Cancel at every poll: a future is built afresh, polled exactly `n` times
//! (returning `Pending` each time, with the runtime free to drive its I/O in
//! between) and dropped, for `n = 0, 1, 2, ...` until it completes without
//! being dropped. After each cut an invariant check runs. This is what a
//! client hang-up, an outer `TimeoutLayer` or a store's own operation timeout
//! does to a store future, at every point where it can happen.
#![allow(dead_code)]

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Poll, Wake, Waker};
use std::time::Duration;

/// The most polls a future under test may need before it completes.
pub const MAX_POLLS: usize = 200;

/// A future that returned `Pending` must wake its task within this: past it
/// the future lost its wakeup (or hangs), which the harness reports.
const STALL: Duration = Duration::from_secs(10);

/// How one run of the future ended.
#[derive(Debug)]
pub struct Cut<T> {
    /// How many times it was polled (and answered `Pending`) before the drop,
    /// or before the poll that completed it.
    pub polls: usize,
    /// Its output if it completed; `None` if it was dropped.
    pub output: Option<T>,
    /// How many times it woke its task.
    pub wakes: usize,
}

impl<T> Cut<T> {
    /// Whether the future was dropped before it completed.
    pub fn dropped(&self) -> bool {
        self.output.is_none()
    }
}

/// Wakes the driving task and counts it.
struct Counting {
    task: Waker,
    wakes: AtomicUsize,
}

impl Wake for Counting {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::Relaxed);
        self.task.wake_by_ref();
    }
}

/// Polls `future` until it has answered `Pending` `polls` times, then drops
/// it (`polls = 0`: dropped unpolled). Between polls the task waits to be
/// woken, so the future's I/O and timers make progress in the meantime.
pub async fn poll_then_drop<F: Future>(future: F, polls: usize) -> Cut<F::Output> {
    let mut future = pin!(future);
    let mut pending = 0;
    let mut counter: Option<Arc<Counting>> = None;
    let output = tokio::time::timeout(
        STALL,
        std::future::poll_fn(|cx| {
            if pending == polls {
                return Poll::Ready(None);
            }
            let counting = counter.get_or_insert_with(|| {
                Arc::new(Counting {
                    task: cx.waker().clone(),
                    wakes: AtomicUsize::new(0),
                })
            });
            let waker = Waker::from(counting.clone());
            let mut inner = std::task::Context::from_waker(&waker);
            match future.as_mut().poll(&mut inner) {
                Poll::Ready(output) => Poll::Ready(Some(output)),
                Poll::Pending => {
                    pending += 1;
                    if pending == polls {
                        Poll::Ready(None)
                    } else {
                        Poll::Pending
                    }
                }
            }
        }),
    )
    .await
    .unwrap_or_else(|_| {
        panic!("the future answered Pending at poll {pending} and was not woken within {STALL:?}")
    });
    let wakes = counter.map_or(0, |c| c.wakes.load(Ordering::Relaxed));
    // The drop happens here, before the check runs.
    Cut {
        polls: pending,
        output,
        wakes,
    }
}

/// Cuts the future `make(n)` builds after `n` polls, for every `n` from 0
/// until one run completes, and runs `check` after each (also after the one
/// that completed). `make` does the run's setup and returns the future with
/// whatever `check` needs to know. Returns the first `n` that completed
/// (one more than the `Pending`s the future answers when left alone).
pub async fn at_every_poll<X, F, Make, MakeFut, Check, CheckFut>(
    what: &str,
    mut make: Make,
    mut check: Check,
) -> usize
where
    F: Future,
    Make: FnMut(usize) -> MakeFut,
    MakeFut: Future<Output = (F, X)>,
    Check: FnMut(Cut<F::Output>, X) -> CheckFut,
    CheckFut: Future<Output = ()>,
{
    for polls in 0..=MAX_POLLS {
        let (future, context) = make(polls).await;
        let cut = poll_then_drop(future, polls).await;
        let completed = !cut.dropped();
        check(cut, context).await;
        if completed {
            eprintln!("{what}: cut after each of 0..{polls} polls, then ran to completion");
            return polls;
        }
    }
    panic!("{what}: still not complete after {MAX_POLLS} polls");
}

/// Polls `condition` until it holds or `limit` has passed; whether it held.
/// For state a dropped future's background cleanup settles, where there is
/// nothing to be notified by.
pub async fn eventually<Fut: Future<Output = bool>>(
    limit: Duration,
    mut condition: impl FnMut() -> Fut,
) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if condition().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_driver_cuts_at_every_poll_then_lets_the_future_complete() {
    // Three yields: cut after 0, 1, 2 and 3 polls (the third `Pending` is
    // the last before completion), completed on the fifth run.
    let runs = Arc::new(AtomicUsize::new(0));
    let completed_at = at_every_poll(
        "three yields",
        |_| {
            let runs = runs.clone();
            async move {
                let future = async move {
                    for _ in 0..3 {
                        tokio::task::yield_now().await;
                    }
                    runs.fetch_add(1, Ordering::SeqCst)
                };
                (future, ())
            }
        },
        |cut, ()| async move {
            assert!(cut.polls <= 3);
            // Each yield wakes once; the last one's wake may come after the drop.
            assert!(cut.wakes <= cut.polls, "{cut:?}");
            if !cut.dropped() {
                assert_eq!(cut.wakes, 3);
            }
        },
    )
    .await;
    assert_eq!(completed_at, 4);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "only the uncut run completed"
    );
}
