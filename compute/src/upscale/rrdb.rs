//! ESRGAN's RRDBNet as spandrel builds it (`architectures/ESRGAN`): a first convolution,
//! residual-in-residual dense blocks under one shortcut, nearest-neighbour ×2 upsamplings
//! each followed by a convolution, and two last convolutions. Real-ESRGAN's 1x and 2x models
//! first fold the image's pixels into channels (`pixel_unshuffle` by 4 or 2).
//!
//! Files come in the old layout (`model.0.weight`, `model.1.sub.N.RDBj.convk.0.weight`) or
//! the new (`conv_first`, `body.N.rdbj.convk`, `conv_body`, `conv_up1`, `conv_hr`,
//! `conv_last`; BSRGAN's `RRDB_trunk`, `trunk_conv`, `upconv1`, `HRconv`); the new names
//! are mapped onto the old as spandrel does, and everything is read from those.

use std::collections::HashMap;

use candle_core::{Result, Tensor};

use super::ops;
use crate::conv::Conv2d;
use crate::interrupt::Interrupt;

/// Slope of the negative side of every activation.
const SLOPE: f32 = 0.2;

/// Growth channels of the dense blocks (fixed in ESRGAN).
const GROWTH: usize = 32;

/// Scale of each dense block's and residual block's own output before its shortcut.
const RESIDUAL_SCALE: f32 = 0.2;

/// An RRDBNet with its weights.
#[derive(Debug)]
pub(super) struct RrdbNet {
    first: Conv2d,
    /// Per block, its three dense blocks of five convolutions.
    blocks: Vec<[[Conv2d; 5]; 3]>,
    trunk: Conv2d,
    upconvs: Vec<Conv2d>,
    hr: Conv2d,
    last: Conv2d,
    /// Real-ESRGAN's pixel-unshuffle factor (2 or 4), if any.
    shuffle: Option<usize>,
    /// Feature channels.
    features: usize,
    /// The upscale of images (after any unshuffle).
    pub(super) scale: usize,
}

/// Whether `keys` holds an RRDBNet, in any of the layouts spandrel detects.
pub(super) fn detect(has: impl Fn(&str) -> bool) -> bool {
    let all = |keys: &[&str]| keys.iter().all(|k| has(k));
    all(&["model.0.weight", "model.1.sub.0.RDB1.conv1.0.weight"])
        || all(&[
            "conv_first.weight",
            "body.0.rdb1.conv1.weight",
            "conv_body.weight",
            "conv_last.weight",
        ])
        || all(&[
            "conv_first.weight",
            "RRDB_trunk.0.RDB1.conv1.weight",
            "trunk_conv.weight",
            "conv_last.weight",
        ])
        || all(&["model.0.weight", "model.1.sub.0.RDB1.conv1x1.weight"])
}

/// `state` with the new layout's names turned into the old layout's.
fn to_old_layout(state: HashMap<String, Tensor>) -> HashMap<String, Tensor> {
    if !state.contains_key("conv_first.weight") {
        return state;
    }
    let max_up = state.keys().filter_map(|k| upconv_index(k)).max().map_or(0, |n| n * 3);
    let blocks = state
        .keys()
        .filter_map(|k| dense_parts(k))
        .map(|(n, ..)| n + 1)
        .max()
        .unwrap_or(0);
    let mut old = HashMap::with_capacity(state.len());
    for (key, value) in state {
        if let Some(name) = old_name(&key, max_up, blocks) {
            old.insert(name, value);
        }
    }
    old
}

/// The `N` of `upconvN.*` or `conv_upN.*`.
fn upconv_index(key: &str) -> Option<usize> {
    let rest = key.strip_prefix("upconv").or_else(|| key.strip_prefix("conv_up"))?;
    let (n, kind) = rest.split_once('.')?;
    matches!(kind, "weight" | "bias").then(|| n.parse().ok()).flatten()
}

/// `(block, rdb, conv, kind)` of a new-layout dense-block key (`body.N.rdbJ.convK.kind` or
/// `RRDB_trunk.N.RDBJ.convK.kind`).
fn dense_parts(key: &str) -> Option<(usize, &str, &str, &str)> {
    let (rest, rdb) = if let Some(rest) = key.strip_prefix("body.") {
        (rest, "rdb")
    } else {
        (key.strip_prefix("RRDB_trunk.")?, "RDB")
    };
    let mut parts = rest.split('.');
    let n = parts.next()?.parse().ok()?;
    let j = parts.next()?.strip_prefix(rdb)?;
    let k = parts.next()?.strip_prefix("conv")?;
    let kind = parts.next()?;
    (parts.next().is_none() && matches!(kind, "weight" | "bias")).then_some((n, j, k, kind))
}

/// The old layout's name of new-layout key `key`.
fn old_name(key: &str, max_up: usize, blocks: usize) -> Option<String> {
    let (module, kind) = key.rsplit_once('.')?;
    if let Some((n, j, k, kind)) = dense_parts(key) {
        return Some(format!("model.1.sub.{n}.RDB{j}.conv{k}.0.{kind}"));
    }
    if let Some(n) = upconv_index(key) {
        return Some(format!("model.{}.{kind}", n * 3));
    }
    let index = match module {
        "conv_first" => return Some(format!("model.0.{kind}")),
        "trunk_conv" | "conv_body" => return Some(format!("model.1.sub.{blocks}.{kind}")),
        "HRconv" | "conv_hr" => max_up + 2,
        "conv_last" => max_up + 4,
        _ => return None,
    };
    Some(format!("model.{index}.{kind}"))
}

/// The length of sequence `prefix` (one more than its largest index), as spandrel's
/// `get_seq_len`.
fn seq_len(state: &HashMap<String, Tensor>, prefix: &str) -> usize {
    state
        .keys()
        .filter_map(|k| {
            k.strip_prefix(prefix)?
                .strip_prefix('.')?
                .split('.')
                .next()?
                .parse::<usize>()
                .ok()
        })
        .max()
        .map_or(0, |n| n + 1)
}

impl RrdbNet {
    /// The network of `state` (any layout, float32 tensors on the CPU); an error naming
    /// what is missing or unsupported.
    pub(super) fn new(state: HashMap<String, Tensor>) -> std::result::Result<Self, String> {
        let state = to_old_layout(state);
        if state.keys().any(|k| k.contains(".conv1x1.")) {
            return Err("ESRGAN+ (RRDBNet with conv1x1 layers) is not supported".into());
        }
        let length = seq_len(&state, "model");
        if length < 5 || !(length - 5).is_multiple_of(3) {
            return Err(format!("an RRDBNet of {length} top-level layers is not one weft knows"));
        }
        let ups = (length - 5) / 3;
        let blocks = seq_len(&state, "model.1.sub").saturating_sub(1);
        let conv = |name: &str| -> std::result::Result<Conv2d, String> {
            let get = |kind: &str| {
                state
                    .get(&format!("{name}.{kind}"))
                    .cloned()
                    .ok_or_else(|| format!("tensor {name}.{kind} is missing"))
            };
            Conv2d::same(get("weight")?, get("bias")?).map_err(|e| format!("{name}: {e}"))
        };
        let first = conv("model.0")?;
        let mut dense = Vec::with_capacity(blocks);
        for n in 0..blocks {
            let rdb = |j: usize| -> std::result::Result<[Conv2d; 5], String> {
                let c = |k: usize| conv(&format!("model.1.sub.{n}.RDB{j}.conv{k}.0"));
                Ok([c(1)?, c(2)?, c(3)?, c(4)?, c(5)?])
            };
            dense.push([rdb(1)?, rdb(2)?, rdb(3)?]);
        }
        let upconvs = (1..=ups)
            .map(|i| conv(&format!("model.{}", i * 3)))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let (in_nc, out_nc, features) = (
            first.in_channels(),
            conv(&format!("model.{}", length - 1))?.out_channels(),
            first.out_channels(),
        );
        let shuffle = (in_nc == out_nc * 4 || in_nc == out_nc * 16).then(|| if in_nc == out_nc * 4 { 2 } else { 4 });
        let net = RrdbNet {
            trunk: conv(&format!("model.1.sub.{blocks}"))?,
            hr: conv(&format!("model.{}", length - 3))?,
            last: conv(&format!("model.{}", length - 1))?,
            first,
            blocks: dense,
            upconvs,
            shuffle,
            features,
            scale: (1 << ups) / shuffle.unwrap_or(1),
        };
        net.check_channels(in_nc / shuffle.map_or(1, |f| f * f))?;
        Ok(net)
    }

    /// spandrel's size requirements: at least this many pixels a side, and a multiple of
    /// `.1` (4 for the unshuffling models).
    pub(super) fn size_requirements(&self) -> (usize, usize) {
        if self.shuffle.is_some() {
            (4, 4)
        } else {
            (2, 1)
        }
    }

    /// Feature channels.
    pub(super) fn features(&self) -> usize {
        self.features
    }

    /// An error unless the layers' channels chain up, for `image_channels` per pixel.
    fn check_channels(&self, image_channels: usize) -> std::result::Result<(), String> {
        if image_channels != 3 || self.last.out_channels() != 3 {
            return Err(format!(
                "an RRDBNet of {image_channels} input and {} output channels (weft upscales RGB images)",
                self.last.out_channels()
            ));
        }
        let nf = self.features;
        let mut chained = self.trunk.in_channels() == nf
            && self.trunk.out_channels() == nf
            && self.hr.in_channels() == nf
            && self.last.in_channels() == nf;
        chained &= self
            .upconvs
            .iter()
            .all(|c| c.in_channels() == nf && c.out_channels() == nf);
        for rdb in self.blocks.iter().flatten() {
            for (k, c) in rdb.iter().enumerate() {
                let out = if k == 4 { nf } else { GROWTH };
                chained &= c.in_channels() == nf + k * GROWTH && c.out_channels() == out;
            }
        }
        if chained {
            Ok(())
        } else {
            Err(format!(
                "the layers' channels do not chain up as an RRDBNet of {nf} features"
            ))
        }
    }

    /// The network's output for one image `x` (`3 × h × w`): `3 × h·scale × w·scale`.
    pub(super) fn forward(&self, x: &[f32], (h, w): (usize, usize), stop: Interrupt<'_>) -> Result<Vec<f32>> {
        let Some(f) = self.shuffle else {
            return self.model(x.to_vec(), 3, (h, w), stop);
        };
        let (hp, wp) = (h.next_multiple_of(f), w.next_multiple_of(f));
        let padded = ops::pad(x, 3, (h, w), (hp - h, wp - w));
        let folded = ops::pixel_unshuffle(&padded, 3, (hp, wp), f);
        let out = self.model(folded, 3 * f * f, (hp / f, wp / f), stop)?;
        let scale = self.scale;
        Ok(ops::crop(&out, 3, (hp * scale, wp * scale), (h * scale, w * scale)))
    }

    /// spandrel's `self.model(x)` on `x` (`channels × h × w`).
    fn model(&self, x: Vec<f32>, channels: usize, (h, w): (usize, usize), stop: Interrupt<'_>) -> Result<Vec<f32>> {
        let nf = self.features;
        let conv =
            |c: &Conv2d, x: &[f32], cin: usize, hw: (usize, usize)| c.forward_slice(x, (1, cin, hw.0, hw.1), stop);
        let fea = conv(&self.first, &x, channels, (h, w))?;
        drop(x);
        let body = self.body(&fea, (h, w), stop)?;
        let mut up = conv(&self.trunk, &body, nf, (h, w))?;
        drop(body);
        ops::add(&mut up, &fea);
        drop(fea);
        let mut hw = (h, w);
        for upconv in &self.upconvs {
            let larger = ops::upsample_nearest(&up, nf, hw, 2);
            hw = (hw.0 * 2, hw.1 * 2);
            up = conv(upconv, &larger, nf, hw)?;
            ops::leaky_relu(&mut up, SLOPE);
        }
        let mut hr = conv(&self.hr, &up, nf, hw)?;
        drop(up);
        ops::leaky_relu(&mut hr, SLOPE);
        conv(&self.last, &hr, nf, hw)
    }

    /// The residual-in-residual dense blocks on `fea` (`features × h × w`), before the
    /// trunk convolution.
    fn body(&self, fea: &[f32], (h, w): (usize, usize), stop: Interrupt<'_>) -> Result<Vec<f32>> {
        let (nf, p) = (self.features, h * w);
        // The dense blocks' concatenated features: the block's input, then each growth.
        let mut dense = vec![0f32; (nf + 4 * GROWTH) * p];
        dense[..nf * p].copy_from_slice(fea);
        let mut block_input = fea.to_vec();
        for rrdb in &self.blocks {
            stop.check()?;
            for rdb in rrdb {
                self.dense_block(rdb, &mut dense, (h, w), stop)?;
            }
            ops::scale_add(&mut dense[..nf * p], RESIDUAL_SCALE, &block_input);
            block_input.copy_from_slice(&dense[..nf * p]);
        }
        dense.truncate(nf * p);
        Ok(dense)
    }

    /// One dense block on the features at the start of `dense`, leaving its output there.
    fn dense_block(
        &self,
        convs: &[Conv2d; 5],
        dense: &mut [f32],
        (h, w): (usize, usize),
        stop: Interrupt<'_>,
    ) -> Result<()> {
        let (nf, p) = (self.features, h * w);
        for (k, conv) in convs[..4].iter().enumerate() {
            let cin = nf + k * GROWTH;
            let grown = conv.forward_slice(&dense[..cin * p], (1, cin, h, w), stop)?;
            ops::leaky_relu_into(&grown, &mut dense[cin * p..][..GROWTH * p], SLOPE);
        }
        let cin = nf + 4 * GROWTH;
        let mut out = convs[4].forward_slice(&dense[..cin * p], (1, cin, h, w), stop)?;
        ops::scale_add(&mut out, RESIDUAL_SCALE, &dense[..nf * p]);
        dense[..nf * p].copy_from_slice(&out);
        Ok(())
    }
}
