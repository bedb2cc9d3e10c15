//! A watch stream that lags: while the plan's stale window is open, each event is held back until it closes, as
//! a watch cache behind etcd delivers it late. Sieve found most of its stale-state bugs this way.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame};

use super::{BoxError, DynBody, Shared};

/// How often a held event checks whether the window has closed (a write closes it early).
const RECHECK: Duration = Duration::from_millis(50);

pub(super) struct LaggingWatch {
    inner: Box<DynBody>,
    shared: Arc<Shared>,
    uri: String,
    held: Option<Frame<Bytes>>,
    recheck: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl LaggingWatch {
    pub(super) fn new(inner: Box<DynBody>, shared: Arc<Shared>, uri: String) -> Self {
        Self {
            inner,
            shared,
            uri,
            held: None,
            recheck: None,
        }
    }
}

impl Body for LaggingWatch {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.held.is_none() {
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) if this.shared.stale_window_open() => {
                    eprintln!("{{\"chaos\":\"stale read of watch {}\"}}", this.uri);
                    this.held = Some(frame);
                }
                other => return other,
            }
        }
        while this.shared.stale_window_open() {
            let recheck = this
                .recheck
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(RECHECK)));
            if recheck.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            this.recheck = None;
        }
        Poll::Ready(this.held.take().map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_none() && self.inner.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    fn one_event() -> Box<DynBody> {
        let body = http_body_util::Full::new(Bytes::from_static(b"{\"type\":\"MODIFIED\"}\n"))
            .map_err(|never| -> BoxError { match never {} });
        Box::new(body)
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_event_waits_while_the_window_is_open_and_flows_once_a_write_closes_it() {
        let shared = Arc::new(Shared::default());
        shared.set_window(Some(std::time::Instant::now() + Duration::from_secs(3600)));
        let mut watch = LaggingWatch::new(one_event(), shared.clone(), "/watch".into());

        let early = tokio::time::timeout(Duration::from_secs(10), watch.frame()).await;
        assert!(
            early.is_err(),
            "the event was delivered while the window was open"
        );

        shared.set_window(None);
        let frame = watch.frame().await.expect("the held event").unwrap();
        assert_eq!(frame.into_data().unwrap(), "{\"type\":\"MODIFIED\"}\n");
        assert!(watch.frame().await.is_none(), "then the stream ends");
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_outside_the_window_is_not_held() {
        let mut watch = LaggingWatch::new(one_event(), Arc::default(), "/watch".into());
        let frame = tokio::time::timeout(Duration::from_millis(1), watch.frame()).await;
        assert!(frame.is_ok_and(|f| f.is_some()));
    }
}
