#!/usr/bin/env python3
"""PyTorch's side of a GPU comparison: SD1.5 / SDXL sampling speed with diffusers.

Builds the SD1.5 or SDXL base UNet (diffusers' UNet2DConditionModel) and the SD VAE
(AutoencoderKL) from their configs with random weights (`torch.manual_seed(0)`, nothing is
downloaded), with attention through PyTorch's scaled_dot_product_attention (diffusers'
AttnProcessor2_0), then for each size x batch runs `--steps` Euler steps (diffusers'
EulerDiscreteScheduler, the SD schedule: 1000 train steps, scaled_linear betas
0.00085..0.012, "leading" spacing, steps_offset 1) with classifier-free guidance (the UNet
sees batch 2B: a random 77-token context of the family's width; for SDXL also
`added_cond_kwargs` text_embeds [2B, 1280] and time_ids [2B, 6]), and decodes the latents
with the VAE.

Per case it reports:
  first_call_s   the first sampling + VAE decode of that case, kernels not yet warm for its
                 shapes (the first case of a run also pays CUDA/cuDNN/cuBLAS start-up; later
                 cases reuse what earlier ones warmed, as a long-lived server would);
  then the median over `--rounds` timed rounds of: step_s (seconds per sampler step, each
  step being one UNet call on batch 2B), it_per_s, vae_s (decode only), end_to_end_s
  (sampling + decode), and peak_gib (torch.cuda.max_memory_allocated, reset per case,
  weights included).

One JSON line per case goes to stdout (keys: family, dtype, vae_dtype, size, batch, steps,
first_call_s, step_s, it_per_s, vae_s, end_to_end_s, peak_gib, sdpa_backend, torch,
diffusers, gpu, and `error` when a case failed, e.g. out of memory); then a short table whose
lines start with '#'. Progress goes to stderr. `grep '^{'` keeps the JSON.

    python3 scripts/bench-diffusers.py --family sd15|sdxl [--dtype float16|bfloat16|float32]
        [--vae-dtype bfloat16|float16|float32] [--size 512 [--size 768 ...] | --size 512,768]
        [--batch 1 [--batch 4 ...]] [--steps 20] [--rounds 3] [--cfg 7.5]
        [--sdpa-backend auto|flash|efficient|math] [--device cuda|cpu] [--tiny]

Needs only torch and diffusers (diffusers' own requirements: huggingface_hub, safetensors,
requests, filelock, regex, numpy, pillow). `--tiny` shrinks every channel count (same block
layout, same conditioning widths) so the script can be checked on a CPU; its numbers mean
nothing. `--device cpu` reports peak_gib as null.
"""

import argparse
import contextlib
import json
import statistics
import sys
import time

import torch

try:
    import diffusers
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, UNet2DConditionModel
    from diffusers.models.attention_processor import AttnProcessor2_0
except ImportError as e:  # pragma: no cover - environment problem, not a bug
    sys.exit(f"bench-diffusers: cannot import diffusers ({e}); put its wheel on PYTHONPATH")

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}

# What the SD1.5 and SDXL UNets share.
UNET_BASE = dict(
    in_channels=4,
    out_channels=4,
    center_input_sample=False,
    flip_sin_to_cos=True,
    freq_shift=0,
    mid_block_type="UNetMidBlock2DCrossAttn",
    layers_per_block=2,
    downsample_padding=1,
    mid_block_scale_factor=1,
    act_fn="silu",
    norm_num_groups=32,
    norm_eps=1e-5,
)

SD15_UNET = dict(
    UNET_BASE,
    sample_size=64,
    down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
    up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
    block_out_channels=(320, 640, 1280, 1280),
    cross_attention_dim=768,
    attention_head_dim=8,
)

SDXL_UNET = dict(
    UNET_BASE,
    sample_size=128,
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
    block_out_channels=(320, 640, 1280),
    cross_attention_dim=2048,
    transformer_layers_per_block=(1, 2, 10),
    # diffusers' SDXL config names the head *count* attention_head_dim (64-wide heads).
    attention_head_dim=(5, 10, 20),
    use_linear_projection=True,
    addition_embed_type="text_time",
    addition_time_embed_dim=256,
    projection_class_embeddings_input_dim=2816,
)

VAE = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4,
    block_out_channels=(128, 256, 512, 512),
    layers_per_block=2,
    act_fn="silu",
    latent_channels=4,
    norm_num_groups=32,
)

SCHEDULER = dict(
    num_train_timesteps=1000,
    beta_start=0.00085,
    beta_end=0.012,
    beta_schedule="scaled_linear",
    prediction_type="epsilon",
    timestep_spacing="leading",
    steps_offset=1,
    interpolation_type="linear",
    use_karras_sigmas=False,
)


def unet_config(family, tiny):
    cfg = dict(SD15_UNET if family == "sd15" else SDXL_UNET)
    if tiny:
        if family == "sd15":
            cfg.update(block_out_channels=(32, 64, 64, 64), attention_head_dim=8)
        else:
            cfg.update(
                block_out_channels=(32, 64, 128),
                transformer_layers_per_block=(1, 1, 2),
                attention_head_dim=(2, 4, 8),
            )
    return cfg


def vae_config(family, tiny):
    cfg = dict(VAE)
    cfg["sample_size"] = 512 if family == "sd15" else 1024
    cfg["scaling_factor"] = 0.18215 if family == "sd15" else 0.13025
    if tiny:
        cfg["block_out_channels"] = (32, 32, 64, 64)
    return cfg


@contextlib.contextmanager
def build_context(device, dtype):
    """Create parameters directly on `device` in `dtype`: no float32 copy on the host first."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(old)


def sdpa_context(name):
    if name == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }[name]
    return sdpa_kernel(backend)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def log(msg):
    print(f"[bench-diffusers] {msg}", file=sys.stderr, flush=True)


def parse_ints(values, default):
    out = []
    for v in values or [default]:
        out.extend(int(x) for x in str(v).replace(",", " ").split())
    return out


class Case:
    """Inputs of one size x batch case and the sampling / decoding it times."""

    def __init__(self, args, unet, vae, sched, device, size, batch):
        self.args, self.unet, self.vae, self.sched = args, unet, vae, sched
        self.device, self.size, self.batch = device, size, batch
        dtype = unet.dtype
        gen = torch.Generator(device="cpu").manual_seed(1)
        lat = size // 8
        self.noise = torch.randn(batch, 4, lat, lat, generator=gen).to(device, dtype)
        width = unet.config.cross_attention_dim
        self.context = torch.randn(2 * batch, 77, width, generator=gen).to(device, dtype)
        self.added = None
        if unet.config.addition_embed_type == "text_time":
            n_time = 6
            pooled = unet.config.projection_class_embeddings_input_dim - n_time * unet.config.addition_time_embed_dim
            text_embeds = torch.randn(2 * batch, pooled, generator=gen).to(device, dtype)
            # [original_h, original_w, crop_top, crop_left, target_h, target_w], as SDXL's pipeline.
            ids = torch.tensor([size, size, 0, 0, size, size], dtype=dtype, device=device)
            self.added = {"text_embeds": text_embeds, "time_ids": ids.repeat(2 * batch, 1)}

    def sample(self):
        sched, unet, cfg = self.sched, self.unet, self.args.cfg
        sched.set_timesteps(self.args.steps, device=self.device)
        latents = self.noise * sched.init_noise_sigma
        for t in sched.timesteps:
            x = sched.scale_model_input(torch.cat([latents, latents]), t)
            eps = unet(x, t, encoder_hidden_states=self.context, added_cond_kwargs=self.added, return_dict=False)[0]
            uncond, cond = eps.chunk(2)
            eps = uncond + cfg * (cond - uncond)
            latents = sched.step(eps, t, latents, return_dict=False)[0]
        return latents

    def decode(self, latents):
        z = latents.to(self.vae.dtype) / self.vae.config.scaling_factor
        return self.vae.decode(z, return_dict=False)[0]

    def timed(self):
        """(sampling seconds, decode seconds) of one full run, synchronised."""
        d = self.device
        sync(d)
        t0 = time.perf_counter()
        latents = self.sample()
        sync(d)
        t1 = time.perf_counter()
        image = self.decode(latents)
        sync(d)
        t2 = time.perf_counter()
        return t1 - t0, t2 - t1


def run_case(args, unet, vae, sched, device, size, batch, meta):
    row = dict(meta, size=size, batch=batch, steps=args.steps)
    if size % 8:
        return dict(row, error=f"size {size} is not a multiple of 8")
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    try:
        case = Case(args, unet, vae, sched, device, size, batch)
        s0, d0 = case.timed()
        log(f"{meta['family']} {size}px b{batch}: first call {s0 + d0:.3f}s (sampling {s0:.3f}s, decode {d0:.3f}s)")
        samp, dec, e2e = [], [], []
        for r in range(args.rounds):
            s, d = case.timed()
            samp.append(s)
            dec.append(d)
            e2e.append(s + d)
            log(f"  round {r + 1}/{args.rounds}: {args.steps / s:.2f} it/s, sampling {s:.3f}s, decode {d:.3f}s")
        med_s = statistics.median(samp)
        row.update(
            first_call_s=round(s0 + d0, 4),
            first_sample_s=round(s0, 4),
            step_s=round(med_s / args.steps, 5),
            it_per_s=round(args.steps / med_s, 3),
            vae_s=round(statistics.median(dec), 4),
            end_to_end_s=round(statistics.median(e2e), 4),
        )
    except torch.cuda.OutOfMemoryError as e:
        row["error"] = "out of memory: " + str(e).splitlines()[0][:200]
    except RuntimeError as e:  # e.g. a forced SDPA backend that refuses this dtype
        row["error"] = type(e).__name__ + ": " + str(e).splitlines()[0][:300]
    finally:
        row["peak_gib"] = (
            round(torch.cuda.max_memory_allocated(device) / 2**30, 3) if device.type == "cuda" else None
        )
        case = None
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=("sd15", "sdxl"), default="sd15")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="float16", help="UNet dtype (default float16)")
    p.add_argument("--vae-dtype", choices=tuple(DTYPES), default="bfloat16", help="VAE dtype (default bfloat16)")
    p.add_argument("--size", action="append", help="image side in pixels; repeatable or comma list (default 512 for sd15, 1024 for sdxl)")
    p.add_argument("--batch", action="append", help="images per prompt; repeatable or comma list (default 1)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3, help="timed rounds after the first call (median reported)")
    p.add_argument("--cfg", type=float, default=7.5, help="classifier-free guidance scale")
    p.add_argument("--sdpa-backend", choices=("auto", "flash", "efficient", "math"), default="auto")
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    p.add_argument("--tiny", action="store_true", help="shrink channel counts (CPU smoke test only)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("bench-diffusers: CUDA is not available (use --device cpu for a smoke test)")
    sizes = parse_ints(args.size, 512 if args.family == "sd15" else 1024)
    batches = parse_ints(args.batch, 1)
    dtype, vae_dtype = DTYPES[args.dtype], DTYPES[args.vae_dtype]

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    meta = dict(
        family=args.family + ("-tiny" if args.tiny else ""),
        dtype=args.dtype,
        vae_dtype=args.vae_dtype,
        sdpa_backend=args.sdpa_backend,
        torch=torch.__version__,
        diffusers=diffusers.__version__,
        gpu=gpu,
    )

    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    with build_context(device, dtype):
        unet = UNet2DConditionModel(**unet_config(args.family, args.tiny))
    with build_context(device, vae_dtype):
        vae = AutoencoderKL(**vae_config(args.family, args.tiny))
    unet.set_attn_processor(AttnProcessor2_0())
    vae.set_attn_processor(AttnProcessor2_0())
    unet.eval().requires_grad_(False)
    vae.eval().requires_grad_(False)
    sync(device)
    n_unet = sum(t.numel() for t in unet.parameters())
    n_vae = sum(t.numel() for t in vae.parameters())
    log(
        f"built {meta['family']} UNet ({n_unet / 1e6:.1f}M params, {args.dtype}) and VAE ({n_vae / 1e6:.1f}M, "
        f"{args.vae_dtype}) on {device} ({gpu}) in {time.perf_counter() - t0:.1f}s; torch {torch.__version__}, "
        f"diffusers {diffusers.__version__}"
    )
    sched = EulerDiscreteScheduler(**SCHEDULER)

    rows = []
    with torch.inference_mode(), sdpa_context(args.sdpa_backend):
        for size in sizes:
            for batch in batches:
                row = run_case(args, unet, vae, sched, device, size, batch, meta)
                rows.append(row)
                print(json.dumps(row), flush=True)

    head = f"{'family':<10} {'dtype':<8} {'size':>5} {'batch':>5} {'first s':>8} {'it/s':>7} {'s/step':>8} {'vae s':>7} {'e2e s':>7} {'peak GiB':>8}"
    print("#")
    print(f"# {gpu}, torch {torch.__version__}, diffusers {diffusers.__version__}, {args.steps} steps, "
          f"VAE {args.vae_dtype}, SDPA {args.sdpa_backend}, median of {args.rounds}")
    print("# " + head)
    for r in rows:
        if "error" in r:
            print(f"# {r['family']:<10} {r['dtype']:<8} {r['size']:>5} {r['batch']:>5}  {r['error'][:80]}")
            continue
        peak = "-" if r["peak_gib"] is None else f"{r['peak_gib']:.2f}"
        print(
            f"# {r['family']:<10} {r['dtype']:<8} {r['size']:>5} {r['batch']:>5} {r['first_call_s']:>8.2f} "
            f"{r['it_per_s']:>7.2f} {r['step_s']:>8.4f} {r['vae_s']:>7.3f} {r['end_to_end_s']:>7.2f} {peak:>8}"
        )
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
