//! The requests a bench run cycles through, built from its flags and encoded once where that
//! fits in a few megabytes.

use prost::bytes::Bytes;

use super::codec::encoded;
use crate::pb::{self, rate_limit_descriptor as desc};

/// What each request of a run holds: flags of `tollgate bench`.
#[derive(Debug, clap::Args)]
pub struct RequestShape {
    /// Rate-limit domain of every request.
    #[arg(long, env = "TOLLGATE_BENCH_DOMAIN", default_value = "bench")]
    pub domain: String,

    /// Descriptor entry key.
    #[arg(long, env = "TOLLGATE_BENCH_KEY", default_value = "user")]
    pub key: String,

    /// Distinct values cycled through (distinct counters).
    #[arg(long, env = "TOLLGATE_BENCH_VALUES", default_value_t = 10_000)]
    pub values: usize,

    /// Descriptors per request.
    #[arg(long, env = "TOLLGATE_BENCH_DESCRIPTORS", default_value_t = 1)]
    pub descriptors: usize,

    /// Request-level hits_addend (0 means 1).
    #[arg(long, env = "TOLLGATE_BENCH_HITS", default_value_t = 0)]
    pub hits: u32,
}

/// The requests a run cycles through: one per distinct value, each with `descriptors`
/// descriptors on `key` (values `<n>` or `<n>-<j>`, so every descriptor has its own counter).
/// Up to `PRE_ENCODED` of them are encoded once, before the run, so that the load generator
/// spends no CPU encoding while it shares the machine with the server; past that (a run over
/// millions of counters) each is encoded when sent, so that memory stays flat whatever
/// `--values` says.
pub struct Requests {
    domain: String,
    key: String,
    descriptors: usize,
    hits: u32,
    values: usize,
    encoded: Vec<Bytes>,
}

/// Most requests encoded before a run (a few megabytes).
const PRE_ENCODED: usize = 100_000;

impl Requests {
    pub fn new(args: &RequestShape) -> Self {
        let mut requests = Self {
            domain: args.domain.clone(),
            key: args.key.clone(),
            descriptors: args.descriptors.max(1),
            hits: args.hits,
            values: args.values.max(1),
            encoded: Vec::new(),
        };
        if requests.values <= PRE_ENCODED {
            requests.encoded = (0..requests.values)
                .map(|value| encoded(&requests.request(value)))
                .collect();
        }
        requests
    }

    /// How many distinct requests there are.
    pub fn len(&self) -> usize {
        self.values
    }

    pub fn is_empty(&self) -> bool {
        self.values == 0
    }

    /// The `index`-th request, encoded (indexes wrap around).
    pub fn get(&self, index: usize) -> Bytes {
        let index = index % self.values;
        match self.encoded.get(index) {
            Some(bytes) => bytes.clone(),
            None => encoded(&self.request(index)),
        }
    }

    /// The `index`-th request as the body of a unary gRPC call: uncompressed, its length,
    /// then the message.
    pub fn grpc_body(&self, index: usize) -> Bytes {
        super::hostile::grpc_message(&self.request(index % self.values))
    }

    /// The request for one value.
    pub fn request(&self, value: usize) -> pb::RateLimitRequest {
        pb::RateLimitRequest {
            domain: self.domain.clone(),
            descriptors: (0..self.descriptors)
                .map(|j| pb::RateLimitDescriptor {
                    entries: vec![desc::Entry {
                        key: self.key.clone(),
                        value: if self.descriptors > 1 {
                            format!("{value}-{j}")
                        } else {
                            value.to_string()
                        },
                    }],
                    ..Default::default()
                })
                .collect(),
            hits_addend: self.hits,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use clap::Parser as _;

    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        shape: RequestShape,
    }

    fn requests(flags: &[&str]) -> Requests {
        let flags = Flags::try_parse_from(std::iter::once("bench").chain(flags.iter().copied()));
        Requests::new(&flags.unwrap().shape)
    }

    #[test]
    fn requests_are_the_same_encoded_up_front_or_when_sent() {
        let few = requests(&["--values", "3", "--descriptors", "2"]);
        assert_eq!(few.len(), 3);
        assert_eq!(few.encoded.len(), 3);
        assert_eq!(few.get(4), few.get(1));
        assert_eq!(few.get(1), encoded(&few.request(1)));
        let value = &few.request(1).descriptors[1].entries[0];
        assert_eq!((value.key.as_str(), value.value.as_str()), ("user", "1-1"));
    }

    #[test]
    fn a_grpc_body_is_the_message_after_its_length() {
        let one = requests(&["--domain", "load", "--values", "2"]);
        let body = one.grpc_body(1);
        assert_eq!(
            body[..5],
            [0, 0, 0, 0, u8::try_from(body.len() - 5).unwrap()]
        );
        assert_eq!(body[5..], one.get(1));
        let decoded = <pb::RateLimitRequest as prost::Message>::decode(&body[5..]).unwrap();
        assert_eq!(decoded.domain, "load");
        assert_eq!(decoded.descriptors[0].entries[0].value, "1");
    }

    #[test]
    fn millions_of_values_are_encoded_when_sent_not_before() {
        let many = requests(&["--values", "50000000"]);
        assert!(many.encoded.is_empty());
        let last = <pb::RateLimitRequest as prost::Message>::decode(many.get(49_999_999)).unwrap();
        assert_eq!(last.descriptors[0].entries[0].value, "49999999");
    }
}
