//! Streams read one after another, each next one started early: while the current stream is
//! drained, the next is driven until its first item, which is held. A stream of a Parquet
//! segment does its reading before its first batch (footer, then column chunks), so the next
//! segment's bytes cross the link while the current one is decoded and consumed, as a reader
//! of a storage device reads ahead. Order is kept; at most one item and one stream's reads are
//! ahead of the consumer.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use futures::stream::BoxStream;

/// `streams`' items, in order, each stream after the one before has ended; the next stream is
/// polled (to its first item) whenever the current one is.
pub fn read_ahead<T: Send + 'static>(streams: Vec<BoxStream<'static, T>>) -> BoxStream<'static, T> {
    let mut waiting: VecDeque<_> = streams.into();
    let current = waiting.pop_front();
    Box::pin(ReadAhead { current, next: None, waiting })
}

struct ReadAhead<T> {
    current: Option<BoxStream<'static, T>>,
    /// The stream after `current`, and what it has produced so far: nothing yet (`Pending`),
    /// its first item, or its end.
    next: Option<(BoxStream<'static, T>, Poll<Option<T>>)>,
    waiting: VecDeque<BoxStream<'static, T>>,
}

// Nothing in it is pinned: the streams are boxed, a held item is moved out whole.
impl<T> Unpin for ReadAhead<T> {}

impl<T> Stream for ReadAhead<T> {
    type Item = T;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let this = &mut *self;
        loop {
            if this.next.is_none() {
                this.next = this.waiting.pop_front().map(|s| (s, Poll::Pending));
            }
            if let Some((stream, first @ Poll::Pending)) = &mut this.next {
                *first = stream.as_mut().poll_next(cx);
            }
            let Some(current) = &mut this.current else { return Poll::Ready(None) };
            match current.as_mut().poll_next(cx) {
                Poll::Ready(None) => match this.next.take() {
                    None => {
                        this.current = None;
                        return Poll::Ready(None);
                    }
                    Some((stream, first)) => match first {
                        // Its first item is the next to yield.
                        Poll::Ready(Some(item)) => {
                            this.current = Some(stream);
                            return Poll::Ready(Some(item));
                        }
                        // Ended without an item: the one after it moves up.
                        Poll::Ready(None) => this.current = this.waiting.pop_front(),
                        // Not ready yet: it is polled as the current stream.
                        Poll::Pending => this.current = Some(stream),
                    },
                },
                other => return other,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use std::sync::{Arc, Mutex};

    /// A stream of `items` that logs `(name, "polled")` at every poll.
    fn logged(name: &'static str, items: Vec<u32>, log: Arc<Mutex<Vec<&'static str>>>) -> BoxStream<'static, u32> {
        let mut items = items.into_iter();
        futures::stream::poll_fn(move |_| {
            log.lock().unwrap().push(name);
            Poll::Ready(items.next())
        })
        .boxed()
    }

    #[tokio::test]
    async fn keeps_order_and_starts_the_next_stream_before_the_current_ends() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let streams = vec![
            logged("a", vec![1, 2, 3], Arc::clone(&log)),
            logged("b", vec![], Arc::clone(&log)),
            logged("c", vec![4], Arc::clone(&log)),
            logged("d", vec![5, 6], Arc::clone(&log)),
        ];
        let items: Vec<u32> = read_ahead(streams).collect().await;
        assert_eq!(items, vec![1, 2, 3, 4, 5, 6]);
        let log = log.lock().unwrap();
        let first = |name| log.iter().position(|n| *n == name).unwrap();
        let last = |name| log.iter().rposition(|n| *n == name).unwrap();
        // Each stream is first polled while the one before it is still being drained.
        assert!(first("b") < last("a"), "{log:?}");
        assert!(first("d") < last("c"), "{log:?}");
        // The read-ahead stream is polled only up to its first item before its turn: "d" yields
        // 5 early, and is polled again only for 6 and its end.
        assert_eq!(log.iter().filter(|n| **n == "d").count(), 3, "{log:?}");
    }

    #[tokio::test]
    async fn no_streams_is_an_empty_stream() {
        let items: Vec<u32> = read_ahead::<u32>(Vec::new()).collect().await;
        assert!(items.is_empty());
    }
}
