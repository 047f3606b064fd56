//! A unary call's one message, read whole: at once when it has arrived, else waiting on its
//! client within the deadline and the bytes budget (the module above says how).

use std::pin::Pin;
use std::task::Poll;

use http_body::{Body as _, Frame};
use prost::bytes::{Buf as _, Bytes, BytesMut};
use tonic::Status;
use tonic::body::Body;

use super::{Charge, Intake, PREFIX, Refusal, declared_length};
use crate::inbound::conduct::Conduct;

impl Intake {
    /// The one message of a unary call, at most `limit` bytes, read whole (see the module),
    /// from a connection that conducts itself as `conduct` says (none on a Unix socket).
    pub async fn unary(
        &self,
        mut body: Body,
        limit: usize,
        conduct: Option<&Conduct>,
    ) -> Result<Bytes, Refusal> {
        let mut message = Unary::new(limit);
        // What has arrived already, without waiting.
        loop {
            let next = std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx)));
            match next.await {
                Poll::Ready(next) => {
                    if let Some(done) = message.take(next)? {
                        return Ok(done);
                    }
                }
                Poll::Pending => break,
            }
        }
        let _waiting = self.waiting(conduct)?;
        let mut charge = Charge::default();
        let deadline = tokio::time::sleep(self.timeout);
        tokio::pin!(deadline);
        loop {
            let held = message.needed();
            if held > self.budget {
                return Err(Refusal::Bytes);
            }
            // Until its bytes fit the budget the stream is not read: its client's window
            // stays shut (HTTP/2 flow control), so waiting costs no more than it holds. The
            // room is made once charged, never before: what a client declares costs nothing
            // until the budget has it.
            let next = async {
                charge.wait_for(&self.bytes, held).await?;
                message.reserve();
                Ok(std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await)
            };
            let next = tokio::select! {
                next = next => next?,
                () = &mut deadline => return Err(Refusal::TooSlow(self.timeout)),
            };
            if let Some(done) = message.take(next)? {
                return Ok(done);
            }
        }
    }
}

/// A unary call's message as its frames arrive.
struct Unary {
    limit: usize,
    bytes: BytesMut,
    /// The first frame, kept as is while it is all there is (no copy for a request that
    /// arrives in one frame).
    first: Option<Bytes>,
}

impl Unary {
    fn new(limit: usize) -> Self {
        Self {
            limit,
            bytes: BytesMut::new(),
            first: None,
        }
    }

    fn held(&self) -> usize {
        self.bytes.len() + self.first.as_ref().map_or(0, Bytes::len)
    }

    /// The bytes the message will hold once its room is made (`reserve`): the whole message
    /// once its prefix says how long it is, else what it holds. What it is charged for.
    fn needed(&self) -> usize {
        let whole = declared_length(self.whole()).map(|declared| PREFIX + declared.min(self.limit));
        whole
            .unwrap_or(0)
            .max(self.bytes.capacity())
            .max(self.held())
    }

    /// Makes room for the whole message once its prefix says how long it is (charged
    /// first, as `needed`). One reservation, so that a message held while it trickles in is
    /// never twice its size in memory.
    fn reserve(&mut self) {
        if let Some(declared) = declared_length(self.whole()) {
            if let Some(first) = self.first.take() {
                self.bytes.extend_from_slice(&first);
            }
            let whole = PREFIX + declared.min(self.limit);
            self.bytes.reserve(whole.saturating_sub(self.bytes.len()));
        }
    }

    /// Takes the body's next frame (or its end); the message once it is whole.
    fn take(
        &mut self,
        next: Option<Result<Frame<Bytes>, Status>>,
    ) -> Result<Option<Bytes>, Refusal> {
        let data = match next {
            None => return self.end().map(Some),
            Some(Err(status)) => return Err(Refusal::Broken(status.message().to_owned())),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => data,
                // Trailers from the client end the request like the end of its body.
                Err(_) => return self.end().map(Some),
            },
        };
        match (self.first.take(), self.bytes.is_empty()) {
            (None, true) => self.first = Some(data),
            (Some(first), _) => {
                self.bytes.extend_from_slice(&first);
                self.bytes.extend_from_slice(&data);
            }
            (None, false) => self.bytes.extend_from_slice(&data),
        }
        self.check_length()?;
        // Whole once its declared length is there, whether or not the client has ended its
        // side of the stream yet.
        match declared_length(self.whole()) {
            Some(declared) if self.held() == PREFIX + declared => self.end().map(Some),
            _ => Ok(None),
        }
    }

    fn whole(&self) -> &[u8] {
        self.first.as_deref().unwrap_or(&self.bytes)
    }

    /// Refuses a message declared over the limit, or data past the one message, as soon as
    /// the prefix says so.
    fn check_length(&self) -> Result<(), Refusal> {
        let Some(declared) = declared_length(self.whole()) else {
            return Ok(());
        };
        if declared > self.limit {
            return Err(Refusal::TooLarge {
                found: declared,
                limit: self.limit,
            });
        }
        if self.held() > PREFIX + declared {
            return Err(Refusal::NotOneMessage);
        }
        Ok(())
    }

    fn end(&mut self) -> Result<Bytes, Refusal> {
        let whole = self.whole();
        let declared = declared_length(whole).ok_or(Refusal::NotOneMessage)?;
        if whole.len() != PREFIX + declared {
            return Err(Refusal::NotOneMessage);
        }
        if whole[0] != 0 {
            return Err(Refusal::Compressed);
        }
        let mut all = match self.first.take() {
            Some(first) => first,
            None => std::mem::take(&mut self.bytes).freeze(),
        };
        all.advance(PREFIX);
        Ok(all)
    }
}
