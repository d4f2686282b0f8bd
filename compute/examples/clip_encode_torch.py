"""PyTorch side of examples/clip_encode.rs: Hugging Face transformers' CLIPTextModel (float32,
2 threads) with the CLIP weights of an SD1 checkpoint, timed on one 77-token prompt.
Usage: python clip_encode_torch.py CHECKPOINT RUNS PROMPT. Prints ms=<median wall> and
cpu_ms=<process CPU time per encode>."""
import statistics
import sys
import time

import torch
from safetensors.torch import load_file
from transformers import CLIPTextConfig, CLIPTextModel

torch.set_num_threads(2)
checkpoint, runs, prompt = sys.argv[1], int(sys.argv[2]), sys.argv[3]
prefix = "cond_stage_model.transformer.text_model."
weights = {k[len(prefix):]: v.float() for k, v in load_file(checkpoint).items() if k.startswith(prefix)}
config = CLIPTextConfig(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                        num_attention_heads=12, max_position_embeddings=77, hidden_act="quick_gelu",
                        layer_norm_eps=1e-5, projection_dim=768)
model = CLIPTextModel(config).eval()
try:
    model.load_state_dict(weights, strict=True)
except RuntimeError:
    model.load_state_dict({"text_model." + k: v for k, v in weights.items()}, strict=True)
# Token ids do not change the work: the start token, 75 ordinary tokens, the end token.
ids = torch.tensor([[49406] + [320] * 75 + [49407]])
times = []
with torch.inference_mode():
    model(ids)
    cpu_start = time.process_time()
    for _ in range(runs):
        start = time.perf_counter()
        model(ids)
        times.append((time.perf_counter() - start) * 1e3)
    cpu = (time.process_time() - cpu_start) * 1e3 / runs
print(f"ms={statistics.median(times):.3f}")
print(f"cpu_ms={cpu:.3f}")
