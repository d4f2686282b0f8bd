//! torchsde's `BrownianInterval` as `BrownianTree` configures it: a dyadic ("halfway") tree
//! over `[t0, t1]` whose nodes are split at their rounded midpoints, with times rounded to
//! `tol = 1e-6` (six decimals), no Lévy area, and each node's randomness seeded from numpy's
//! `SeedSequence(entropy, spawn_key=(key, depth))`. The increment over any query interval is
//! then a function of the entropy and the interval alone, whatever the query order.
//!
//! torchsde caches recent node increments in an LRU; a node's increment is a pure function of
//! its path from the root, so this port recomputes it along that path instead (same values).

use super::seed_sequence::SeedSequence;
use crate::sampling::TorchGenerator;

/// torchsde `BrownianTree`'s entropy pool size.
const POOL_SIZE: usize = 24;
/// Deepest split accepted; the tree over SD1's sigmas at `tol = 1e-6` is about 25 deep.
const MAX_DEPTH: u32 = 62;

/// torchsde's `round(x, 6)` for `tol = 1e-6`: the double nearest to `x` rounded to six
/// decimals (Python rounds the exact binary value, ties to even, as Rust's formatter does).
fn round_tol(x: f64) -> f64 {
    format!("{x:.6}").parse().expect("a formatted float parses")
}

#[derive(Debug, Clone, Copy)]
struct Split {
    midway: f64,
    left: usize,
    right: usize,
    /// `W_seed` of `generate_state(4)`: the normal draw that splits this node's increment.
    w_seed: u32,
    spawn_key: u64,
    depth: u32,
}

#[derive(Debug, Clone)]
struct Node {
    start: f64,
    end: f64,
    parent: Option<usize>,
    is_left: bool,
    split: Option<Split>,
}

/// The Brownian increments of one tree.
pub(crate) struct BrownianInterval {
    entropy: u64,
    len: usize,
    nodes: Vec<Node>,
    /// Where the next search starts (torchsde's `_last_interval`; only speeds up searches).
    last: usize,
    /// Increment over the whole interval.
    top: Vec<f32>,
}

impl BrownianInterval {
    /// The tree over `[t0, t1]` (`t0 <= t1`) for tensors of `len` float32 values.
    pub(crate) fn new(t0: f64, t1: f64, len: usize, entropy: u64) -> anyhow::Result<Self> {
        anyhow::ensure!(
            t0.is_finite() && t1.is_finite() && t0 <= t1,
            "Brownian interval [{t0}, {t1}] is not an interval"
        );
        let initial_w_seed = SeedSequence::new(entropy, &[], POOL_SIZE).generate_state(3)[0];
        let scale = (t1 - t0).sqrt() as f32;
        let top = TorchGenerator::new(initial_w_seed as u64)
            .randn(len)
            .into_iter()
            .map(|v| v * scale)
            .collect();
        Ok(BrownianInterval {
            entropy,
            len,
            nodes: vec![Node {
                start: round_tol(t0),
                end: round_tol(t1),
                parent: None,
                is_left: false,
                split: None,
            }],
            last: 0,
            top,
        })
    }

    /// The increment `W(tb) - W(ta)`, with the query clamped to the tree's interval.
    pub(crate) fn increment(&mut self, ta: f64, tb: f64) -> anyhow::Result<Vec<f32>> {
        let (start, end) = (self.nodes[0].start, self.nodes[0].end);
        let ta = ta.clamp(start, end);
        let tb = tb.clamp(start, end);
        anyhow::ensure!(ta <= tb, "Brownian query times {ta} > {tb}");
        if ta == tb {
            return Ok(vec![0.0; self.len]);
        }
        let mut pieces = Vec::new();
        self.locate(self.last, round_tol(ta), round_tol(tb), &mut pieces, 0)?;
        let (&first, rest) = pieces.split_first().expect("a located interval has a piece");
        self.last = *pieces.last().expect("non-empty");
        let mut w = self.node_increment(first);
        for &piece in rest {
            for (a, b) in w.iter_mut().zip(self.node_increment(piece)) {
                *a += b;
            }
        }
        Ok(w)
    }

    /// Appends the tree nodes that tile `[ta, tb]` (rounded times), splitting where needed
    /// (torchsde's `_loc_inner`).
    fn locate(&mut self, at: usize, ta: f64, tb: f64, out: &mut Vec<usize>, hops: u32) -> anyhow::Result<()> {
        anyhow::ensure!(
            hops <= 4 * MAX_DEPTH,
            "Brownian tree search for [{ta}, {tb}] does not end"
        );
        let node = self.nodes[at].clone();
        if ta < node.start || tb > node.end {
            let parent = node
                .parent
                .ok_or_else(|| anyhow::anyhow!("Brownian query [{ta}, {tb}] outside the tree"))?;
            return self.locate(parent, ta, tb, out, hops + 1);
        }
        if ta == node.start && tb == node.end {
            out.push(at);
            return Ok(());
        }
        match node.split {
            None => {
                if ta == node.start {
                    self.split(at, tb, 0)?;
                    let left = self.nodes[at].split.expect("just split").left;
                    self.locate(left, ta, tb, out, hops + 1)
                } else {
                    self.split(at, ta, 0)?;
                    let right = self.nodes[at].split.expect("just split").right;
                    self.locate(right, ta, tb, out, hops + 1)
                }
            }
            Some(s) if tb <= s.midway => self.locate(s.left, ta, tb, out, hops + 1),
            Some(s) if ta >= s.midway => self.locate(s.right, ta, tb, out, hops + 1),
            Some(s) => {
                self.locate(s.left, ta, s.midway, out, hops + 1)?;
                self.locate(s.right, s.midway, tb, out, hops + 1)
            }
        }
    }

    /// Splits `at` at its halfway point, then the child holding `point`, until a split lands
    /// on `point` (torchsde's `_split` for a halfway tree).
    fn split(&mut self, at: usize, point: f64, level: u32) -> anyhow::Result<()> {
        anyhow::ensure!(level <= MAX_DEPTH, "Brownian tree too deep at {point}");
        let (start, end) = (self.nodes[at].start, self.nodes[at].end);
        let s = self.split_exact(at, 0.5 * (end + start))?;
        if point > s.midway {
            self.split(s.right, point, level + 1)
        } else if point < s.midway {
            self.split(s.left, point, level + 1)
        } else {
            Ok(())
        }
    }

    /// Creates the two children of `at` at `midway` (torchsde's `_split_exact`).
    fn split_exact(&mut self, at: usize, midway: f64) -> anyhow::Result<Split> {
        let node = &self.nodes[at];
        let mid = round_tol(midway);
        anyhow::ensure!(
            node.start < mid && mid < node.end,
            "Brownian tree cannot split [{}, {}] finer than 1e-6",
            node.start,
            node.end
        );
        let (spawn_key, depth) = match node.parent {
            None => (0, 0),
            Some(p) => {
                let ps = self.nodes[p].split.expect("a parent is split");
                let key = ps
                    .spawn_key
                    .checked_mul(2)
                    .map(|k| k + u64::from(!node.is_left))
                    .ok_or_else(|| anyhow::anyhow!("Brownian tree too deep"))?;
                (key, ps.depth + 1)
            }
        };
        anyhow::ensure!(depth <= MAX_DEPTH, "Brownian tree too deep");
        let w_seed = SeedSequence::new(self.entropy, &[spawn_key, u64::from(depth)], POOL_SIZE).generate_state(4)[0];
        let (start, end) = (node.start, node.end);
        let left = self.nodes.len();
        self.nodes.push(Node {
            start,
            end: mid,
            parent: Some(at),
            is_left: true,
            split: None,
        });
        self.nodes.push(Node {
            start: mid,
            end,
            parent: Some(at),
            is_left: false,
            split: None,
        });
        let split = Split {
            midway: mid,
            left,
            right: left + 1,
            w_seed,
            spawn_key,
            depth,
        };
        self.nodes[at].split = Some(split);
        Ok(split)
    }

    /// A node's increment, derived from the root's down its path: the left part of a parent's
    /// increment `W` over `[s, e]` split at `m` is the Brownian bridge
    /// `(m - s) W / (e - s) + sqrt((m - s)(e - m) / (e - s)) Z`, in torch's float32 op order.
    fn node_increment(&self, at: usize) -> Vec<f32> {
        let mut path = vec![at];
        while let Some(p) = self.nodes[*path.last().expect("non-empty")].parent {
            path.push(p);
        }
        let mut w = self.top.clone();
        for pair in path.windows(2).rev() {
            let (child, parent) = (&self.nodes[pair[0]], &self.nodes[pair[1]]);
            let s = parent.split.expect("a parent is split");
            let h_reciprocal = 1.0 / (parent.end - parent.start);
            let left_diff = s.midway - parent.start;
            let right_diff = parent.end - s.midway;
            let (ld, hr) = (left_diff as f32, h_reciprocal as f32);
            let std = (left_diff * right_diff * h_reciprocal).sqrt() as f32;
            let noise = TorchGenerator::new(u64::from(s.w_seed)).randn(self.len);
            for (v, z) in w.iter_mut().zip(noise) {
                let left = ld * *v * hr + std * z;
                *v = if child.is_left { left } else { *v - left };
            }
        }
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_matches_python_round() {
        // Python: round(0.0078125, 6) == 0.007812 (tie to even), round(14.6146431, 6) == 14.614643.
        assert_eq!(round_tol(0.0078125), 0.007812);
        assert_eq!(round_tol(0.0078135), 0.007813);
        assert_eq!(round_tol(14.614643096923828), 14.614643);
        assert_eq!(round_tol(0.029167532920837402), 0.029168);
    }

    #[test]
    fn increments_add_up_and_do_not_depend_on_query_order() {
        let mut a = BrownianInterval::new(0.03, 14.6, 20, 5).unwrap();
        let whole = a.increment(0.03, 14.6).unwrap();
        let left = a.increment(0.03, 1.0).unwrap();
        let right = a.increment(1.0, 14.6).unwrap();
        for i in 0..20 {
            assert!((left[i] + right[i] - whole[i]).abs() < 1e-4, "{i}");
        }
        let mut b = BrownianInterval::new(0.03, 14.6, 20, 5).unwrap();
        assert_eq!(b.increment(1.0, 14.6).unwrap(), right);
        assert_eq!(b.increment(0.03, 1.0).unwrap(), left);
        assert!(b.increment(2.0, 1.0).is_err());
        assert_eq!(b.increment(3.0, 3.0).unwrap(), vec![0.0; 20]);
    }
}
