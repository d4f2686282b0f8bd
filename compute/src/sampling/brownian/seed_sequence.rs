//! numpy's `SeedSequence` (O'Neill's `seed_seq` variant): it turns integer entropy plus a
//! spawn key into well-mixed 32-bit words. torchsde seeds every node of its Brownian tree
//! with `SeedSequence(entropy, spawn_key=(key, depth), pool_size).generate_state(n)`.

const INIT_A: u32 = 0x43b0_d7e5;
const MULT_A: u32 = 0x931e_8875;
const INIT_B: u32 = 0x8b51_f9dd;
const MULT_B: u32 = 0x58f3_8ded;
const MIX_MULT_L: u32 = 0xca01_f9dd;
const MIX_MULT_R: u32 = 0x4973_f715;
const XSHIFT: u32 = 16;

/// A mixed entropy pool, as numpy builds it in `SeedSequence.__init__`.
pub(crate) struct SeedSequence {
    pool: Vec<u32>,
}

/// numpy's `_int_to_uint32_array`: 32-bit words, lowest first; zero is one zero word.
fn words(n: u64) -> Vec<u32> {
    if n == 0 {
        return vec![0];
    }
    let mut out = Vec::with_capacity(2);
    let mut rest = n;
    while rest > 0 {
        out.push(rest as u32);
        rest >>= 32;
    }
    out
}

/// Hashes `value` with the running multiplier `hash_const`, advancing it.
fn hashmix(value: u32, hash_const: &mut u32) -> u32 {
    let mut v = value ^ *hash_const;
    *hash_const = hash_const.wrapping_mul(MULT_A);
    v = v.wrapping_mul(*hash_const);
    v ^ (v >> XSHIFT)
}

fn mix(x: u32, y: u32) -> u32 {
    let r = MIX_MULT_L.wrapping_mul(x).wrapping_sub(MIX_MULT_R.wrapping_mul(y));
    r ^ (r >> XSHIFT)
}

impl SeedSequence {
    /// `SeedSequence(entropy, spawn_key=spawn_key, pool_size=pool_size)`.
    pub(crate) fn new(entropy: u64, spawn_key: &[u64], pool_size: usize) -> Self {
        let mut assembled = words(entropy);
        let spawn: Vec<u32> = spawn_key.iter().flat_map(|&k| words(k)).collect();
        if !spawn.is_empty() && assembled.len() < pool_size {
            // Zero padding keeps spawned sequences apart from plain ones (numpy >= 1.19).
            assembled.resize(pool_size, 0);
        }
        assembled.extend(spawn);

        let mut pool = vec![0u32; pool_size];
        let mut hash_const = INIT_A;
        for (i, slot) in pool.iter_mut().enumerate() {
            *slot = hashmix(assembled.get(i).copied().unwrap_or(0), &mut hash_const);
        }
        for src in 0..pool_size {
            for dst in 0..pool_size {
                if src != dst {
                    let h = hashmix(pool[src], &mut hash_const);
                    pool[dst] = mix(pool[dst], h);
                }
            }
        }
        for &word in assembled.iter().skip(pool_size) {
            for slot in pool.iter_mut() {
                let h = hashmix(word, &mut hash_const);
                *slot = mix(*slot, h);
            }
        }
        SeedSequence { pool }
    }

    /// `generate_state(n)` with the default `uint32` words.
    pub(crate) fn generate_state(&self, n: usize) -> Vec<u32> {
        let mut hash_const = INIT_B;
        self.pool
            .iter()
            .cycle()
            .take(n)
            .map(|&word| {
                let mut v = word ^ hash_const;
                hash_const = hash_const.wrapping_mul(MULT_B);
                v = v.wrapping_mul(hash_const);
                v ^ (v >> XSHIFT)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NUMPY_42_POOL24: [u32; 3] = [387750627, 2536650517, 4078839648];
    const NUMPY_42_KEY00: [u32; 4] = [2102017995, 2891809698, 2144110403, 379559146];
    const NUMPY_BIG_KEY53: [u32; 4] = [348885187, 1512025306, 3135044431, 3754942769];
    const NUMPY_0_POOL4: [u32; 6] = [2968811710, 3677149159, 745650761, 2884920346, 2642120001, 549907821];

    /// Values printed by numpy 2.4 (`np.random.SeedSequence(...).generate_state(...)`).
    #[test]
    fn matches_numpy() {
        assert_eq!(SeedSequence::new(42, &[], 24).generate_state(3), NUMPY_42_POOL24);
        assert_eq!(SeedSequence::new(42, &[0, 0], 24).generate_state(4), NUMPY_42_KEY00);
        assert_eq!(
            SeedSequence::new((1 << 40) + 123, &[5, 3], 24).generate_state(4),
            NUMPY_BIG_KEY53
        );
        assert_eq!(SeedSequence::new(0, &[], 4).generate_state(6), NUMPY_0_POOL4);
    }
}
