//! Small runtime-agnostic future helpers.

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::task::Poll;

/// Which of two raced futures finished first.
#[derive(Debug, PartialEq, Eq)]
pub enum Either<A, B> {
    /// The first future.
    First(A),
    /// The second future.
    Second(B),
}

/// Runs `a` and `b` together and returns the output of the first to finish, dropping the other.
/// Biased: `a` is polled first, so it wins when both are ready.
pub async fn race<A: Future, B: Future>(a: A, b: B) -> Either<A::Output, B::Output> {
    let mut a = pin!(a);
    let mut b = pin!(b);
    poll_fn(|cx| {
        if let Poll::Ready(out) = a.as_mut().poll(cx) {
            return Poll::Ready(Either::First(out));
        }
        if let Poll::Ready(out) = b.as_mut().poll(cx) {
            return Poll::Ready(Either::Second(out));
        }
        Poll::Pending
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::{Context, Waker};

    fn now<F: Future>(f: F) -> Poll<F::Output> {
        pin!(f).poll(&mut Context::from_waker(Waker::noop()))
    }

    #[test]
    fn the_first_ready_future_wins_and_ties_go_to_the_first() {
        assert_eq!(
            now(race(async { 1 }, async { 2 })),
            Poll::Ready(Either::First(1))
        );
        assert_eq!(
            now(race(std::future::pending::<()>(), async { 2 })),
            Poll::Ready(Either::Second(2))
        );
        assert_eq!(
            now(race(
                std::future::pending::<()>(),
                std::future::pending::<()>()
            )),
            Poll::Pending
        );
    }
}
