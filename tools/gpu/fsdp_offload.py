#!/usr/bin/env python3
"""PyTorch's own offload on the same job, for comparison with Ferry's.

GPT-2 (Ferry's architecture: pre-LayerNorm blocks with biases, GELU, tied
embeddings) trained with FSDP and CPUOffload(offload_params=True) in
bf16 (MixedPrecision), one rank, activation checkpointing per block, with
the process's device memory capped as Ferry's job is (set_per_process_memory
_fraction). Prints one JSON object: tokens/s, MFU against --peak_tflops, or
the error when the step does not fit.

  python3 tools/gpu/fsdp_offload.py --preset=gpt2-xl --seq_len=1024 \\
      --budget_gib=6 --steps=4 --peak_tflops=989 --out=fsdp.json
"""

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {  # layers, hidden, heads, vocab (Ferry's engine/model/model_config.cc)
    "gpt2-small": (12, 768, 12, 50257),
    "gpt2-medium": (24, 1024, 16, 50257),
    "gpt2-large": (36, 1280, 20, 50257),
    "gpt2-xl": (48, 1600, 25, 50257),
}


class Block(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(hidden)
        self.attn = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln_2 = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.out = nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, layers, hidden, heads, vocab, seq_len):
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(seq_len, hidden)
        self.h = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="gpt2-xl")
    p.add_argument("--seq_len", type=int, default=1024)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--budget_gib", type=float, default=6.0, help="0: the whole device")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--peak_tflops", type=float, default=989.0)
    p.add_argument("--out", default="")
    a = p.parse_args()

    from torch.distributed.fsdp import CPUOffload, FullyShardedDataParallel as FSDP, MixedPrecision
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    total = torch.cuda.get_device_properties(0).total_memory
    if a.budget_gib > 0:
        torch.cuda.set_per_process_memory_fraction(min(1.0, a.budget_gib * 2**30 / total), 0)
    layers, hidden, heads, vocab = PRESETS[a.preset]
    result = {"framework": "torch FSDP CPUOffload(offload_params=True)", "torch": torch.__version__,
              "preset": a.preset, "seq_len": a.seq_len, "batch": a.batch, "budget_gib": a.budget_gib}
    try:
        torch.manual_seed(0)
        model = Gpt(layers, hidden, heads, vocab, a.seq_len)
        params = sum(t.numel() for t in model.parameters())
        result["parameters"] = params
        model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), cpu_offload=CPUOffload(offload_params=True),
                     mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16,
                                                    buffer_dtype=torch.bfloat16),
                     device_id=torch.cuda.current_device())
        apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, Block))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
        seconds = []
        for step in range(a.steps):
            idx = torch.randint(0, vocab, (a.batch, a.seq_len + 1), device="cuda")
            torch.cuda.synchronize()
            start = time.perf_counter()
            logits = model(idx[:, :-1])
            loss = F.cross_entropy(logits.float().view(-1, vocab), idx[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            seconds.append(time.perf_counter() - start)
            print(f"fsdp step {step + 1}: loss {loss.item():.4f} {seconds[-1]:.3f} s", file=sys.stderr, flush=True)
        steady = sorted(seconds[1:] or seconds)
        step_seconds = steady[len(steady) // 2]
        tokens = a.batch * a.seq_len / step_seconds
        result.update(ok=True, step_seconds=step_seconds, tokens_per_second=tokens,
                      mfu=6.0 * params * tokens / (a.peak_tflops * 1e12),
                      peak_allocated_bytes=torch.cuda.max_memory_allocated())
    except torch.cuda.OutOfMemoryError as e:
        result.update(ok=False, error=f"out of memory: {str(e)[:300]}")
    except Exception as e:  # noqa: BLE001 -- report whatever stopped it
        result.update(ok=False, error=f"{type(e).__name__}: {str(e)[:300]}")
    dist.destroy_process_group()
    text = json.dumps(result, indent=2)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
