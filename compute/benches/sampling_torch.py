"""PyTorch side of benches/sampling.rs: the same euler + CFG step on the same UNet
architecture (diffusers' UNet2DConditionModel, random weights), 64x64 latent, batch 1
(UNet batch 2). Usage: python sampling_torch.py {tiny|sd15} STEPS. Prints steps_per_second=.."""
import sys
import time

import torch
from diffusers import UNet2DConditionModel

name, steps = sys.argv[1], int(sys.argv[2])
if name == "sd15":
    cfg = dict(
        block_out_channels=(320, 640, 1280, 1280),
        down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
        layers_per_block=2,
        cross_attention_dim=768,
        attention_head_dim=8,
    )
    ctx_dim = 768
else:
    cfg = dict(
        block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        layers_per_block=1,
        cross_attention_dim=32,
        attention_head_dim=8,
    )
    ctx_dim = 32
torch.manual_seed(0)
unet = UNet2DConditionModel(sample_size=64, in_channels=4, out_channels=4, **cfg).eval()
params = sum(p.numel() for p in unet.parameters())
ctx = torch.randn(2, 77, ctx_dim)
x = torch.randn(1, 4, 64, 64) * 14.6
# SD1 "normal"-like descending sigmas; values do not affect timing.
sigmas = torch.linspace(14.6, 0.03, steps + 2).tolist() + [0.0]


def denoise(x, sigma):
    c_in = 1.0 / (sigma**2 + 1) ** 0.5
    xin = torch.cat([x, x]) * c_in
    eps = unet(xin, 999.0 * sigma / 14.6, encoder_hidden_states=ctx).sample
    den = x - eps * sigma
    u, c = den.chunk(2)
    return u + (c - u) * 7.5


with torch.inference_mode():
    for i in range(steps + 1):
        if i == 1:
            t0, c0 = time.perf_counter(), time.process_time()
        s, s_next = sigmas[i], sigmas[i + 1]
        d = (x - denoise(x, s)) / s
        x = x + d * (s_next - s)
    secs = time.perf_counter() - t0
    cpu = (time.process_time() - c0) / steps
print(f"torch {torch.__version__} {name}: {params} UNet params, {steps} euler steps in {secs:.2f}s, {cpu:.2f} CPU-s/step, "
      f"{torch.get_num_threads()} threads")
print(f"steps_per_second={steps / secs:.6f}")
print(f"cpu_seconds_per_step={cpu:.3f}")
