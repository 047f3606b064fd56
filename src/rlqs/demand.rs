//! What a stream's reports say about its demand for a bucket: the time each report covers
//! (Envoy's truncated whole seconds corrected by the arrivals this process saw), and the
//! demand smoothed over reports, replaced outright when the load changes beyond its noise.

use std::time::Duration;

/// How much a report covering `SMOOTHING_PERIOD` weighs against the demand already known;
/// a shorter report weighs less, a longer one more, so that the demand forgets at the same
/// pace per second however often a stream reports.
const SMOOTHING: f64 = 0.7;
const SMOOTHING_PERIOD: Duration = Duration::from_secs(5);

/// Shortest time a report must cover to say something about a rate: Envoy's first report of
/// a new bucket covers none (0), and a rate over a few microseconds is noise.
const MIN_ELAPSED: Duration = Duration::from_millis(10);

/// How far the time between two reports, as this process saw them arrive, may stray from
/// the whole seconds Envoy wrote and still be taken as the true time covered (the network
/// and the two event loops delay each report by a few milliseconds at most).
const ARRIVAL_JITTER: Duration = Duration::from_millis(250);

/// A report whose count strays further than this many standard deviations of a Poisson
/// count from what the known demand predicts (and by more than `SHIFT_FLOOR` of it) is a
/// change of load, not noise: it is taken whole rather than smoothed.
const SHIFT_DEVIATIONS: f64 = 3.0;
const SHIFT_FLOOR: f64 = 0.1;

/// Longest time one report is taken to cover.
const MAX_ELAPSED: Duration = Duration::from_secs(3_600);

/// The time a report covers. Envoy 1.40 writes whole seconds, truncated: a report sent every
/// 5 s covers 4.999 s as often as 5.001 s, and says 4 s for the first, a rate a quarter too
/// high. When the report says whole seconds and the time since the stream's previous report
/// of the bucket arrived fits them (from the seconds written to one second more), that time
/// is the truer one; a report with nanoseconds, or one that does not fit (the first of a
/// subscription, a stream that missed reports), counts as written.
pub(super) fn covered(
    reported: Option<prost_types::Duration>,
    since_last: Option<Duration>,
) -> Duration {
    let Some(reported) = reported else {
        return Duration::ZERO;
    };
    let whole_seconds = reported.nanos == 0;
    let reported = elapsed(reported);
    match since_last {
        Some(measured)
            if whole_seconds
                && !reported.is_zero()
                && measured + ARRIVAL_JITTER >= reported
                && measured < reported + Duration::from_secs(1) + ARRIVAL_JITTER =>
        {
            measured.clamp(reported, reported + Duration::from_secs(1))
        }
        _ => reported,
    }
}

/// The demand after a report of `requests` over `elapsed`. A report under `MIN_ELAPSED` says
/// nothing about the rate. A count within the noise of the known demand moves it by the time
/// the report covers (`SMOOTHING` for `SMOOTHING_PERIOD`); a count beyond it is a change of
/// load and replaces it, so that streams whose load changed alike are given alike at the
/// first report after the change, whatever they offered before.
pub(super) fn smoothed(known: Option<f64>, requests: u64, elapsed: Duration) -> Option<f64> {
    if elapsed < MIN_ELAPSED {
        return known;
    }
    let seconds = elapsed.as_secs_f64();
    let rate = requests as f64 / seconds;
    let Some(known) = known else {
        return Some(rate);
    };
    let expected = known * seconds;
    let noise = (SHIFT_DEVIATIONS * expected.max(1.0).sqrt()).max(SHIFT_FLOOR * expected);
    if (requests as f64 - expected).abs() > noise {
        return Some(rate);
    }
    let weight = 1.0 - (1.0 - SMOOTHING).powf(seconds / SMOOTHING_PERIOD.as_secs_f64());
    Some(weight * rate + (1.0 - weight) * known)
}

/// The time a report covers, at most `MAX_ELAPSED` (anything longer says nothing more about
/// a rate, and would overflow the arithmetic that uses it); negative is zero.
fn elapsed(duration: prost_types::Duration) -> Duration {
    let seconds = u64::try_from(duration.seconds).unwrap_or(0);
    let nanos = u32::try_from(duration.nanos).unwrap_or(0).min(999_999_999);
    Duration::new(seconds.min(MAX_ELAPSED.as_secs()), nanos).min(MAX_ELAPSED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_counts_by_its_real_duration_and_an_empty_one_not_at_all() {
        let ms = Duration::from_millis;
        // 20 requests in 200 ms: 100 a second.
        assert_eq!(smoothed(None, 20, ms(200)), Some(100.0));
        let nanos = elapsed(prost_types::Duration {
            seconds: 0,
            nanos: 200_000_000,
        });
        assert_eq!(smoothed(None, 20, nanos), Some(100.0));
        // No time (a new bucket's first report), or too little: the demand stays as known.
        assert_eq!(smoothed(None, 20, Duration::ZERO), None);
        assert_eq!(smoothed(Some(7.0), 20, ms(1)), Some(7.0));
        // Within the noise, a report of the smoothing period weighs SMOOTHING, a shorter one
        // less.
        let five = smoothed(Some(100.0), 520, Duration::from_secs(5)).unwrap();
        assert!((five - 102.8).abs() < 1e-9, "{five}");
        let short = smoothed(Some(100.0), 11, ms(100)).unwrap();
        assert!(
            short > 100.0 && short < 0.7 * 110.0 + 0.3 * 100.0,
            "{short}"
        );
    }

    #[test]
    fn a_change_of_load_beyond_the_noise_replaces_the_demand() {
        let five = Duration::from_secs(5);
        // 200/s, then 50/s: the first report after the change says it all, whatever the
        // stream offered before; so do two streams that both fell to 50/s.
        assert_eq!(smoothed(Some(200.0), 250, five), Some(50.0));
        assert_eq!(smoothed(Some(100.0), 250, five), Some(50.0));
        // 3 standard deviations of 500 requests is 67, 10% of it 50: 560 is noise, 570 not.
        assert_eq!(smoothed(Some(100.0), 570, five), Some(114.0));
        let noise = smoothed(Some(100.0), 560, five).unwrap();
        assert!((noise - 108.4).abs() < 1e-9, "{noise}");
        // At high rates the floor of 10% holds the noise band open.
        let busy = smoothed(Some(10_000.0), 52_000, five).unwrap();
        assert!((busy - 10_280.0).abs() < 1e-6, "{busy}");
    }

    #[test]
    fn whole_seconds_truncated_by_envoy_count_as_the_time_between_reports() {
        let whole = |seconds| Some(prost_types::Duration { seconds, nanos: 0 });
        let ms = Duration::from_millis;
        // Envoy wrote 4 s for a report 4.998 s after the previous one: 4.998 s it covered.
        assert_eq!(covered(whole(4), Some(ms(4_998))), ms(4_998));
        assert_eq!(covered(whole(5), Some(ms(5_003))), ms(5_003));
        // A few milliseconds of arrival jitter stay within the seconds written.
        assert_eq!(covered(whole(5), Some(ms(4_990))), ms(5_000));
        // Nanoseconds written, no previous report, or times that do not fit: as written.
        let precise = Some(prost_types::Duration {
            seconds: 4,
            nanos: 500_000_000,
        });
        assert_eq!(covered(precise, Some(ms(4_998))), ms(4_500));
        assert_eq!(covered(whole(4), None), ms(4_000));
        assert_eq!(covered(whole(5), Some(ms(15_000))), ms(5_000));
        assert_eq!(covered(whole(0), Some(ms(700))), Duration::ZERO);
        assert_eq!(covered(None, Some(ms(5_000))), Duration::ZERO);
    }
}
