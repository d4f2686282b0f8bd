//! Samplers outside the core k-diffusion set: DPM-Solver fast/adaptive, UniPC (bh1/bh2),
//! res_multistep (+ancestral), gradient estimation, ER-SDE and SEEDS-2, each with ComfyUI's
//! default arguments.

use super::super::model_sampling::linspace_f32;
use super::{add, add_scaled, ancestral_step, exp, expm1, lin2, lin2_sub, ln, sqrt, sub, to_d, Run, SampleError, V};

// ---------------------------------------------------------------------------------------------
// DPM-Solver (k-diffusion DPMSolver class), eta = 0.

struct Dpm<'r, 'a> {
    run: &'r mut Run<'a>,
}

impl Dpm<'_, '_> {
    fn sigma(t: f32) -> f32 {
        exp(-t)
    }

    fn t(sigma: f32) -> f32 {
        -ln(sigma)
    }

    /// `(x - D(x, sigma(t))) / sigma(t)`
    fn eps(&mut self, x: &[f32], t: f32) -> Result<V, SampleError> {
        let s = Self::sigma(t);
        let den = self.run.model(x, s)?;
        Ok(x.iter().zip(&den).map(|(&a, &b)| (a - b) / s).collect())
    }

    fn step1(x: &[f32], t: f32, t_next: f32, eps: &[f32]) -> V {
        let h = t_next - t;
        let c = Self::sigma(t_next) * expm1(h);
        x.iter().zip(eps).map(|(&a, &e)| a - c * e).collect()
    }

    /// Second-order step; returns `(x_2, eps_r1)`.
    fn step2(
        &mut self,
        x: &[f32],
        t: f32,
        t_next: f32,
        r1: f64,
        eps: &[f32],
        eps_r1: Option<V>,
    ) -> Result<(V, V), SampleError> {
        let h = t_next - t;
        let r1f = r1 as f32;
        let s1 = t + r1f * h;
        let eps_r1 = match eps_r1 {
            Some(e) => e,
            None => {
                let c = Self::sigma(s1) * expm1(r1f * h);
                let u1: V = x.iter().zip(eps).map(|(&a, &e)| a - c * e).collect();
                self.eps(&u1, s1)?
            }
        };
        let st = Self::sigma(t_next);
        let c1 = st * expm1(h);
        let c2 = (st / (2.0 * r1) as f32) * expm1(h);
        let out = (0..x.len())
            .map(|k| (x[k] - c1 * eps[k]) - c2 * (eps_r1[k] - eps[k]))
            .collect();
        Ok((out, eps_r1))
    }

    /// Third-order step (r1 = 1/3, r2 = 2/3); returns `(x_3, eps_r1)`.
    fn step3(&mut self, x: &[f32], t: f32, t_next: f32, eps: &[f32], eps_r1: Option<V>) -> Result<(V, V), SampleError> {
        let (r1, r2) = (1.0f64 / 3.0, 2.0f64 / 3.0);
        let (r1f, r2f) = (r1 as f32, r2 as f32);
        let h = t_next - t;
        let s1 = t + r1f * h;
        let s2 = t + r2f * h;
        let eps_r1 = match eps_r1 {
            Some(e) => e,
            None => {
                let c = Self::sigma(s1) * expm1(r1f * h);
                let u1: V = x.iter().zip(eps).map(|(&a, &e)| a - c * e).collect();
                self.eps(&u1, s1)?
            }
        };
        let ss2 = Self::sigma(s2);
        let e2 = expm1(r2f * h);
        let c1 = ss2 * e2;
        let c2 = (ss2 * (r2 / r1) as f32) * (e2 / (r2f * h) - 1.0);
        let u2: V = (0..x.len())
            .map(|k| (x[k] - c1 * eps[k]) - c2 * (eps_r1[k] - eps[k]))
            .collect();
        let eps_r2 = self.eps(&u2, s2)?;
        let st = Self::sigma(t_next);
        let eh = expm1(h);
        let d1 = st * eh;
        let d2 = (st / r2f) * (eh / h - 1.0);
        let out = (0..x.len())
            .map(|k| (x[k] - d1 * eps[k]) - d2 * (eps_r2[k] - eps[k]))
            .collect();
        Ok((out, eps_r1))
    }
}

/// ComfyUI's `dpm_fast` wrapper: `sample_dpm_fast(sigma_min = last non-zero sigma,
/// sigma_max = sigmas[0], n = len(sigmas) - 1)`.
pub(crate) fn dpm_fast(r: &mut Run, mut x: V, s: &[f32]) -> Result<V, SampleError> {
    let mut sigma_min = s[s.len() - 1];
    if sigma_min == 0.0 {
        sigma_min = s[s.len() - 2];
    }
    let sigma_max = s[0];
    if sigma_min <= 0.0 || sigma_max <= 0.0 {
        return Err(SampleError::Invalid(
            "dpm_fast needs positive sigma_min and sigma_max".into(),
        ));
    }
    let nfe = s.len() - 1;
    let t_start = Dpm::t(sigma_max);
    let t_end = Dpm::t(sigma_min);
    let m = nfe / 3 + 1;
    let ts = linspace_f32(t_start, t_end, m + 1);
    let orders: Vec<usize> = if nfe.is_multiple_of(3) {
        let mut o = vec![3; m.saturating_sub(2)];
        o.extend([2, 1]);
        o
    } else {
        let mut o = vec![3; m - 1];
        o.push(nfe % 3);
        o
    };
    r.total = orders.len();
    let mut d = Dpm { run: r };
    for (i, &order) in orders.iter().enumerate() {
        let (t, t_next) = (ts[i], ts[i + 1]);
        let eps = d.eps(&x, t)?;
        let sig = Dpm::sigma(t);
        let den: V = x.iter().zip(&eps).map(|(&a, &e)| a - sig * e).collect();
        d.run.step(i, sig, sig, &x, &den)?;
        x = match order {
            1 => Dpm::step1(&x, t, t_next, &eps),
            2 => d.step2(&x, t, t_next, 0.5, &eps, None)?.0,
            _ => d.step3(&x, t, t_next, &eps, None)?.0,
        };
    }
    Ok(x)
}

/// ComfyUI's `dpm_adaptive` wrapper with k-diffusion defaults (order 3, rtol 0.05,
/// atol 0.0078, h_init 0.05, I-controller, accept_safety 0.81, eta 0).
pub(crate) fn dpm_adaptive(r: &mut Run, mut x: V, s: &[f32]) -> Result<V, SampleError> {
    let mut sigma_min = s[s.len() - 1];
    if sigma_min == 0.0 {
        sigma_min = s[s.len() - 2];
    }
    let sigma_max = s[0];
    if sigma_min <= 0.0 || sigma_max <= 0.0 {
        return Err(SampleError::Invalid("dpm_adaptive needs positive sigmas".into()));
    }
    let (rtol, atol) = (0.05f32, 0.0078f32);
    let t_start = Dpm::t(sigma_max);
    let t_end = Dpm::t(sigma_min);
    let forward = t_end > t_start;
    let mut h = if forward { 0.05f64 } else { -0.05 };
    let order = 3.0f64;
    let (b1, b2, b3) = (1.0 / order, -0.0 / order, 0.0 / order);
    let mut errs: Option<[f64; 3]> = None;
    let mut s_cur = t_start;
    let mut x_prev = x.clone();
    let mut steps = 0usize;
    let numel_sqrt = (x.len() as f64).sqrt() as f32;
    let mut d = Dpm { run: r };
    loop {
        let more = if forward {
            s_cur < t_end - 1e-5
        } else {
            s_cur > t_end + 1e-5
        };
        if !more {
            break;
        }
        if steps > 10_000 {
            return Err(SampleError::Invalid("dpm_adaptive did not converge".into()));
        }
        let cand = s_cur + h as f32;
        let t = if forward { t_end.min(cand) } else { t_end.max(cand) };
        let eps = d.eps(&x, s_cur)?;
        let sig = Dpm::sigma(s_cur);
        let den: V = x.iter().zip(&eps).map(|(&a, &e)| a - sig * e).collect();
        let (x_low, eps_r1) = d.step2(&x, s_cur, t, 1.0 / 3.0, &eps, None)?;
        let (x_high, _) = d.step3(&x, s_cur, t, &eps, Some(eps_r1))?;
        let mut sq = 0.0f32;
        for k in 0..x.len() {
            let delta = atol.max(rtol * x_low[k].abs().max(x_prev[k].abs()));
            let q = (x_low[k] - x_high[k]) / delta;
            sq += q * q;
        }
        let error = sqrt(sq) / numel_sqrt;
        // PID step-size control (float64 like the Python controller).
        let inv_error = 1.0 / (error as f64 + 1e-8);
        let e = errs.get_or_insert([inv_error; 3]);
        e[0] = inv_error;
        let factor = e[0].powf(b1) * e[1].powf(b2) * e[2].powf(b3);
        let factor = 1.0 + (factor - 1.0).atan();
        let accept = factor >= 0.81;
        if accept {
            e[2] = e[1];
            e[1] = e[0];
        }
        h *= factor;
        if accept {
            x_prev = x_low;
            x = x_high;
            s_cur = t;
        }
        steps += 1;
        let sig_now = Dpm::sigma(s_cur);
        d.run.step(steps - 1, sig_now, sig_now, &x, &den)?;
    }
    Ok(x)
}

// ---------------------------------------------------------------------------------------------
// UniPC (ComfyUI's extra_samplers/uni_pc.py, sigma-space variant, predict_x0, multistep).

/// Solves `a x = b` in float32 with partial pivoting, LAPACK `sgesv` style (scale by the
/// reciprocal pivot, rank-1 updates, then triangular solves).
#[allow(clippy::needless_range_loop)]
fn solve_f32(mut a: Vec<Vec<f32>>, mut b: Vec<f32>) -> Vec<f32> {
    let n = b.len();
    let mut perm: Vec<usize> = (0..n).collect();
    for k in 0..n {
        let mut p = k;
        for i in k + 1..n {
            if a[i][k].abs() > a[p][k].abs() {
                p = i;
            }
        }
        a.swap(k, p);
        perm.swap(k, p);
        let inv = 1.0 / a[k][k];
        for i in k + 1..n {
            a[i][k] *= inv;
        }
        for i in k + 1..n {
            for j in k + 1..n {
                a[i][j] -= a[i][k] * a[k][j];
            }
        }
    }
    let bp: Vec<f32> = perm.iter().map(|&i| b[i]).collect();
    b = bp;
    for i in 0..n {
        for j in 0..i {
            b[i] -= a[i][j] * b[j];
        }
    }
    for i in (0..n).rev() {
        b[i] /= a[i][i];
        for j in 0..i {
            b[j] -= b[i] * a[j][i];
        }
    }
    b
}

struct UniPc<'r, 'a> {
    run: &'r mut Run<'a>,
    bh2: bool,
    /// Input of the most recent model call (what ComfyUI's denoiser saw).
    last_input: V,
}

fn lmc(sigma: f32) -> f32 {
    0.5 * ln(1.0 / ((sigma * sigma) + 1.0))
}
fn alpha_of(sigma: f32) -> f32 {
    exp(lmc(sigma))
}
fn std_of(sigma: f32) -> f32 {
    sqrt(1.0 - exp(2.0 * lmc(sigma)))
}
fn lambda_of(sigma: f32) -> f32 {
    let l = lmc(sigma);
    l - 0.5 * ln(1.0 - exp(2.0 * l))
}

impl UniPc<'_, '_> {
    /// Data prediction x0 from the scaled variable.
    fn model_fn(&mut self, x: &[f32], t: f32) -> Result<V, SampleError> {
        let scale = sqrt(t * t + 1.0);
        let input: V = x.iter().map(|&v| v * scale).collect();
        let den = self.run.model(&input, t)?;
        let eps: V = input.iter().zip(&den).map(|(&a, &b)| (a - b) / t).collect();
        self.last_input = input;
        let (a, sd) = (alpha_of(t), std_of(t));
        Ok(x.iter().zip(&eps).map(|(&xv, &e)| (xv - sd * e) / a).collect())
    }

    fn update(
        &mut self,
        x: &[f32],
        model_prev: &[V],
        t_prev: &[f32],
        t: f32,
        order: usize,
        use_corrector: bool,
    ) -> Result<(V, Option<V>), SampleError> {
        let t_prev_0 = t_prev[t_prev.len() - 1];
        let lambda_prev_0 = lambda_of(t_prev_0);
        let lambda_t = lambda_of(t);
        let model_prev_0 = &model_prev[model_prev.len() - 1];
        let (sigma_prev_0, sigma_t) = (std_of(t_prev_0), std_of(t));
        let alpha_t = exp(lmc(t));
        let h = lambda_t - lambda_prev_0;

        let mut rks: Vec<f32> = Vec::new();
        let mut d1s: Vec<V> = Vec::new();
        for i in 1..order {
            let t_prev_i = t_prev[t_prev.len() - 1 - i];
            let model_prev_i = &model_prev[model_prev.len() - 1 - i];
            let lambda_prev_i = lambda_of(t_prev_i);
            let rk = (lambda_prev_i - lambda_prev_0) / h;
            rks.push(rk);
            d1s.push(
                model_prev_i
                    .iter()
                    .zip(model_prev_0)
                    .map(|(&a, &b)| (a - b) / rk)
                    .collect(),
            );
        }
        rks.push(1.0);

        let hh = -h;
        let h_phi_1 = expm1(hh);
        let mut h_phi_k = h_phi_1 / hh - 1.0;
        let mut factorial_i = 1u64;
        let b_h = if self.bh2 { expm1(hh) } else { hh };
        let mut rmat: Vec<Vec<f32>> = Vec::new();
        let mut b: Vec<f32> = Vec::new();
        for i in 1..=order {
            rmat.push(
                rks.iter()
                    .map(|&rk| match i - 1 {
                        0 => 1.0,
                        1 => rk,
                        2 => rk * rk,
                        p => (rk as f64).powi(p as i32) as f32,
                    })
                    .collect(),
            );
            b.push((h_phi_k * factorial_i as f32) / b_h);
            factorial_i *= (i + 1) as u64;
            h_phi_k = h_phi_k / hh - (1.0 / factorial_i as f64) as f32;
        }

        let use_predictor = !d1s.is_empty();
        let rhos_p: Vec<f32> = if use_predictor {
            if order == 2 {
                vec![0.5]
            } else {
                let sub_a: Vec<Vec<f32>> = rmat[..order - 1].iter().map(|row| row[..order - 1].to_vec()).collect();
                solve_f32(sub_a, b[..order - 1].to_vec())
            }
        } else {
            Vec::new()
        };
        let rhos_c: Vec<f32> = if use_corrector {
            if order == 1 {
                vec![0.5]
            } else {
                solve_f32(rmat.clone(), b.clone())
            }
        } else {
            Vec::new()
        };

        let x_t_ = lin2_sub(x, sigma_t / sigma_prev_0, model_prev_0, alpha_t * h_phi_1);
        let ab = alpha_t * b_h;
        let combine = |rhos: &[f32], k: usize| -> f32 {
            let mut acc = rhos[0] * d1s[0][k];
            for (j, r) in rhos.iter().enumerate().skip(1) {
                acc += r * d1s[j][k];
            }
            acc
        };
        let x_t: V = if use_predictor {
            (0..x.len()).map(|k| x_t_[k] - ab * combine(&rhos_p, k)).collect()
        } else {
            x_t_.iter().map(|&v| v - ab * 0.0).collect()
        };
        if !use_corrector {
            return Ok((x_t, None));
        }
        let model_t = self.model_fn(&x_t, t)?;
        let last = rhos_c[rhos_c.len() - 1];
        let out = (0..x.len())
            .map(|k| {
                let corr = if d1s.is_empty() {
                    0.0
                } else {
                    combine(&rhos_c[..rhos_c.len() - 1], k)
                };
                let d1_t = model_t[k] - model_prev_0[k];
                x_t_[k] - ab * (corr + last * d1_t)
            })
            .collect();
        Ok((out, Some(model_t)))
    }
}

/// `sample_unipc(_bh2)`: the last sigma (if 0) is replaced by 0.001, the state is scaled by
/// `1/sqrt(1 + sigma0^2)`, multistep order `min(3, len - 2)`, lower order at the end.
#[allow(clippy::needless_range_loop)]
pub(crate) fn uni_pc(r: &mut Run, x: V, s: &[f32], bh2: bool) -> Result<V, SampleError> {
    let mut ts = s.to_vec();
    if ts[ts.len() - 1] == 0.0 {
        let n = ts.len();
        ts[n - 1] = 0.001;
    }
    let steps = ts.len() - 1;
    let order = 3usize.min(ts.len().saturating_sub(2)).max(1);
    if steps < order {
        return Err(SampleError::Invalid("uni_pc needs at least 2 steps".into()));
    }
    let k0 = sqrt(1.0 + ts[0] * ts[0]);
    let mut x: V = x.iter().map(|&v| v / k0).collect();
    let mut u = UniPc {
        run: r,
        bh2,
        last_input: Vec::new(),
    };
    let mut model_prev: Vec<V> = Vec::new();
    let mut t_prev: Vec<f32> = Vec::new();
    for step_index in 0..steps {
        if step_index == 0 {
            model_prev = vec![u.model_fn(&x, ts[0])?];
            t_prev = vec![ts[0]];
        } else if step_index < order {
            let t = ts[step_index];
            let (nx, mx) = u.update(&x, &model_prev, &t_prev, t, step_index, true)?;
            x = nx;
            let mx = match mx {
                Some(m) => m,
                None => u.model_fn(&x, t)?,
            };
            model_prev.push(mx);
            t_prev.push(t);
        } else {
            let extra = usize::from(step_index == steps - 1);
            for step in step_index..=step_index + extra {
                let t = ts[step];
                let step_order = order.min(steps + 1 - step);
                let use_corrector = step != steps;
                let (nx, mx) = u.update(&x, &model_prev, &t_prev, t, step_order, use_corrector)?;
                x = nx;
                for i in 0..order - 1 {
                    t_prev[i] = t_prev[i + 1];
                    model_prev[i] = model_prev[i + 1].clone();
                }
                t_prev[order - 1] = t;
                if step < steps {
                    let mx = match mx {
                        Some(m) => m,
                        None => u.model_fn(&x, t)?,
                    };
                    model_prev[order - 1] = mx;
                }
            }
        }
        let den = model_prev[model_prev.len() - 1].clone();
        let xs = x.clone();
        u.run.step(step_index, ts[step_index], ts[step_index], &xs, &den)?;
    }
    let a = alpha_of(ts[ts.len() - 1]);
    Ok(x.iter().map(|&v| v / a).collect())
}

// ---------------------------------------------------------------------------------------------

/// `res_multistep` (eta 0) and `res_multistep_ancestral` (eta 1).
pub(crate) fn res_multistep(r: &mut Run, mut x: V, s: &[f32], eta: f32) -> Result<V, SampleError> {
    let t_fn = |sigma: f32| -ln(sigma);
    let sigma_fn = |t: f32| exp(-t);
    let phi1 = |t: f32| expm1(t) / t;
    let phi2 = |t: f32| (phi1(t) - 1.0) / t;
    let mut old_sigma_down: Option<f32> = None;
    let mut old_den: Option<V> = None;
    for i in 0..s.len() - 1 {
        let den = r.model(&x, s[i])?;
        let (down, up) = ancestral_step(s[i], s[i + 1], eta);
        r.step(i, s[i], s[i], &x, &den)?;
        match (&old_den, old_sigma_down) {
            (Some(od), Some(osd)) if down != 0.0 => {
                let t = t_fn(s[i]);
                let t_old = t_fn(osd);
                let t_next = t_fn(down);
                let t_prev = t_fn(s[i - 1]);
                let h = t_next - t;
                let c2 = (t_prev - t_old) / h;
                let (p1, p2) = (phi1(-h), phi2(-h));
                let nan0 = |v: f32| if v.is_nan() { 0.0 } else { v };
                let b1 = nan0(p1 - p2 / c2);
                let b2 = nan0(p2 / c2);
                let e = sigma_fn(h);
                x = (0..x.len())
                    .map(|k| e * x[k] + h * (b1 * den[k] + b2 * od[k]))
                    .collect();
            }
            _ => {
                let d = to_d(&x, s[i], &den);
                let dt = down - s[i];
                x = add_scaled(&x, &d, dt);
            }
        }
        if s[i + 1] > 0.0 {
            let n = r.noise(s[i], s[i + 1])?;
            x = add_scaled(&x, &n, up);
        }
        old_den = Some(den);
        old_sigma_down = Some(down);
    }
    Ok(x)
}

/// `gradient_estimation` with ge_gamma = 2.
pub(crate) fn gradient_estimation(r: &mut Run, mut x: V, s: &[f32]) -> Result<V, SampleError> {
    let ge_gamma = 2.0f32;
    let mut old_d: Option<V> = None;
    for i in 0..s.len() - 1 {
        let den = r.model(&x, s[i])?;
        let d = to_d(&x, s[i], &den);
        r.step(i, s[i], s[i], &x, &den)?;
        let dt = s[i + 1] - s[i];
        if s[i + 1] == 0.0 {
            x = den;
        } else {
            x = add_scaled(&x, &d, dt);
            if let Some(od) = &old_d {
                let d_bar: V = sub(&d, od).iter().map(|&v| (ge_gamma - 1.0) * v).collect();
                x = add_scaled(&x, &d_bar, dt);
            }
        }
        old_d = Some(d);
    }
    Ok(x)
}

/// `er_sde` (VP ER-SDE-Solver-3) with the default noise scaler and 3 stages.
pub(crate) fn er_sde(r: &mut Run, mut x: V, s: &[f32]) -> Result<V, SampleError> {
    let max_stage = 3usize;
    let scaler = |v: f32| v * (exp(pow_f32(v, 0.3)) + 10.0);
    let n_pts = 200usize;
    let er: Vec<f32> = s.iter().map(|&sg| exp(-(-ln(sg)))).collect();
    let mut old_den: Option<V> = None;
    let mut old_den_d: Option<V> = None;
    for i in 0..s.len() - 1 {
        let den = r.model(&x, s[i])?;
        r.step(i, s[i], s[i], &x, &den)?;
        let stage = max_stage.min(i + 1);
        if s[i + 1] == 0.0 {
            x = den.clone();
        } else {
            let (ls, lt) = (er[i], er[i + 1]);
            let alpha_s = s[i] / ls;
            let alpha_t = s[i + 1] / lt;
            let r_alpha = alpha_t / alpha_s;
            let rr = scaler(lt) / scaler(ls);
            x = lin2(&x, r_alpha * rr, &den, alpha_t * (1.0 - rr));
            if stage >= 2 {
                let dt = lt - ls;
                let step = -dt / n_pts as f32;
                let pos: Vec<f32> = (0..n_pts).map(|p| lt + p as f32 * step).collect();
                let scaled: Vec<f32> = pos.iter().map(|&p| scaler(p)).collect();
                let sum1: f32 = pairwise_sum(&scaled.iter().map(|&v| 1.0 / v).collect::<Vec<_>>());
                let s1 = sum1 * step;
                let od = old_den.as_ref().expect("stage 2 has history");
                let den_d: V = den.iter().zip(od).map(|(&a, &b)| (a - b) / (ls - er[i - 1])).collect();
                let c = alpha_t * (dt + s1 * scaler(lt));
                x = add_scaled(&x, &den_d, c);
                if stage >= 3 {
                    let su: f32 = pairwise_sum(
                        &pos.iter()
                            .zip(&scaled)
                            .map(|(&p, &sc)| (p - ls) / sc)
                            .collect::<Vec<_>>(),
                    ) * step;
                    let odd = old_den_d.as_ref().expect("stage 3 has history");
                    let div = (ls - er[i - 2]) / 2.0;
                    let den_u: V = den_d.iter().zip(odd).map(|(&a, &b)| (a - b) / div).collect();
                    let c = alpha_t * ((dt * dt) / 2.0 + su * scaler(lt));
                    x = add_scaled(&x, &den_u, c);
                }
                old_den_d = Some(den_d);
            }
            let n = r.noise(s[i], s[i + 1])?;
            let v = lt * lt - (ls * ls) * (rr * rr);
            let k = if v.is_nan() || v < 0.0 { 0.0 } else { sqrt(v) };
            x = x.iter().zip(&n).map(|(&a, &nv)| a + (alpha_t * nv) * k).collect();
        }
        old_den = Some(den);
    }
    Ok(x)
}

/// Sum in float32 with a cascade like torch's reduction (close but not always bit-identical).
fn pairwise_sum(v: &[f32]) -> f32 {
    if v.len() <= 8 {
        return v.iter().sum();
    }
    let mid = v.len() / 2;
    pairwise_sum(&v[..mid]) + pairwise_sum(&v[mid..])
}

fn pow_f32(x: f32, y: f32) -> f32 {
    (x as f64).powf(y as f64) as f32
}

/// torch `lerp` for 0-dim float32.
fn lerp(a: f32, b: f32, w: f32) -> f32 {
    let diff = b - a;
    if w.abs() < 0.5 {
        a + w * diff
    } else {
        b - diff * (1.0 - w)
    }
}

/// `seeds_2` (SEEDS-2, phi_1 solver, r = 0.5, eta = 1).
pub(crate) fn seeds_2(r: &mut Run, mut x: V, s: &[f32]) -> Result<V, SampleError> {
    let (eta, rr) = (1.0f32, 0.5f32);
    // fac = 1 / (2 r)
    let fac = (1.0f64 / (2.0 * rr as f64)) as f32;
    let lambda_fn = |sg: f32| -ln(sg);
    let sigma_fn = |l: f32| exp(-l);
    for i in 0..s.len() - 1 {
        let den = r.model(&x, s[i])?;
        r.step(i, s[i], s[i], &x, &den)?;
        if s[i + 1] == 0.0 {
            x = den;
            continue;
        }
        let (ls, lt) = (lambda_fn(s[i]), lambda_fn(s[i + 1]));
        let h = lt - ls;
        let h_eta = h * (eta + 1.0);
        let ls1 = lerp(ls, lt, rr);
        let sigma_s1 = sigma_fn(ls1);
        let alpha_s1 = sigma_s1 * exp(ls1);
        let alpha_t = s[i + 1] * exp(lt);
        let c1 = sigma_s1 / s[i] * exp(-rr * h * eta);
        let c2 = alpha_s1 * expm1(-rr * h_eta);
        let mut x2 = lin2_sub(&x, c1, &den, c2);
        let k = sqrt(-expm1(-2.0 * rr * h * eta));
        let n1 = r.noise(s[i], sigma_s1)?;
        let sde: V = n1.iter().map(|&nv| k * nv).collect();
        x2 = x2.iter().zip(&sde).map(|(&a, &nv)| a + nv * sigma_s1).collect();
        let den2 = r.model(&x2, sigma_s1)?;
        let dd: V = den.iter().zip(&den2).map(|(&a, &b)| lerp(a, b, fac)).collect();
        let c1 = s[i + 1] / s[i] * exp(-h * eta);
        let c2 = alpha_t * expm1(-h_eta);
        x = lin2_sub(&x, c1, &dd, c2);
        let seg = (rr - 1.0) * h * eta;
        let es = exp(seg);
        let k2 = sqrt(-expm1(seg * 2.0));
        let n2 = r.noise(sigma_s1, s[i + 1])?;
        let sde2: V = sde.iter().zip(&n2).map(|(&a, &nv)| a * es + k2 * nv).collect();
        x = add(&x, &sde2.iter().map(|&v| v * s[i + 1]).collect::<Vec<_>>());
    }
    Ok(x)
}

/// `h * phi_2(h)` as `(expm1(h) - h) / h`.
fn ei_h_phi_2(h: f32) -> f32 {
    (expm1(h) - h) / h
}

/// `seeds_3` (SEEDS-3, r_1 = 1/3, r_2 = 2/3, eta = 1).
pub(crate) fn seeds_3(r: &mut Run, mut x: V, s: &[f32]) -> Result<V, SampleError> {
    let eta = 1.0f32;
    let (r1d, r2d) = (1.0f64 / 3.0, 2.0f64 / 3.0);
    let (r1, r2) = (r1d as f32, r2d as f32);
    let lambda_fn = |sg: f32| -ln(sg);
    let sigma_fn = |l: f32| exp(-l);
    for i in 0..s.len() - 1 {
        let den = r.model(&x, s[i])?;
        r.step(i, s[i], s[i], &x, &den)?;
        if s[i + 1] == 0.0 {
            x = den;
            continue;
        }
        let (ls, lt) = (lambda_fn(s[i]), lambda_fn(s[i + 1]));
        let h = lt - ls;
        let h_eta = h * (eta + 1.0);
        let ls1 = lerp(ls, lt, r1);
        let ls2 = lerp(ls, lt, r2);
        let (ss1, ss2) = (sigma_fn(ls1), sigma_fn(ls2));
        let alpha_s1 = ss1 * exp(ls1);
        let alpha_s2 = ss2 * exp(ls2);
        let alpha_t = s[i + 1] * exp(lt);

        // Step 1
        let c1 = ss1 / s[i] * exp(-r1 * h * eta);
        let c2 = alpha_s1 * expm1(-r1 * h_eta);
        let mut x2 = lin2_sub(&x, c1, &den, c2);
        let k = sqrt(-expm1((-2.0 * r1d) as f32 * h * eta));
        let n1 = r.noise(s[i], ss1)?;
        let mut sde: V = n1.iter().map(|&nv| k * nv).collect();
        x2 = x2.iter().zip(&sde).map(|(&a, &nv)| a + nv * ss1).collect();
        let den2 = r.model(&x2, ss1)?;

        // Step 2
        let a3_2 = (r2d / r1d) as f32 * ei_h_phi_2(-r2 * h_eta);
        let a3_1 = expm1(-r2 * h_eta) - a3_2;
        let c1 = ss2 / s[i] * exp(-r2 * h * eta);
        let mut x3: V = (0..x.len())
            .map(|k| c1 * x[k] - alpha_s2 * (a3_1 * den[k] + a3_2 * den2[k]))
            .collect();
        let seg = (r1d - r2d) as f32 * h * eta;
        let (es, k2) = (exp(seg), sqrt(-expm1(seg * 2.0)));
        let n2 = r.noise(ss1, ss2)?;
        sde = sde.iter().zip(&n2).map(|(&a, &nv)| a * es + k2 * nv).collect();
        x3 = x3.iter().zip(&sde).map(|(&a, &nv)| a + nv * ss2).collect();
        let den3 = r.model(&x3, ss2)?;

        // Step 3
        let b3 = ei_h_phi_2(-h_eta) / r2;
        let b1 = expm1(-h_eta) - b3;
        let c1 = s[i + 1] / s[i] * exp(-h * eta);
        x = (0..x.len())
            .map(|k| c1 * x[k] - alpha_t * (b1 * den[k] + b3 * den3[k]))
            .collect();
        let seg = (r2d - 1.0) as f32 * h * eta;
        let (es, k3) = (exp(seg), sqrt(-expm1(seg * 2.0)));
        let n3 = r.noise(ss2, s[i + 1])?;
        sde = sde.iter().zip(&n3).map(|(&a, &nv)| a * es + k3 * nv).collect();
        x = x.iter().zip(&sde).map(|(&a, &nv)| a + nv * s[i + 1]).collect();
    }
    Ok(x)
}

// ---------------------------------------------------------------------------------------------
// SA-Solver (stochastic Adams), data prediction, default tau interval.

/// `(1 + tau^2) * integral exp((1 + tau^2) x) x^p dx` from `s` to `t` with `exp((1+tau^2) t)`
/// factored out, for p = 0..order (SA-Solver's `compute_exponential_coeffs`).
fn sa_exponential_coeffs(s: f32, t: f32, order: usize, tau: f64) -> Vec<f32> {
    let tau_mul = 1.0 + tau * tau;
    let h = t - s;
    let e = exp((-tau_mul) as f32 * h);
    let ptf: Vec<f32> = (0..order)
        .map(|p| {
            let tp = if p == 0 { 1.0 } else { (t as f64).powi(p as i32) as f32 };
            let sp = if p == 0 { 1.0 } else { (s as f64).powi(p as i32) as f32 };
            tp - sp * e
        })
        .collect();
    let log_fact = |p: usize| -> f32 { ((1..=p).map(|k| k as f64).product::<f64>()).ln() as f32 };
    let log_tau = tau_mul.ln() as f32;
    (0..order)
        .map(|i| {
            let mut acc = 0.0f32;
            for (j, &pv) in ptf.iter().enumerate().take(i + 1) {
                let depth = (i - j) as f32;
                let mut c = log_fact(i) - log_fact(j);
                if tau > 0.0 {
                    c -= depth * log_tau;
                }
                let sign = if (i - j) % 2 == 0 { 1.0 } else { -1.0 };
                acc += (exp(c) * sign) * pv;
            }
            acc
        })
        .collect()
}

/// SA-Solver `compute_stochastic_adams_b_coeffs` (general Lagrange form).
fn sa_b_coeffs(sigma_next: f32, lambdas: &[f32], lambda_s: f32, lambda_t: f32, tau: f64) -> Vec<f32> {
    let n = lambdas.len();
    let e = sa_exponential_coeffs(lambda_s, lambda_t, n, tau);
    // Transposed Vandermonde: row j holds lambda_i^j.
    let mut vt = vec![vec![0.0f32; n]; n];
    for (i, &l) in lambdas.iter().enumerate() {
        let mut p = 1.0f32;
        for row in vt.iter_mut() {
            row[i] = p;
            p *= l;
        }
    }
    let li = solve_f32(vt, e);
    let alpha_t = sigma_next * exp(lambda_t);
    li.into_iter().map(|v| alpha_t * v).collect()
}

/// `sa_solver` / `sa_solver_pece` with ComfyUI defaults (predictor order 3, corrector order 4,
/// tau = 1 for sigma in [percent_to_sigma(0.8), percent_to_sigma(0.2)] of the SD1 schedule).
pub(crate) fn sa_solver(r: &mut Run, x: V, s: &[f32], pece: bool) -> Result<V, SampleError> {
    let (predictor_order, corrector_order) = (3usize, 4usize);
    let ms = super::super::ModelSampling::sd1();
    let start_sigma = ms.sigma((0.8f64 * 999.0) as f32);
    let end_sigma = ms.sigma(((1.0f64 - 0.8) * 999.0) as f32);
    let tau_func = |sigma: f32| -> f64 {
        if start_sigma >= sigma && sigma >= end_sigma {
            1.0
        } else {
            0.0
        }
    };
    let lambdas: Vec<f32> = s.iter().map(|&v| -ln(v)).collect();
    let max_order = predictor_order.max(corrector_order);
    let mut x_pred = x.clone();
    let mut x = x;
    let mut h = 0.0f32;
    let mut tau_t = 0.0f64;
    let mut noise: Option<V> = None;
    let mut preds: Vec<V> = Vec::new();
    let lower_order_to_end = s[s.len() - 1] == 0.0;
    let n = s.len();
    let combine = |preds: &[V], b: &[f32], k: usize| -> f32 {
        let mut acc = 0.0f32;
        for (p, &bv) in preds.iter().zip(b) {
            acc += p[k] * bv;
        }
        acc
    };
    for i in 0..n - 1 {
        let mut den = r.model(&x_pred, s[i])?;
        r.step(i, s[i], s[i], &x_pred, &den)?;
        preds.push(den.clone());
        if preds.len() > max_order {
            preds.remove(0);
        }
        let mut po = predictor_order.min(preds.len());
        let mut co = if i == 0 || (s[i + 1] == 0.0 && !pece) {
            0
        } else {
            corrector_order.min(preds.len())
        };
        if lower_order_to_end {
            po = po.min(n - 2 - i);
            co = co.min(n - 1 - i);
        }
        if co == 0 {
            x = x_pred.clone();
        } else {
            let b = sa_b_coeffs(s[i], &lambdas[i + 1 - co..=i], lambdas[i - 1], lambdas[i], tau_t);
            let used = &preds[preds.len() - co..];
            let c = s[i] / s[i - 1] * exp((-(tau_t * tau_t)) as f32 * h);
            x = (0..x.len()).map(|k| c * x[k] + combine(used, &b, k)).collect();
            if tau_t > 0.0 {
                if let Some(nz) = &noise {
                    x = add(&x, nz);
                }
            }
            if pece {
                den = r.model(&x, s[i])?;
                let last = preds.len() - 1;
                preds[last] = den.clone();
            }
        }
        if s[i + 1] == 0.0 {
            x_pred = den;
        } else {
            tau_t = tau_func(s[i + 1]);
            let b = sa_b_coeffs(s[i + 1], &lambdas[i + 1 - po..=i], lambdas[i], lambdas[i + 1], tau_t);
            let used = &preds[preds.len() - po..];
            h = lambdas[i + 1] - lambdas[i];
            let c = s[i + 1] / s[i] * exp((-(tau_t * tau_t)) as f32 * h);
            x_pred = (0..x.len()).map(|k| c * x[k] + combine(used, &b, k)).collect();
            if tau_t > 0.0 {
                let nz = r.noise(s[i], s[i + 1])?;
                let k = sqrt(-expm1((-2.0 * tau_t * tau_t) as f32 * h));
                let nz: V = nz.iter().map(|&v| (v * s[i + 1]) * k).collect();
                x_pred = add(&x_pred, &nz);
                noise = Some(nz);
            }
        }
    }
    Ok(x_pred)
}
