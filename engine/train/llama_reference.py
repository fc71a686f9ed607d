#!/usr/bin/python3
"""The Llama family's fine-tuning written independently in plain PyTorch: the
reference llama_reference_test.cc holds Ferry's trainer to.

Builds a small model as Hugging Face's LlamaForCausalLM, MistralForCausalLM,
Qwen2ForCausalLM and Qwen3ForCausalLM compute it, with Hugging Face's
parameter names: token embedding; pre-norm blocks of RMSNorm
(x * rsqrt(mean(x^2) + eps) * w), grouped-query attention with rotary
positions applied to each head's halves (rotate_half) and the key/value
heads repeated (repeat_kv), Qwen2's q/k/v biases, Qwen3's per-head q/k
RMSNorm before the rotation, a SwiGLU MLP (down(silu(gate(x)) * up(x)));
a final RMSNorm; the output layer lm_head or, tied, the embedding; the mean
cross-entropy of each next token. Rotary frequencies with rope_scaling
"llama3" as Llama 3.1 computes them. Random weights from a fixed seed, then
torch.optim.AdamW on one fixed batch. Computes in fp64.

Writes into OUTDIR, a Hugging Face model folder:
  config.json          the model's config as Hugging Face writes it
  model.safetensors    the initial weights, fp32 -- or, with --shards N,
                       model-0000K-of-0000N.safetensors and
                       model.safetensors.index.json
  swapped/             the same folder with layer 0's gate_proj and up_proj
                       exchanged (a file read with the wrong layout; same
                       shapes)
  tokens.bin           the batch's window: seq_len + 1 little-endian uint16
  reference.txt        "loss K VALUE" (before update K + 1; K = steps after
                       the last) and "grad_norm K VALUE" (the norm update
                       K + 1 clips), one per line

Usage: llama_reference.py OUTDIR --model_type llama [--kv_heads N ...]; see --help.
"""

import argparse
import json
import math
import os
import struct

import torch
import torch.nn.functional as F

from gpt2_reference import write_safetensors  # beside this file


def names(a):
    """Every tensor's name and shape, Hugging Face's."""
    H, hd, nq, nkv, I, V = a.hidden, a.head_dim, a.heads, a.kv_heads, a.intermediate, a.vocab
    out = [("model.embed_tokens.weight", (V, H))]
    for i in range(a.layers):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (H,)),
                (p + "self_attn.q_proj.weight", (nq * hd, H)),
                (p + "self_attn.k_proj.weight", (nkv * hd, H)),
                (p + "self_attn.v_proj.weight", (nkv * hd, H))]
        if a.model_type == "qwen2":
            out += [(p + "self_attn.q_proj.bias", (nq * hd,)),
                    (p + "self_attn.k_proj.bias", (nkv * hd,)),
                    (p + "self_attn.v_proj.bias", (nkv * hd,))]
        if a.model_type == "qwen3":
            out += [(p + "self_attn.q_norm.weight", (hd,)), (p + "self_attn.k_norm.weight", (hd,))]
        out += [(p + "self_attn.o_proj.weight", (H, nq * hd)),
                (p + "post_attention_layernorm.weight", (H,)),
                (p + "mlp.gate_proj.weight", (I, H)),
                (p + "mlp.up_proj.weight", (I, H)),
                (p + "mlp.down_proj.weight", (H, I))]
    out.append(("model.norm.weight", (H,)))
    if not a.tied:
        out.append(("lm_head.weight", (V, H)))
    return out


def initial_weights(a):
    """fp32, drawn from a.seed: matrices N(0, init_std), biases N(0, 0.05),
    norms 1 + N(0, 0.1). Larger than Hugging Face's 0.02 so that attention is
    far from uniform and a value read into the wrong place changes the first
    loss."""
    g = torch.Generator().manual_seed(a.seed)
    w = {}
    for name, shape in names(a):
        r = torch.randn(*shape, generator=g, dtype=torch.float32)
        if name.endswith("norm.weight"):
            w[name] = 1.0 + 0.1 * r
        elif name.endswith(".bias"):
            w[name] = 0.05 * r
        else:
            w[name] = a.init_std * r
    return w


def inv_frequencies(a):
    """rope_theta^(-2i/head_dim), with Llama 3.1's scaling when asked."""
    inv = 1.0 / (a.rope_theta ** (torch.arange(0, a.head_dim, 2, dtype=torch.float64) / a.head_dim))
    if a.llama3_factor > 0:
        factor, low, high, old = a.llama3_factor, 1.0, 4.0, a.llama3_original
        out = []
        for f in inv.tolist():
            wavelength = 2 * math.pi / f
            if wavelength < old / high:
                out.append(f)
            elif wavelength > old / low:
                out.append(f / factor)
            else:
                s = (old / wavelength - low) / (high - low)
                out.append((1 - s) * f / factor + s * f)
        inv = torch.tensor(out, dtype=torch.float64)
    return inv


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x, n):
    """[B, kv, T, hd] -> [B, kv * n, T, hd], each key/value head n times."""
    B, kv, T, hd = x.shape
    return x[:, :, None].expand(B, kv, n, T, hd).reshape(B, kv * n, T, hd)


def forward_loss(w, tokens, a):
    x_tokens, targets = tokens[:, :-1], tokens[:, 1:]
    B, T = x_tokens.shape
    hd, nq, nkv = a.head_dim, a.heads, a.kv_heads
    angles = torch.arange(T, dtype=torch.float64)[:, None] * inv_frequencies(a)[None, :]
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    x = w["model.embed_tokens.weight"][x_tokens]
    for i in range(a.layers):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], a.eps)

        def proj(n):
            y = h @ w[p + f"self_attn.{n}_proj.weight"].t()
            if a.model_type == "qwen2":
                y = y + w[p + f"self_attn.{n}_proj.bias"]
            return y

        q = proj("q").view(B, T, nq, hd)
        k = proj("k").view(B, T, nkv, hd)
        v = proj("v").view(B, T, nkv, hd).transpose(1, 2)
        if a.model_type == "qwen3":
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], a.eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], a.eps)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, nq // nkv), repeat_kv(v, nq // nkv)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        y = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        x = x + y.transpose(1, 2).reshape(B, T, nq * hd) @ w[p + "self_attn.o_proj.weight"].t()
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], a.eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].t()
        up = h @ w[p + "mlp.up_proj.weight"].t()
        x = x + (F.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].t()
    x = rms_norm(x, w["model.norm.weight"], a.eps)
    head = w["model.embed_tokens.weight"] if a.tied else w["lm_head.weight"]
    logits = x @ head.t()
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def write_weights(outdir, tensors, shards):
    """model.safetensors, or `shards` files and their index."""
    if shards <= 1:
        write_safetensors(os.path.join(outdir, "model.safetensors"), tensors)
        return
    items = list(tensors.items())
    per = (len(items) + shards - 1) // shards
    weight_map, total = {}, 0
    for s in range(shards):
        part = dict(items[s * per:(s + 1) * per])
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(os.path.join(outdir, name), part)
        for n, t in part.items():
            weight_map[n] = name
            total += 4 * t.numel()
    with open(os.path.join(outdir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def config_json(a):
    c = {"architectures": [{"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                            "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[a.model_type]],
         "model_type": a.model_type, "hidden_size": a.hidden, "num_hidden_layers": a.layers,
         "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads, "head_dim": a.head_dim,
         "intermediate_size": a.intermediate, "vocab_size": a.vocab, "rms_norm_eps": a.eps,
         "rope_theta": a.rope_theta, "max_position_embeddings": 4 * a.seq_len,
         "tie_word_embeddings": a.tied, "hidden_act": "silu", "torch_dtype": "float32",
         "bos_token_id": 1, "eos_token_id": 2, "rope_scaling": None}
    if a.llama3_factor > 0:
        c["rope_scaling"] = {"rope_type": "llama3", "factor": a.llama3_factor, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": a.llama3_original}
    if a.model_type == "mistral":
        c["sliding_window"] = 4 * a.seq_len
    if a.model_type == "qwen2":
        c["use_sliding_window"] = False
    return c


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir")
    parser.add_argument("--model_type", choices=["llama", "mistral", "qwen2", "qwen3"], default="llama")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv_heads", type=int, default=2)
    parser.add_argument("--head_dim", type=int, default=16)
    parser.add_argument("--intermediate", type=int, default=96)
    parser.add_argument("--vocab", type=int, default=300)
    parser.add_argument("--tied", action="store_true")
    parser.add_argument("--rope_theta", type=float, default=10000.0)
    parser.add_argument("--llama3_factor", type=float, default=0.0, help="0: no rope scaling")
    parser.add_argument("--llama3_original", type=int, default=64)
    parser.add_argument("--eps", type=float, default=1e-5, help="rms_norm_eps")
    parser.add_argument("--seq_len", type=int, default=32)
    parser.add_argument("--batch", type=int, default=2, help="rows, each the same window")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--lr", type=float, default=3e-3, help="constant")
    parser.add_argument("--weight_decay", type=float, default=0.1, help="on tensors of 2 or more dimensions")
    parser.add_argument("--beta1", type=float, default=0.9)
    parser.add_argument("--beta2", type=float, default=0.95)
    parser.add_argument("--adam_eps", type=float, default=1e-8)
    parser.add_argument("--grad_clip", type=float, default=1.0, help="global norm; 0: none")
    parser.add_argument("--init_std", type=float, default=0.1)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1234)
    a = parser.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    torch.set_num_threads(1)

    initial = initial_weights(a)
    write_weights(a.outdir, initial, a.shards)
    with open(os.path.join(a.outdir, "config.json"), "w") as f:
        json.dump(config_json(a), f, indent=2)
    swapped = dict(initial)
    gate, up = "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"
    swapped[gate], swapped[up] = initial[up], initial[gate]
    os.makedirs(os.path.join(a.outdir, "swapped"), exist_ok=True)
    write_weights(os.path.join(a.outdir, "swapped"), swapped, 1)
    with open(os.path.join(a.outdir, "swapped", "config.json"), "w") as f:
        json.dump(config_json(a), f, indent=2)

    g = torch.Generator().manual_seed(a.seed + 1)
    window = torch.randint(0, a.vocab, (a.seq_len + 1,), generator=g)
    window[:2] = torch.tensor([a.vocab - 1, 256 % a.vocab])
    with open(os.path.join(a.outdir, "tokens.bin"), "wb") as f:
        f.write(struct.pack("<%dH" % window.numel(), *window.tolist()))
    tokens = window.unsqueeze(0).expand(a.batch, -1)

    w = {n: t.to(torch.float64).requires_grad_() for n, t in initial.items()}
    opt = torch.optim.AdamW([{"params": [t for t in w.values() if t.dim() >= 2], "weight_decay": a.weight_decay},
                             {"params": [t for t in w.values() if t.dim() < 2], "weight_decay": 0.0}],
                            lr=a.lr, betas=(a.beta1, a.beta2), eps=a.adam_eps)
    lines = []
    for step in range(a.steps):
        opt.zero_grad()
        loss = forward_loss(w, tokens, a)
        loss.backward()
        clip = a.grad_clip if a.grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(list(w.values()), clip)
        opt.step()
        lines += [f"loss {step} {loss.item():.17g}", f"grad_norm {step} {norm.item():.17g}"]
    with torch.no_grad():
        lines.append(f"loss {a.steps} {forward_loss(w, tokens, a).item():.17g}")
    with open(os.path.join(a.outdir, "reference.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
