//! A request body of messages (an RLQS stream), metered message by message: each must arrive
//! whole within the deadline from its first byte, its bytes charged to the budget meanwhile;
//! between messages it holds nothing and may wait as long as its client likes.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http_body::Frame;
use prost::bytes::Bytes;
use tokio::time::{Instant, Sleep};
use tonic::Status;
use tonic::body::Body;

use super::{Charge, Intake, PREFIX, Refusal, declared_length};

impl Intake {
    /// `body`, a stream of messages, held to the bounds message by message.
    pub fn metered(self: &Arc<Self>, body: Body) -> Metered {
        Metered {
            body,
            intake: Arc::clone(self),
            framing: Framing::default(),
            charge: Charge::default(),
            deadline: None,
            failed: false,
        }
    }
}

/// Where a stream of messages stands: bytes of the message under way (prefix included), and
/// how long it is once its prefix is known.
#[derive(Default)]
struct Framing {
    prefix: Vec<u8>,
    /// Bytes of the current message's body still to come, once its prefix is whole.
    remaining: Option<usize>,
    /// Bytes of the current message seen so far.
    seen: usize,
}

impl Framing {
    /// Follows `data` through the messages: whether a message ended in it, and the bytes of
    /// the message still under way at its end (0: it ends between messages).
    fn follow(&mut self, mut data: &[u8]) -> (bool, usize) {
        let mut ended = false;
        while !data.is_empty() {
            let take = match self.remaining {
                None => (PREFIX - self.prefix.len()).min(data.len()),
                Some(remaining) => remaining.min(data.len()),
            };
            match self.remaining {
                None => {
                    self.prefix.extend_from_slice(&data[..take]);
                    self.remaining = declared_length(&self.prefix);
                }
                Some(remaining) => self.remaining = Some(remaining - take),
            }
            self.seen += take;
            data = &data[take..];
            if self.remaining == Some(0) {
                *self = Framing::default();
                ended = true;
            }
        }
        (ended, self.seen)
    }
}

/// A request body of messages (an RLQS stream), failing with the refusal's status when a
/// message does not arrive whole within the deadline from its first byte, or its bytes do not
/// fit the budget. Between messages it holds nothing and waits as long as the client likes.
pub struct Metered {
    body: Body,
    intake: Arc<Intake>,
    framing: Framing,
    charge: Charge,
    deadline: Option<Pin<Box<Sleep>>>,
    failed: bool,
}

impl Metered {
    fn fail(&mut self, refusal: Refusal) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        self.failed = true;
        self.charge.release();
        self.deadline = None;
        Poll::Ready(Some(Err(refusal.into())))
    }
}

impl http_body::Body for Metered {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        if this.failed {
            return Poll::Ready(None);
        }
        let next = match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Pending => {
                if let Some(deadline) = &mut this.deadline {
                    ready!(deadline.as_mut().poll(cx));
                    let timeout = this.intake.timeout;
                    return this.fail(Refusal::TooSlow(timeout));
                }
                return Poll::Pending;
            }
            Poll::Ready(next) => next,
        };
        if let Some(Ok(frame)) = &next
            && let Some(data) = frame.data_ref()
        {
            let (ended, under_way) = this.framing.follow(data);
            if ended {
                this.charge.release();
                this.deadline = None;
            }
            if under_way > 0 {
                if this.deadline.is_none() {
                    let at = Instant::now() + this.intake.timeout;
                    this.deadline = Some(Box::pin(tokio::time::sleep_until(at)));
                }
                if let Err(refusal) = this.charge.to(&this.intake.bytes, under_way) {
                    return this.fail(refusal);
                }
            }
        }
        Poll::Ready(next)
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
