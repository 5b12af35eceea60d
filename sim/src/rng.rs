//! A small deterministic generator (SplitMix64): the same seed gives the same run on every
//! platform and every version of every dependency.

#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self { state: seed ^ 0x9E37_79B9_7F4A_7C15 }
    }

    /// A generator for a sub-stream, so that adding draws in one part of a model does not
    /// shift another part's.
    pub fn fork(&mut self, stream: u64) -> Self {
        Self::new(self.next_u64() ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03))
    }

    /// This generator set apart by `name` (FNV-1a): the span and trace ids of two scenarios
    /// run with the same seed differ, as a real exporter's random ids do, so that runs of
    /// several scenarios sent to one service do not join each other's spans.
    pub fn named(self, name: &str) -> Self {
        let hash = name
            .bytes()
            .fold(0xCBF2_9CE4_8422_2325u64, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01B3));
        Self { state: self.state ^ hash }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[low, high]`.
    pub fn range(&mut self, low: i64, high: i64) -> i64 {
        if high <= low {
            return low;
        }
        let span = (high - low) as u64 + 1;
        low + (self.next_u64() % span) as i64
    }

    pub fn chance(&mut self, probability: f64) -> bool {
        self.unit() < probability
    }

    /// Exponentially distributed with the given mean (inter-arrival times of a Poisson process).
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[(self.next_u64() % items.len() as u64) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_ranges_hold() {
        let mut first = Rng::new(7);
        let mut second = Rng::new(7);
        for _ in 0..1000 {
            assert_eq!(first.next_u64(), second.next_u64());
            let value = first.range(-3, 3);
            second.range(-3, 3);
            assert!((-3..=3).contains(&value));
            let unit = first.unit();
            second.unit();
            assert!((0.0..1.0).contains(&unit));
        }
        assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
    }
}
