//! Small deterministic random generators, the same on every machine and with no dependency:
//! xorshift64* ([`Rng`]) for the simulator and generated workloads, splitmix64 ([`SplitMix64`],
//! [`mix64`], [`unit`]) for jitter, ids and fault picks.

/// The splitmix64 increment (2^64 / φ, odd).
pub const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// splitmix64's output function: a bijection on u64.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The first number of the splitmix64 sequence started at `seed`.
pub fn splitmix64(seed: u64) -> u64 {
    mix64(seed.wrapping_add(GAMMA))
}

/// The top 53 bits of `bits` as a share in `[0, 1)`.
pub fn to_unit(bits: u64) -> f64 {
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// A number in `[0, 1)` from a seed (the first splitmix64 number): jitter needs no better
/// randomness.
pub fn unit(seed: u64) -> f64 {
    to_unit(splitmix64(seed))
}

/// A splitmix64 sequence: each step adds [`GAMMA`] to the state and returns [`mix64`] of it.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// The sequence whose state starts at `state` (used as given).
    pub fn new(state: u64) -> SplitMix64 {
        SplitMix64(state)
    }

    /// Number `index` (from 0) of the sequence started at `state`, without stepping through it.
    pub fn at(state: u64, index: u64) -> u64 {
        mix64(state.wrapping_add(index.wrapping_add(1).wrapping_mul(GAMMA)))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GAMMA);
        mix64(self.0)
    }

    /// The next number as a share in `[0, 1)`.
    pub fn next_unit(&mut self) -> f64 {
        to_unit(self.next_u64())
    }
}

/// A small deterministic random generator (xorshift64*).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(GAMMA) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The numbers below were produced by the generators' earlier copies (xorshift64* in the core's
    // fixtures, splitmix64 in retry, the memory provider, the Alibaba provider and kube-sim):
    // workloads, ids and simulations depend on them staying the same.

    #[test]
    fn xorshift_sequences_are_pinned() {
        let pinned: [(u64, [u64; 3], [u64; 4]); 3] = [
            (
                0,
                [
                    0x47E4_CE4B_896C_DD1D,
                    0xABCF_A6A8_E079_651D,
                    0xB9D1_0D8F_EB73_1F57,
                ],
                [5, 7, 3, 3],
            ),
            (
                1,
                [
                    0x0D83_B3E2_9A21_487A,
                    0x54C4_4C79_F1FE_9D67,
                    0xA845_F342_007A_0E78,
                ],
                [0, 7, 2, 7],
            ),
            (
                42,
                [
                    0x7C3D_3DA7_30E9_FD2B,
                    0xBC66_74D0_9F2B_33FC,
                    0xC1CD_CC7E_2428_8D6F,
                ],
                [5, 4, 1, 5],
            ),
        ];
        for (seed, words, below) in pinned {
            let mut r = Rng::new(seed);
            assert_eq!(
                [r.next_u64(), r.next_u64(), r.next_u64()],
                words,
                "seed {seed}"
            );
            let mut r = Rng::new(seed);
            assert_eq!(
                [r.below(10), r.below(10), r.below(10), r.below(10)],
                below,
                "seed {seed}"
            );
        }
    }

    #[test]
    fn splitmix_numbers_are_pinned() {
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(splitmix64(1), 0x910A_2DEC_8902_5CC1);
        assert_eq!(splitmix64(42), 0xBDD7_3226_2FEB_6E95);
        assert_eq!(unit(0), 0.8833108082136426);
        assert_eq!(unit(1), 0.5665615751722809);
        assert_eq!(unit(42), 0.7415648787718233);

        let mut s = SplitMix64::new(1);
        assert_eq!(
            [s.next_u64(), s.next_u64(), s.next_u64()],
            [
                0x910A_2DEC_8902_5CC1,
                0xBEEB_8DA1_658E_EC67,
                0xF893_A2EE_FB32_555E
            ]
        );
        let mut s = SplitMix64::new(42 | 1);
        assert_eq!(
            [s.next_u64(), s.next_u64(), s.next_u64()],
            [
                0xBA69_EC90_EB4F_EF88,
                0x9CDE_9885_2E60_034B,
                0x6EC6_24AA_8568_5867
            ]
        );
        let mut s = SplitMix64::new(0);
        assert_eq!(
            [s.next_unit(), s.next_unit(), s.next_unit()],
            [
                0.8833108082136426,
                0.43152799704850997,
                0.026433771592597743
            ]
        );
        let mut s = SplitMix64::new(42);
        assert_eq!(
            [s.next_unit(), s.next_unit(), s.next_unit()],
            [0.7415648787718233, 0.1599103928769201, 0.27860113025513866]
        );
        let mut s = SplitMix64::new(1 ^ 0xD1B5_4A32_D192_ED03);
        assert_eq!(
            [s.next_u64(), s.next_u64()],
            [0x4841_6938_EF0D_CF6F, 0x8596_845E_7EA8_8CA1]
        );

        assert_eq!(SplitMix64::at(0, 0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(SplitMix64::at(0, 1), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(SplitMix64::at(42, 1), 0x28EF_E333_B266_F103);
    }

    #[test]
    fn units_are_in_range() {
        for s in 0..1000 {
            assert!((0.0..1.0).contains(&unit(s)));
        }
    }
}
