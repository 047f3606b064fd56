//! Dividing one bucket's global rate among the streams that report it: in proportion to each
//! stream's demand, with a floor so that a new or quiet stream is never starved, and never
//! more in total than the rate. A pure function: every replica that sees the same demands
//! computes the same split.

/// The shares of `rate` (requests per second) for streams with these `demands` (requests per
/// second, smoothed), in the same order.
///
/// Each share is at least `floor` of an equal share (`rate / n × floor`); what the floors
/// leave is divided in proportion to demand among the streams above their floor. With no
/// demand at all, the split is equal.
pub fn split(rate: f64, demands: &[f64], floor: f64) -> Vec<f64> {
    let count = demands.len();
    if count == 0 || rate <= 0.0 {
        return vec![0.0; count];
    }
    let equal = rate / count as f64;
    let demands: Vec<f64> = demands.iter().map(|d| d.max(0.0)).collect();
    if demands.iter().sum::<f64>() <= 0.0 {
        return vec![equal; count];
    }
    let floor = equal * floor.clamp(0.0, 1.0);
    // Water-filling: a stream whose proportional share falls under the floor is held at the
    // floor, which leaves less for the others; repeat until no more streams fall under. Each
    // round holds at least one more stream, so at most `count` rounds.
    let mut held = vec![false; count];
    loop {
        let held_count = held.iter().filter(|&&h| h).count();
        let left = rate - floor * held_count as f64;
        let free_demand: f64 = demands
            .iter()
            .zip(&held)
            .filter(|(_, h)| !**h)
            .map(|(d, _)| d)
            .sum();
        let share = |demand: f64| {
            if free_demand > 0.0 {
                left * demand / free_demand
            } else {
                left / (count - held_count) as f64
            }
        };
        let mut changed = false;
        for (index, &demand) in demands.iter().enumerate() {
            if !held[index] && share(demand) < floor {
                held[index] = true;
                changed = true;
            }
        }
        if !changed {
            return demands
                .iter()
                .zip(&held)
                .map(|(&demand, &h)| if h { floor } else { share(demand) })
                .collect();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rounded(shares: Vec<f64>) -> Vec<f64> {
        shares
            .into_iter()
            .map(|s| (s * 100.0).round() / 100.0)
            .collect()
    }

    #[test]
    fn shares_follow_demand() {
        assert_eq!(
            rounded(split(100.0, &[50.0, 100.0, 200.0], 0.1)),
            [14.29, 28.57, 57.14]
        );
        assert_eq!(
            rounded(split(100.0, &[200.0, 50.0, 50.0], 0.1)),
            [66.67, 16.67, 16.67]
        );
    }

    #[test]
    fn a_quiet_stream_gets_its_floor_and_the_total_holds() {
        // Equal share 50, floor 10% of it: 5; the busy stream gets the other 95.
        assert_eq!(rounded(split(100.0, &[0.0, 1000.0], 0.1)), [5.0, 95.0]);
        // Two quiet streams among three: both held, the rest to the busy one.
        let shares = split(90.0, &[1.0, 0.5, 10_000.0], 0.3);
        assert_eq!(rounded(shares.clone()), [9.0, 9.0, 72.0]);
        assert!((shares.iter().sum::<f64>() - 90.0).abs() < 1e-9);
    }

    #[test]
    fn no_demand_splits_equally_and_nothing_splits_nothing() {
        assert_eq!(
            rounded(split(90.0, &[0.0, 0.0, 0.0], 0.1)),
            [30.0, 30.0, 30.0]
        );
        assert_eq!(split(0.0, &[5.0, 5.0], 0.1), [0.0, 0.0]);
        assert!(split(10.0, &[], 0.1).is_empty());
    }

    #[test]
    fn a_floor_of_one_is_an_equal_split() {
        assert_eq!(
            rounded(split(60.0, &[1.0, 2.0, 300.0], 1.0)),
            [20.0, 20.0, 20.0]
        );
    }
}
