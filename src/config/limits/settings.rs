//! A limit's settings beside its algorithm: `refunds`, `charges` and `lease`, each accepted
//! only where it applies.

use serde_saphyr::Spanned;

use super::Spec;
use crate::algorithm::{Algorithm, Anchor, leased};
use crate::clock::Micros;
use crate::config::error::ConfigError;
use crate::limit::{Charges, Lease, Limit, Refunds};

impl Spec<'_> {
    /// The setting `field` names, written as one of `names`.
    fn one_of<T: Copy>(
        &self,
        field: &str,
        written: &Spanned<String>,
        names: &[(&str, T)],
    ) -> Result<T, ConfigError> {
        match names.iter().find(|(name, _)| *name == written.value) {
            Some((_, parsed)) => Ok(*parsed),
            None => {
                let names: Vec<&str> = names.iter().map(|(name, _)| *name).collect();
                Err(self.error(
                    written.referenced.line(),
                    field,
                    format!(
                        "expected one of {}, got {:?}",
                        names.join("|"),
                        written.value
                    ),
                ))
            }
        }
    }

    /// `refunds`: allow or refuse a client's refunds on this rule.
    pub(super) fn refunds(&self) -> Result<Refunds, ConfigError> {
        match &self.raw.refunds {
            None => Ok(Refunds::AsConfigured),
            Some(refunds) => self.one_of("refunds", refunds, &Refunds::NAMES),
        }
    }

    /// `charges`: a concurrency limit's takes are reservations (a refused take holds
    /// nothing, and the end of a stream gives back what it took), and a limit that reports
    /// what it reserved needs the name it reports it under.
    pub(super) fn charges(&self, limit: &Limit) -> Result<Charges, ConfigError> {
        let charges = match &self.raw.charges {
            None => Charges::AsConfigured,
            Some(charges) => {
                let parsed = self.one_of("charges", charges, &Charges::NAMES)?;
                if limit.algorithm == Algorithm::Concurrency && parsed != Charges::Reserve {
                    return Err(self.error(
                        charges.referenced.line(),
                        "charges",
                        "a concurrency limit's takes are reservations: leave charges out, or write reserve",
                    ));
                }
                parsed
            }
        };
        let reserves = charges == Charges::Reserve || limit.algorithm == Algorithm::Concurrency;
        if reserves && limit.name.is_none() {
            let (field, why) = match limit.algorithm {
                Algorithm::Concurrency => ("algorithm", "a concurrency limit"),
                _ => ("charges", "charges: reserve"),
            };
            let line = match field {
                "algorithm" => self.raw.algorithm.as_ref(),
                _ => self.raw.charges.as_ref(),
            }
            .map_or(self.line, |spanned| spanned.referenced.line());
            return Err(self.error(
                line,
                field,
                format!(
                    "{why} needs a name: the answer reports what it reserved under it (dynamic metadata reserved.<name>), which the end of the stream gives back"
                ),
            ));
        }
        Ok(charges)
    }

    /// `lease`: only a fixed window aligned on the epoch (its budget is one count per window)
    /// and a bucket with a burst worth splitting hand out their budget exactly
    /// (algorithm::leased); a sliding window's or a sliding log's depends on each hit's
    /// instant.
    pub(super) fn lease(&self, limit: &Limit) -> Result<Lease, ConfigError> {
        let Some(lease) = &self.raw.lease else {
            return Ok(Lease::AsConfigured);
        };
        let line = lease.referenced.line();
        let parsed = self.one_of("lease", lease, &Lease::NAMES)?;
        if parsed != Lease::Auto {
            return Ok(parsed);
        }
        let params = limit.params();
        if leased::is_bucket(&params) {
            if leased::slice_life(&params, Micros::MAX).is_none() {
                return Err(self.error(
                    line,
                    "lease",
                    format!(
                        "a {} limit can be leased only with a burst of at least 2 that takes at least {} ms to refill (a slice lives half of that)",
                        limit.algorithm.name(),
                        leased::SHORTEST_LIFE / 500
                    ),
                ));
            }
            return Ok(parsed);
        }
        let window = limit.algorithm
            == (Algorithm::FixedWindow {
                anchor: Anchor::Epoch,
            });
        if !window {
            return Err(self.error(
                line,
                "lease",
                format!(
                    "only a fixed_window limit aligned on the epoch, a token_bucket or a gcra limit can be leased, not {}",
                    limit.algorithm.name()
                ),
            ));
        }
        Ok(parsed)
    }
}
