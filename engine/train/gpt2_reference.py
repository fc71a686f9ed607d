#!/usr/bin/python3
"""GPT-2 fine-tuning written independently in plain PyTorch: the reference
gpt2_reference_test.cc holds Ferry's trainer to.

Builds a small GPT-2 as Hugging Face's GPT2LMHeadModel computes it (token and
position embeddings; pre-LN blocks of causal self-attention and a GELU (tanh
approximation) MLP, their weights in Conv1D's [in, out] layout, y = x @ W + b;
a final layer norm; the output layer tied to wte; the mean cross-entropy of
each next token), with random weights from a fixed seed, then trains it with
torch.optim.AdamW on one fixed batch. Computes in fp64, so that the figures
are the model's own and not one summation order's.

Writes into OUTDIR:
  model.safetensors    the initial weights, fp32, GPT-2's names and layout
  swapped.safetensors  the same with h.0.attn.c_proj.weight transposed (a
                       file read with the wrong layout; same shapes)
  tokens.bin           the batch's window: seq_len + 1 little-endian uint16
                       tokens (every row of the batch is this window)
  reference.txt        "loss K VALUE" (before update K + 1; K = 0 is the
                       initial weights', K = steps the final weights') and
                       "grad_norm K VALUE" (the gradient norm update K + 1
                       clips, before clipping), one per line
  final.safetensors    the weights after `steps` updates, fp32

Usage: gpt2_reference.py OUTDIR [--layers N --hidden N ... ]; see --help.
"""

import argparse
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F


def conv1d_names(layers):
    """Names of the weights kept [in, out] (Conv1D)."""
    return {f"h.{i}.{n}.weight" for i in range(layers)
            for n in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")}


def initial_weights(a):
    """GPT-2's tensors, fp32, drawn from a.seed: matrices N(0, init_std)
    (wpe half that, c_proj scaled down by sqrt(2 * layers), as GPT-2 does),
    biases N(0, 0.02), layer norms 1 + N(0, 0.1) and N(0, 0.1). Larger than
    GPT-2's 0.02 so that attention is far from uniform and every value,
    read into the wrong place, changes the first loss (by 1e-3 or more)."""
    g = torch.Generator().manual_seed(a.seed)
    H, V, S = a.hidden, a.vocab, a.seq_len

    def normal(*shape, std=0.02, mean=0.0):
        return torch.randn(*shape, generator=g, dtype=torch.float32) * std + mean

    w = {"wte.weight": normal(V, H, std=a.init_std), "wpe.weight": normal(S, H, std=a.init_std / 2)}
    for i in range(a.layers):
        p = f"h.{i}."
        w[p + "ln_1.weight"] = normal(H, std=0.1, mean=1.0)
        w[p + "ln_1.bias"] = normal(H, std=0.1)
        w[p + "attn.c_attn.weight"] = normal(H, 3 * H, std=a.init_std)
        w[p + "attn.c_attn.bias"] = normal(3 * H)
        w[p + "attn.c_proj.weight"] = normal(H, H, std=a.init_std / math.sqrt(2 * a.layers))
        w[p + "attn.c_proj.bias"] = normal(H)
        w[p + "ln_2.weight"] = normal(H, std=0.1, mean=1.0)
        w[p + "ln_2.bias"] = normal(H, std=0.1)
        w[p + "mlp.c_fc.weight"] = normal(H, 4 * H, std=a.init_std)
        w[p + "mlp.c_fc.bias"] = normal(4 * H)
        w[p + "mlp.c_proj.weight"] = normal(4 * H, H, std=a.init_std / math.sqrt(2 * a.layers))
        w[p + "mlp.c_proj.bias"] = normal(H)
    w["ln_f.weight"] = normal(H, std=0.1, mean=1.0)
    w["ln_f.bias"] = normal(H, std=0.1)
    return w


def gelu_tanh(x):
    """GELU, tanh approximation, written out as GPT-2's gelu_new is."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def forward_loss(w, tokens, a):
    """Mean cross-entropy of next-token prediction over the batch [B, T+1]."""
    x_tokens, targets = tokens[:, :-1], tokens[:, 1:]
    B, T = x_tokens.shape
    H, nh = a.hidden, a.heads
    hd = H // nh
    eps = 1e-5
    x = w["wte.weight"][x_tokens] + w["wpe.weight"][torch.arange(T)]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(a.layers):
        p = f"h.{i}."
        h = F.layer_norm(x, (H,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]  # Conv1D
        q, k, v = qkv.split(H, dim=-1)
        q, k, v = (t.reshape(B, T, nh, hd).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        scores = scores.masked_fill(~causal, float("-inf"))
        y = scores.softmax(-1) @ v
        y = y.transpose(1, 2).reshape(B, T, H)
        x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = F.layer_norm(x, (H,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        h = h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"]
        h = gelu_tanh(h)
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (H,), w["ln_f.weight"], w["ln_f.bias"], eps)
    logits = x @ w["wte.weight"].t()  # the output layer is wte
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def write_safetensors(path, tensors):
    """fp32 tensors as a safetensors file: an 8-byte little-endian header
    length, the JSON header, the raw little-endian data."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)  # data 8-byte aligned, as Hugging Face writes it
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=300)
    parser.add_argument("--seq_len", type=int, default=32)
    parser.add_argument("--batch", type=int, default=2, help="rows, each the same window")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--lr", type=float, default=3e-3, help="constant")
    parser.add_argument("--weight_decay", type=float, default=0.1, help="on tensors of 2 or more dimensions")
    parser.add_argument("--beta1", type=float, default=0.9)
    parser.add_argument("--beta2", type=float, default=0.95)
    parser.add_argument("--eps", type=float, default=1e-8)
    parser.add_argument("--grad_clip", type=float, default=1.0, help="global norm; 0: none")
    parser.add_argument("--init_std", type=float, default=0.1, help="of the initial matrices")
    parser.add_argument("--seed", type=int, default=1234)
    a = parser.parse_args()
    if a.hidden % a.heads != 0:
        sys.exit(f"--hidden {a.hidden} does not split into --heads {a.heads}")
    os.makedirs(a.outdir, exist_ok=True)
    torch.set_num_threads(1)
    x = torch.linspace(-6, 6, 241, dtype=torch.float64)
    assert torch.allclose(gelu_tanh(x), F.gelu(x, approximate="tanh"), rtol=0, atol=1e-12), "gelu_tanh"

    initial = initial_weights(a)
    write_safetensors(os.path.join(a.outdir, "model.safetensors"), initial)
    swapped = dict(initial)
    swapped["h.0.attn.c_proj.weight"] = initial["h.0.attn.c_proj.weight"].t()
    write_safetensors(os.path.join(a.outdir, "swapped.safetensors"), swapped)

    g = torch.Generator().manual_seed(a.seed + 1)
    window = torch.randint(0, a.vocab, (a.seq_len + 1,), generator=g)
    window[:2] = torch.tensor([a.vocab - 1, 256 % a.vocab])  # the top of the vocabulary too
    with open(os.path.join(a.outdir, "tokens.bin"), "wb") as f:
        f.write(struct.pack("<%dH" % window.numel(), *window.tolist()))
    tokens = window.unsqueeze(0).expand(a.batch, -1)

    w = {n: t.to(torch.float64).requires_grad_() for n, t in initial.items()}
    decay = [t for t in w.values() if t.dim() >= 2]
    no_decay = [t for t in w.values() if t.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps)
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
    write_safetensors(os.path.join(a.outdir, "final.safetensors"), w)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
