//! The statistics of a comparison: the Mann-Whitney U test (one-sided, ties corrected,
//! normal approximation) and the Benjamini-Hochberg procedure over many such tests.

/// The one-sided p-value of the Mann-Whitney U test that `after`'s values tend to be larger
/// than `before`'s. Each side is given as its values other than zero and its count of
/// values in all (`n`): the zeros are one tie group (a function absent from most profiles
/// has mostly zero shares, and they are never listed). The normal approximation with the
/// tie correction and a continuity correction; 1 when every value ties, or a side is empty.
pub fn mann_whitney_greater(before: &[f32], n_before: usize, after: &[f32], n_after: usize) -> f64 {
    let (na, nb) = (n_before as f64, n_after as f64);
    if n_before == 0 || n_after == 0 {
        return 1.0;
    }
    let listed = |values: &[f32]| values.iter().filter(|v| **v != 0.0 && !v.is_nan()).count();
    let zeros = (
        n_before.saturating_sub(listed(before)),
        n_after.saturating_sub(listed(after)),
    );
    // (value, from after), zeros as one group of their own.
    let mut all: Vec<(f32, bool)> = before
        .iter()
        .map(|&v| (v, false))
        .chain(after.iter().map(|&v| (v, true)))
        .filter(|(v, _)| *v != 0.0 && !v.is_nan())
        .collect();
    all.sort_unstable_by(|x, y| x.0.total_cmp(&y.0));
    let n = na + nb;
    let (mut rank_sum_after, mut ties) = (0.0f64, 0.0f64);
    let mut next_rank = 1.0f64;
    let mut group = |size_before: usize, size_after: usize, next_rank: &mut f64| {
        let t = (size_before + size_after) as f64;
        if t == 0.0 {
            return;
        }
        let mid = *next_rank + (t - 1.0) / 2.0;
        rank_sum_after += size_after as f64 * mid;
        ties += t * t * t - t;
        *next_rank += t;
    };
    let mut zeros_done = false;
    let mut i = 0;
    while i < all.len() {
        let v = all[i].0;
        if !zeros_done && v > 0.0 {
            group(zeros.0, zeros.1, &mut next_rank);
            zeros_done = true;
        }
        let mut j = i;
        let mut from_after = 0;
        while j < all.len() && all[j].0 == v {
            from_after += usize::from(all[j].1);
            j += 1;
        }
        group(j - i - from_after, from_after, &mut next_rank);
        i = j;
    }
    if !zeros_done {
        group(zeros.0, zeros.1, &mut next_rank);
    }
    let u = rank_sum_after - nb * (nb + 1.0) / 2.0;
    let mean = na * nb / 2.0;
    let variance = na * nb / 12.0 * ((n + 1.0) - ties / (n * (n - 1.0)).max(1.0));
    if variance <= 0.0 {
        return 1.0;
    }
    let z = (u - mean - 0.5) / variance.sqrt();
    0.5 * erfc(z / std::f64::consts::SQRT_2)
}

/// Which of `p_values` the Benjamini-Hochberg procedure rejects at false discovery rate
/// `q`, `m` tests in all (tests not listed count with a p-value of 1: they are never
/// rejected but make the others' bar higher).
pub fn benjamini_hochberg(p_values: &[f64], m: usize, q: f64) -> Vec<bool> {
    let m = m.max(p_values.len()).max(1) as f64;
    let mut order: Vec<usize> = (0..p_values.len()).collect();
    order.sort_unstable_by(|&a, &b| p_values[a].total_cmp(&p_values[b]));
    let cut = order
        .iter()
        .enumerate()
        .filter(|&(k, &i)| p_values[i] <= (k + 1) as f64 / m * q)
        .map(|(k, _)| k + 1)
        .max()
        .unwrap_or(0);
    let mut rejected = vec![false; p_values.len()];
    for &i in &order[..cut] {
        rejected[i] = true;
    }
    rejected
}

/// The complementary error function (W. J. Cody's rational Chebyshev fit as given in
/// Numerical Recipes, `erfcc`: fractional error under 1.2e-7 everywhere).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 { r } else { 2.0 - r }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erfc_matches_known_values() {
        for (x, want) in [
            (0.0, 1.0),
            (0.5, 0.479_500_122),
            (1.0, 0.157_299_207),
            (2.0, 0.004_677_735),
            (-1.0, 1.842_700_793),
        ] {
            assert!((erfc(x) - want).abs() < 1e-6, "erfc({x})");
        }
    }

    #[test]
    fn separated_samples_are_significant_and_equal_ones_are_not() {
        let low: Vec<f32> = (0..20).map(|i| 0.1 + i as f32 * 0.001).collect();
        let high: Vec<f32> = (0..20).map(|i| 0.5 + i as f32 * 0.001).collect();
        assert!(mann_whitney_greater(&low, 20, &high, 20) < 1e-6);
        // The other direction: not greater.
        assert!(mann_whitney_greater(&high, 20, &low, 20) > 0.99);
        // The same values on both sides: U at its mean, p about a half.
        let same = mann_whitney_greater(&low, 20, &low, 20);
        assert!((0.4..0.6).contains(&same), "{same}");
        // All tied (zeros only): nothing to say.
        assert_eq!(mann_whitney_greater(&[], 10, &[], 10), 1.0);
    }

    #[test]
    fn zeros_count_as_one_tie_group() {
        // Listing the zeros or leaving them to `n` gives the same answer.
        let before = [0.0, 0.0, 0.2, 0.1, 0.0];
        let after = [0.3, 0.0, 0.4, 0.5];
        let listed = mann_whitney_greater(&before, 5, &after, 4);
        let sparse = mann_whitney_greater(&[0.2, 0.1], 5, &[0.3, 0.4, 0.5], 4);
        assert!((listed - sparse).abs() < 1e-12, "{listed} vs {sparse}");
        // U by hand: after's ranks among 9 with 4 zeros (ranks 1-4, mid 2.5): 2.5, 7, 8, 9
        // → R = 26.5, U = 26.5 - 10 = 16.5 of 20; mean 10.
        let ties = 4.0f64.powi(3) - 4.0;
        let var = 20.0 / 12.0 * (10.0 - ties / 72.0);
        let z = (16.5 - 10.0 - 0.5) / var.sqrt();
        assert!((listed - 0.5 * erfc(z / std::f64::consts::SQRT_2)).abs() < 1e-12);
    }

    #[test]
    fn benjamini_hochberg_rejects_up_to_the_largest_passing_rank() {
        // m = 4, q = 0.05: bars 0.0125, 0.025, 0.0375, 0.05.
        let p = [0.01, 0.001, 0.03, 0.2];
        assert_eq!(benjamini_hochberg(&p, 4, 0.05), [true, true, true, false]);
        // The same p-values among 100 tests: bars 0.0005, 0.001, ...: none passes.
        assert_eq!(
            benjamini_hochberg(&p, 100, 0.05),
            [false, false, false, false]
        );
        assert_eq!(
            benjamini_hochberg(&[0.0001], 100, 0.05),
            [true],
            "0.0001 <= 1/100 * 0.05"
        );
    }
}
