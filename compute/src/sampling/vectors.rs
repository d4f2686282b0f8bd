//! Checks this module against a ComfyUI reference-vector file (`comfyui-sampling.json` format).

use std::fmt;
use std::path::Path;

use anyhow::{anyhow, Context, Result};
use serde_json::Value;

use super::model_sampling::ModelSampling;
use super::noise::{ListNoise, NormalKernel, TorchGenerator, TorchNoise};
use super::sampler::{deis_coeffs, lms_coeff, sample, SamplerKind, StepControl, StepInfo};
use super::scheduler::{ksampler_sigmas, sigmas, Scheduler};
use super::{Denoiser, Tensor};

/// Tolerance for scheduler outputs and the sigma table.
pub(super) const SCHEDULER_TOL: f64 = 1e-6;
/// Tolerance for sampler trajectories.
pub(super) const SAMPLER_TOL: f64 = 1e-4;
/// Tolerance for noise emulating torch's non-AVX kernel (the AVX2 path must be bit-exact).
pub(super) const NOISE_NO_AVX_TOL: f64 = 2e-6;

/// Outcome of one case.
#[derive(Debug, Clone, PartialEq)]
pub enum CaseStatus {
    /// Within tolerance.
    Pass,
    /// Out of tolerance or structurally different, with a reason.
    Fail(String),
    /// Not run, with a reason.
    Skip(String),
}

/// One checked case.
#[derive(Debug, Clone)]
pub struct CaseResult {
    /// Case path, e.g. `schedulers/karras/10`.
    pub name: String,
    /// Worst absolute elementwise error (NaN positions must agree).
    pub worst: f64,
    /// Tolerance applied.
    pub tolerance: f64,
    /// Whether every compared value was bit-identical.
    pub exact: bool,
    /// Pass / fail / skip.
    pub status: CaseStatus,
}

/// All case results of a vector file.
#[derive(Debug, Clone, Default)]
pub struct VectorReport {
    /// Results in file order.
    pub cases: Vec<CaseResult>,
}

impl VectorReport {
    /// True when no case failed (skips allowed).
    pub fn all_passed(&self) -> bool {
        self.cases.iter().all(|c| !matches!(c.status, CaseStatus::Fail(_)))
    }

    /// (passed, failed, skipped) counts.
    pub fn counts(&self) -> (usize, usize, usize) {
        let mut c = (0, 0, 0);
        for r in &self.cases {
            match r.status {
                CaseStatus::Pass => c.0 += 1,
                CaseStatus::Fail(_) => c.1 += 1,
                CaseStatus::Skip(_) => c.2 += 1,
            }
        }
        c
    }
}

impl fmt::Display for VectorReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in &self.cases {
            let exact = if c.exact { " bit-exact" } else { "" };
            match &c.status {
                CaseStatus::Pass => writeln!(
                    f,
                    "{:<58} worst {:.3e} tol {:.0e} PASS{}",
                    c.name, c.worst, c.tolerance, exact
                )?,
                CaseStatus::Fail(why) => writeln!(
                    f,
                    "{:<58} worst {:.3e} tol {:.0e} FAIL ({})",
                    c.name, c.worst, c.tolerance, why
                )?,
                CaseStatus::Skip(why) => writeln!(f, "{:<58} SKIP ({})", c.name, why)?,
            }
        }
        let (p, fl, s) = self.counts();
        write!(f, "{p} passed, {fl} failed, {s} skipped")
    }
}

/// Accumulates comparisons for one case.
struct Cmp {
    worst: f64,
    exact: bool,
    problems: Vec<String>,
}

impl Cmp {
    fn new() -> Self {
        Cmp {
            worst: 0.0,
            exact: true,
            problems: Vec::new(),
        }
    }

    fn values(&mut self, what: &str, got: &[f32], want: &[f64]) {
        if got.len() != want.len() {
            self.problems
                .push(format!("{what}: length {} != expected {}", got.len(), want.len()));
            self.exact = false;
            return;
        }
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            // The file stores float32 results as float64 decimals; rounding back to float32 is
            // exact (and absorbs any last-bit error of the JSON float parser).
            let w = w as f32 as f64;
            let g = g as f64;
            if w.is_nan() || g.is_nan() {
                if w.is_nan() != g.is_nan() {
                    self.problems.push(format!("{what}[{i}]: got {g}, expected {w}"));
                    self.exact = false;
                }
                continue;
            }
            if g.to_bits() != w.to_bits() {
                self.exact = false;
            }
            if w.is_infinite() || g.is_infinite() {
                if g != w {
                    self.problems.push(format!("{what}[{i}]: got {g}, expected {w}"));
                }
                continue;
            }
            let e = (g - w).abs();
            if e > self.worst {
                self.worst = e;
            }
        }
    }

    fn finish(self, name: String, tolerance: f64) -> CaseResult {
        let status = if !self.problems.is_empty() {
            CaseStatus::Fail(self.problems.join("; "))
        } else if self.worst > tolerance {
            CaseStatus::Fail("out of tolerance".into())
        } else {
            CaseStatus::Pass
        };
        CaseResult {
            name,
            worst: self.worst,
            tolerance,
            exact: self.exact,
            status,
        }
    }
}

fn num(v: &Value) -> Result<f64> {
    match v {
        Value::Number(n) => n.as_f64().ok_or_else(|| anyhow!("bad number {n}")),
        Value::String(s) => match s.as_str() {
            "NaN" => Ok(f64::NAN),
            "Infinity" => Ok(f64::INFINITY),
            "-Infinity" => Ok(f64::NEG_INFINITY),
            other => Err(anyhow!("bad numeric string {other:?}")),
        },
        other => Err(anyhow!("expected a number, got {other}")),
    }
}

fn nums(v: &Value) -> Result<Vec<f64>> {
    v.as_array()
        .ok_or_else(|| anyhow!("expected an array"))?
        .iter()
        .map(num)
        .collect()
}

fn f32s(v: &Value) -> Result<Vec<f32>> {
    Ok(nums(v)?.into_iter().map(|x| x as f32).collect())
}

fn obj<'a>(v: &'a Value, key: &str) -> Result<&'a serde_json::Map<String, Value>> {
    v.get(key)
        .and_then(Value::as_object)
        .ok_or_else(|| anyhow!("missing object '{key}'"))
}

/// The closed-form Gaussian denoiser of the vector file (mu = 0.3, s^2 = 0.25, float32 op order),
/// recording every sigma it is called with.
struct GaussianDenoiser {
    calls: Vec<f32>,
}

impl Denoiser for GaussianDenoiser {
    fn denoise(&mut self, x: &Tensor, sigma: f32) -> Result<Tensor> {
        self.calls.push(sigma);
        let mu = 0.3f32;
        let sig2 = sigma * sigma;
        let t = sig2 * mu;
        let den = 0.25f32 + sig2;
        Ok(x.with_data(x.data.iter().map(|&v| (0.25 * v + t) / den).collect()))
    }
}

/// Loads a vector file and runs every case in it; see the module docs for the format.
pub fn check_vectors(path: &Path) -> Result<VectorReport> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let root: Value = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let mut report = VectorReport::default();
    let ms = ModelSampling::sd1();
    check_schedulers(&root, &ms, &mut report)?;
    check_samplers(&root, &mut report)?;
    check_noise(&root, &mut report)?;
    Ok(report)
}

fn check_schedulers(root: &Value, ms: &ModelSampling, report: &mut VectorReport) -> Result<()> {
    let sch = root.get("schedulers").ok_or_else(|| anyhow!("missing 'schedulers'"))?;
    let table = sch
        .get("model_sampling")
        .ok_or_else(|| anyhow!("missing model_sampling"))?;
    let mut c = Cmp::new();
    c.values("sigmas", ms.sigmas(), &nums(&table["sigmas_f32"])?);
    c.values("log_sigmas", ms.log_sigmas(), &nums(&table["log_sigmas_f32"])?);
    report
        .cases
        .push(c.finish("schedulers/model_sampling/sd1_tables".into(), SCHEDULER_TOL));

    for (name, by_steps) in obj(sch, "calculate_sigmas")? {
        let parsed: std::result::Result<Scheduler, _> = name.parse();
        for (steps, want) in by_steps.as_object().ok_or_else(|| anyhow!("bad {name}"))? {
            let case = format!("schedulers/calculate_sigmas/{name}/{steps}");
            let Ok(s) = parsed else {
                report.cases.push(skip(case, "scheduler not implemented"));
                continue;
            };
            let n: usize = steps.parse()?;
            let mut c = Cmp::new();
            c.values("sigmas", &sigmas(ms, s, n), &nums(want)?);
            report.cases.push(c.finish(case, SCHEDULER_TOL));
        }
    }
    for (name, by_denoise) in obj(sch, "ksampler_set_steps")? {
        for (dn, rec) in by_denoise.as_object().ok_or_else(|| anyhow!("bad {name}"))? {
            let case = format!("schedulers/ksampler_set_steps/{name}/denoise={dn}");
            let Ok(s) = name.parse::<Scheduler>() else {
                report.cases.push(skip(case, "scheduler not implemented"));
                continue;
            };
            let steps = rec["steps"].as_u64().ok_or_else(|| anyhow!("steps"))? as usize;
            let denoise = num(&rec["denoise"])?;
            let mut c = Cmp::new();
            c.values(
                "sigmas",
                &ksampler_sigmas(ms, s, SamplerKind::Euler, steps, denoise),
                &nums(&rec["sigmas"])?,
            );
            report.cases.push(c.finish(case, SCHEDULER_TOL));
        }
    }
    for (name, rec) in obj(sch, "ksampler_discard_penultimate")? {
        let sampler_name = rec["sampler"].as_str().unwrap_or("?");
        let case = format!("schedulers/ksampler_discard_penultimate/{name}/{sampler_name}");
        let (Ok(s), Ok(k)) = (name.parse::<Scheduler>(), sampler_name.parse::<SamplerKind>()) else {
            report.cases.push(skip(case, "scheduler or sampler not implemented"));
            continue;
        };
        let steps = rec["steps"].as_u64().ok_or_else(|| anyhow!("steps"))? as usize;
        let denoise = num(&rec["denoise"])?;
        let mut c = Cmp::new();
        c.values(
            "sigmas",
            &ksampler_sigmas(ms, s, k, steps, denoise),
            &nums(&rec["sigmas"])?,
        );
        report.cases.push(c.finish(case, SCHEDULER_TOL));
    }
    Ok(())
}

fn skip(name: String, why: &str) -> CaseResult {
    CaseResult {
        name,
        worst: 0.0,
        tolerance: 0.0,
        exact: false,
        status: CaseStatus::Skip(why.to_string()),
    }
}

struct Recorded {
    /// (step, x at step start, denoised)
    steps: Vec<(usize, Vec<f32>, Vec<f32>)>,
}

fn check_samplers(root: &Value, report: &mut VectorReport) -> Result<()> {
    let sm = root.get("samplers").ok_or_else(|| anyhow!("missing 'samplers'"))?;
    let inputs = sm.get("inputs").ok_or_else(|| anyhow!("missing samplers.inputs"))?;
    let shape: Vec<usize> = inputs["n0_shape"]
        .as_array()
        .ok_or_else(|| anyhow!("n0_shape"))?
        .iter()
        .map(|v| v.as_u64().unwrap_or(0) as usize)
        .collect();
    let noise_list: Vec<Tensor> = inputs["noise_list"]
        .as_array()
        .ok_or_else(|| anyhow!("noise_list"))?
        .iter()
        .map(|v| Tensor::try_new(shape.clone(), f32s(v)?))
        .collect::<Result<_>>()?;

    check_aux(sm, inputs, report)?;
    if let Some(map) = inputs
        .get("x0_if_started_via_KSAMPLER_max_denoise")
        .and_then(Value::as_object)
    {
        let n0 = f32s(&inputs["n0"])?;
        let zeros = vec![0.0f32; n0.len()];
        let ms = ModelSampling::sd1();
        for (key, want) in map {
            let sig = f32s(&inputs["sigmas"][key.as_str()])?;
            let mut c = Cmp::new();
            c.values("x0", &ms.noise_scaling(sig[0], &n0, &zeros, true), &nums(want)?);
            report
                .cases
                .push(c.finish(format!("samplers/inputs/ksampler_noise_scaling/{key}"), SAMPLER_TOL));
        }
    }
    for group in ["runs", "extra_runs"] {
        let Some(runs) = sm.get(group).and_then(Value::as_object) else {
            continue;
        };
        for (sched_key, by_sampler) in runs {
            let Some(by_sampler) = by_sampler.as_object() else {
                continue;
            };
            if by_sampler.contains_key("function") {
                // A single special run, not a map of samplers.
                let case = format!("samplers/{group}/{sched_key}");
                report.cases.push(special_run(&case, by_sampler, inputs, &shape)?);
                continue;
            }
            for (sampler_name, rec) in by_sampler {
                let case = format!("samplers/{group}/{sched_key}/{sampler_name}");
                let Ok(kind) = sampler_name.parse::<SamplerKind>() else {
                    report.cases.push(skip(case, "sampler not implemented"));
                    continue;
                };
                report
                    .cases
                    .push(sampler_run(&case, kind, rec, inputs, &shape, &noise_list)?);
            }
        }
    }
    Ok(())
}

fn sampler_run(
    case: &str,
    kind: SamplerKind,
    rec: &Value,
    inputs: &Value,
    shape: &[usize],
    noise_list: &[Tensor],
) -> Result<CaseResult> {
    let sched_key = rec["sigmas"].as_str().ok_or_else(|| anyhow!("{case}: sigmas key"))?;
    let sig = f32s(&inputs["sigmas"][sched_key])?;
    let x0 = Tensor::try_new(shape.to_vec(), f32s(&inputs["x0"][sched_key])?)?;
    let mut den = GaussianDenoiser { calls: Vec::new() };
    let mut noise = ListNoise::new(noise_list.to_vec());
    let mut recorded = Recorded { steps: Vec::new() };
    let result = sample(kind, &mut den, x0, &sig, &mut noise, &mut |info: &StepInfo<'_>| {
        recorded
            .steps
            .push((info.step, info.x.data.clone(), info.denoised.data.clone()));
        StepControl::Continue
    });
    let out = match result {
        Ok(t) => t,
        Err(e) => {
            return Ok(CaseResult {
                name: case.to_string(),
                worst: f64::NAN,
                tolerance: SAMPLER_TOL,
                exact: false,
                status: CaseStatus::Fail(format!("sampler error: {e}")),
            })
        }
    };
    let mut c = Cmp::new();
    c.values("final_x", &out.data, &nums(&rec["final_x"])?);
    if let Some(v) = rec.get("model_call_sigmas") {
        c.values("model_call_sigmas", &den.calls, &nums(v)?);
    }
    if let Some(args) = rec.get("noise_draw_args").and_then(Value::as_array) {
        if rec.get("noise_sampler_passed").and_then(Value::as_bool) == Some(true) {
            let want: Vec<f64> = args.iter().flat_map(|p| nums(p).unwrap_or_default()).collect();
            let got: Vec<f32> = noise.calls.iter().flat_map(|&(a, b)| [a, b]).collect();
            c.values("noise_draw_args", &got, &want);
        }
    }
    let step_by_index = |i: usize| recorded.steps.iter().find(|s| s.0 == i);
    if let Some(v) = rec.get("x_after_first_step") {
        if let Some(s) = step_by_index(1) {
            c.values("x_after_first_step", &s.1, &nums(v)?);
        }
    }
    let step_lists = ["steps", "steps_first_and_last"];
    for key in step_lists {
        let Some(list) = rec.get(key).and_then(Value::as_array) else {
            continue;
        };
        for st in list {
            let Some(i) = st.get("i").and_then(Value::as_u64) else {
                continue;
            };
            let Some(s) = step_by_index(i as usize) else {
                c.problems.push(format!("no callback for step {i}"));
                continue;
            };
            // x_step_start is the true state; samplers whose callback x is their own variable
            // (uni_pc, dpm_fast, dpm_adaptive) only record x_callback.
            if let Some(v) = st.get("x_step_start").or_else(|| st.get("x_callback")) {
                c.values(&format!("step{i}.x"), &s.1, &nums(v)?);
            }
            if let Some(v) = st.get("denoised") {
                c.values(&format!("step{i}.denoised"), &s.2, &nums(v)?);
            }
        }
    }
    Ok(c.finish(case.to_string(), SAMPLER_TOL))
}

/// LMS and DEIS coefficient tables (`samplers.aux`).
fn check_aux(sm: &Value, inputs: &Value, report: &mut VectorReport) -> Result<()> {
    let Some(aux) = sm.get("aux") else {
        return Ok(());
    };
    let sig = f32s(&inputs["sigmas"]["karras_10"])?;
    if let Some(list) = aux.get("lms_coeffs_karras_10").and_then(Value::as_array) {
        let mut c = Cmp::new();
        for (i, rec) in list.iter().enumerate() {
            let (Some(order), Some(want)) = (rec.get("order").and_then(Value::as_u64), rec.get("coeffs_as_f32")) else {
                continue;
            };
            let order = order as usize;
            let got: Vec<f32> = (0..order).map(|j| lms_coeff(order, &sig, i, j) as f32).collect();
            c.values(&format!("lms[{i}]"), &got, &nums(want)?);
        }
        report
            .cases
            .push(c.finish("samplers/aux/lms_coeffs_karras_10".into(), SAMPLER_TOL));
    }
    if let Some(list) = aux.get("deis_coeffs_karras_10").and_then(Value::as_array) {
        let got = deis_coeffs(&sig, 3);
        let mut c = Cmp::new();
        for (i, want) in list.iter().enumerate() {
            let want = nums(want)?;
            if want.iter().any(|v| !v.is_finite()) {
                // The final step's table entry is unused (the step is first order).
                continue;
            }
            let g: Vec<f32> = got
                .get(i)
                .map(|v| v.iter().map(|&x| x as f32).collect())
                .unwrap_or_default();
            c.values(&format!("deis[{i}]"), &g, &want);
        }
        report
            .cases
            .push(c.finish("samplers/aux/deis_coeffs_karras_10".into(), SAMPLER_TOL));
    }
    Ok(())
}

/// `euler_ancestral_default_noise_seed_7`-style runs: ComfyUI's default noise sampler.
fn special_run(
    case: &str,
    rec: &serde_json::Map<String, Value>,
    inputs: &Value,
    shape: &[usize],
) -> Result<CaseResult> {
    let function = rec.get("function").and_then(Value::as_str).unwrap_or("");
    let kind = function
        .rsplit("sample_")
        .next()
        .and_then(|n| n.parse::<SamplerKind>().ok());
    let seed = rec
        .get("extra_args")
        .and_then(|e| e.get("seed"))
        .and_then(Value::as_u64);
    let (Some(kind), Some(seed), Some(sched_key)) = (kind, seed, rec.get("sigmas").and_then(Value::as_str)) else {
        return Ok(skip(case.to_string(), "unrecognised special run"));
    };
    let sig = f32s(&inputs["sigmas"][sched_key])?;
    let x0 = Tensor::try_new(shape.to_vec(), f32s(&inputs["x0"][sched_key])?)?;
    let n: usize = shape.iter().product();
    let mut c = Cmp::new();
    if let Some(draws) = rec.get("expected_noise_draws").and_then(Value::as_array) {
        let mut g = TorchGenerator::new(default_noise_seed(seed));
        for (k, d) in draws.iter().enumerate() {
            c.values(&format!("draw{k}"), &g.randn(n), &nums(d)?);
        }
    }
    let mut den = GaussianDenoiser { calls: Vec::new() };
    let mut noise = TorchNoise::new(default_noise_seed(seed));
    let out = sample(kind, &mut den, x0, &sig, &mut noise, &mut |_: &StepInfo<'_>| {
        StepControl::Continue
    })
    .map_err(|e| anyhow!("{case}: {e}"))?;
    if let Some(v) = rec.get("final_x") {
        c.values("final_x", &out.data, &nums(v)?);
    }
    Ok(c.finish(case.to_string(), SAMPLER_TOL))
}

/// Seed ComfyUI's `default_noise_sampler` gives its generator for `extra_args["seed"]` at the
/// vectors' ComfyUI commit (the seed itself; later ComfyUI versions add 1 on CPU).
fn default_noise_seed(seed: u64) -> u64 {
    seed
}

fn check_noise(root: &Value, report: &mut VectorReport) -> Result<()> {
    let Some(sn) = root.get("seeded_noise") else {
        return Ok(());
    };
    for (seed_str, rec) in obj(sn, "seeds")? {
        let seed: u64 = seed_str.parse().with_context(|| format!("seed {seed_str}"))?;
        noise_cases(
            report,
            &format!("noise/seed={seed_str}"),
            seed,
            rec,
            NormalKernel::Avx2,
            0.0,
        )?;
        if let Some(no_avx) = rec.get("no_avx_kernel") {
            noise_cases(
                report,
                &format!("noise/seed={seed_str}/no_avx"),
                seed,
                no_avx,
                NormalKernel::Default,
                NOISE_NO_AVX_TOL,
            )?;
        }
    }
    Ok(())
}

fn noise_cases(
    report: &mut VectorReport,
    prefix: &str,
    seed: u64,
    rec: &Value,
    kernel: NormalKernel,
    tol: f64,
) -> Result<()> {
    let gen = || TorchGenerator::with_kernel(seed, kernel);
    if let Some(pn) = rec.get("prepare_noise").and_then(Value::as_object) {
        for (shape_str, want) in pn {
            let n: usize = shape_str
                .split('x')
                .map(|d| d.parse::<usize>())
                .product::<std::result::Result<usize, _>>()?;
            let mut c = Cmp::new();
            c.values("noise", &gen().randn(n), &nums(want)?);
            report
                .cases
                .push(c.finish(format!("{prefix}/prepare_noise/{shape_str}"), tol));
        }
    }
    if let Some(want) = rec.get("randn_16") {
        let mut c = Cmp::new();
        c.values("randn", &gen().randn(16), &nums(want)?);
        report.cases.push(c.finish(format!("{prefix}/randn_16"), tol));
    }
    if let Some(want) = rec.get("rand_16") {
        let mut c = Cmp::new();
        c.values("rand", &gen().rand(16), &nums(want)?);
        report.cases.push(c.finish(format!("{prefix}/rand_16"), tol));
    }
    if let Some(sizes) = rec.get("randn_sizes").and_then(Value::as_object) {
        for (n_str, want) in sizes {
            let n: usize = n_str.parse()?;
            let mut c = Cmp::new();
            c.values("randn", &gen().randn(n), &nums(want)?);
            report
                .cases
                .push(c.finish(format!("{prefix}/randn_sizes/{n_str}"), tol));
        }
    }
    if let Some(want) = rec.get("randn_1_then_randn_1") {
        let mut g = gen();
        let got = vec![g.randn(1)[0], g.randn(1)[0]];
        let mut c = Cmp::new();
        c.values("randn", &got, &nums(want)?);
        report
            .cases
            .push(c.finish(format!("{prefix}/randn_1_then_randn_1"), tol));
    }
    Ok(())
}
