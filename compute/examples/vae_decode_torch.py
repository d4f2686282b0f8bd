"""PyTorch side of examples/vae_decode.rs: diffusers' AutoencoderKL (float32, 2 threads) with
the VAE weights of an SD1 checkpoint, decoding one [1, 4, H/8, W/8] latent.
Usage: python vae_decode_torch.py CHECKPOINT RUNS SIZE. Prints ms=<median wall> and
cpu_ms=<process CPU time per decode>."""
import statistics
import sys
import time

import torch
from diffusers import AutoencoderKL
from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint
from safetensors.torch import load_file

torch.set_num_threads(2)
checkpoint, runs, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# SD1's autoencoder: diffusers' AutoencoderKL defaults with four levels.
config = dict(in_channels=3, out_channels=3, latent_channels=4, layers_per_block=2, norm_num_groups=32,
              block_out_channels=(128, 256, 512, 512),
              down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4)
model = AutoencoderKL(**config).eval()
weights = {k: v.float() for k, v in load_file(checkpoint).items() if k.startswith("first_stage_model.")}
model.load_state_dict(convert_ldm_vae_checkpoint(weights, model.config), strict=True)
latent = torch.randn(1, 4, size // 8, size // 8, generator=torch.Generator().manual_seed(0))
times = []
with torch.inference_mode():
    model.decode(latent)
    cpu_start = time.process_time()
    for _ in range(runs):
        start = time.perf_counter()
        model.decode(latent)
        times.append((time.perf_counter() - start) * 1e3)
    cpu = (time.process_time() - cpu_start) * 1e3 / runs
print(f"ms={statistics.median(times):.3f}")
print(f"cpu_ms={cpu:.3f}")
