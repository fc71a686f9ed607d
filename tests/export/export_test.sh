#!/usr/bin/env bash
# ferry export through ferryd: a job trained with checkpoints is written as a
# safetensors file that PyTorch reads with GPT-2's names and shapes; two
# exports and ferry-worker --export give the same bytes; a job trained with
# two tensor-parallel ranks, or two data ranks sharding the optimizer
# states, exports the same weights as one rank; a running
# job exports its latest checkpoint; and the refusals name what to do.
set -euo pipefail

RUNFILES="${TEST_SRCDIR:-$PWD}/ferry"
source "$RUNFILES/tests/lib/ferryd.sh"
WORKER="$RUNFILES/server/ferry-worker"
WORK="$(mktemp -d "${TEST_TMPDIR:-/tmp}/export.XXXXXX")"

fail() { echo "FAIL: $*" >&2; echo "--- ferryd log ---" >&2; tail -40 "$WORK/ferryd.log" >&2 || true; exit 1; }

"$PY" -c "import torch" 2>/dev/null || fail "python3-torch is not installed (tools/install_deps.sh installs it)"

"$FERRYD" --state_dir="$WORK/state" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
  --ready_file="$WORK/ready.json" >"$WORK/ferryd.log" 2>&1 &
DAEMON=$!
cleanup() { kill "$DAEMON" 2>/dev/null || true; wait "$DAEMON" 2>/dev/null || true; }
trap cleanup EXIT
wait_ready "$DAEMON" "$WORK/ready.json"
export FERRY_ADDRESS="$READY_ADDRESS"

expect_refusal() {  # expect_refusal EXIT_CODE TEXT -- ferry args...
  local code="$1" text="$2"; shift 3
  set +e; out="$("$FERRY" "$@" 2>&1)"; rc=$?; set -e
  [ "$rc" -eq "$code" ] || fail "ferry $* exited $rc, not $code: $out"
  grep -qF -- "$text" <<<"$out" || fail "ferry $* said '$out', which lacks '$text'"
  echo "refused as expected: ferry $*"
}

job() {  # job FILE CHECKPOINT_DIR STEPS [TENSOR [DATA [SHARD]]]
  cat >"$1" <<YAML
name: exported
model: {layers: 2, hidden: 32, heads: 4, vocab_size: 64, seq_len: 16}
data: {synthetic: {}}
train: {steps: $3, batch_size: 4, lr: 3.0e-3, threads: 1}
parallel: {tensor: ${4:-1}, data: ${5:-1}, shard: ${6:-none}}
checkpoint: {dir: $2, every_steps: 4, keep: 2}
YAML
}

expect_refusal 2 "not found" -- export j-00000000 "$WORK/none.safetensors"
expect_refusal 2 "export takes a job id and where to write" -- export j-00000000

# A job without checkpoint.dir has nothing to export.
printf 'name: plain\nmodel: {layers: 1, hidden: 32, heads: 4, vocab_size: 64, seq_len: 16}\ndata: {synthetic: {}}\ntrain: {steps: 2, batch_size: 2}\n' \
  >"$WORK/plain.yaml"
PLAIN="$("$FERRY" submit "$WORK/plain.yaml" -o json | json "d['id']")"
expect_refusal 2 "failed precondition: checkpoint.dir: job $PLAIN keeps no checkpoints" -- export "$PLAIN" "$WORK/plain.safetensors"
"$FERRY" watch "$PLAIN" >/dev/null 2>&1 || fail "the job without checkpoints failed"

# One rank, trained to the end.
job "$WORK/one.yaml" "$WORK/one-ckpt" 10
ONE="$("$FERRY" submit "$WORK/one.yaml" -o json | json "d['id']")"
"$FERRY" watch "$ONE" >"$WORK/one.watch" 2>&1 || fail "the job failed: $(tail -3 "$WORK/one.watch")"
"$FERRY" export "$ONE" "$WORK/one.safetensors" >"$WORK/one.txt" || fail "ferry export failed: $(cat "$WORK/one.txt")"
cat "$WORK/one.txt"
grep -q "^exported 28 tensors (.* MiB) of $ONE at step 10 to $WORK/one.safetensors$" "$WORK/one.txt" \
  || fail "ferry export said: $(cat "$WORK/one.txt")"
ls "$WORK" | grep -q "tmp" && fail "a temporary file was left: $(ls "$WORK")"
"$FERRY" export "$ONE" "$WORK/again.safetensors" -o json >"$WORK/again.json" || fail "ferry export -o json failed"
[ "$(json "d['step'], d['tensors'], d['bytes'] == $(stat -c %s "$WORK/again.safetensors")" <"$WORK/again.json")" = "10 28 True" ] \
  || fail "ferry export -o json: $(cat "$WORK/again.json")"
cmp -s "$WORK/one.safetensors" "$WORK/again.safetensors" || fail "two exports of one checkpoint differ"
ls "$WORK/state/jobs/$ONE" | grep -q "export" && fail "the daemon left export files: $(ls "$WORK/state/jobs/$ONE")"
# The worker run on its own writes the same file.
"$WORKER" --export="$WORK/direct.safetensors" --spec="$WORK/one.yaml" >"$WORK/direct.txt" 2>&1 \
  || fail "ferry-worker --export failed: $(cat "$WORK/direct.txt")"
cmp -s "$WORK/one.safetensors" "$WORK/direct.safetensors" || fail "ferry-worker --export wrote another file"

# PyTorch reads it: GPT-2's names and shapes, fp32, the metadata.
"$PY" - "$WORK/one.safetensors" <<'PYEOF' || fail "the exported file is not GPT-2's layout"
import json, struct, sys
import torch

def load(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__")
    body = bytearray(data[8 + n:])
    tensors = {}
    for name, info in header.items():
        assert info["dtype"] == "F32", (name, info)
        begin, end = info["data_offsets"]
        tensors[name] = torch.frombuffer(body, dtype=torch.float32, offset=begin,
                                         count=(end - begin) // 4).reshape(info["shape"])
    return meta, tensors, list(header)

meta, tensors, order = load(sys.argv[1])
assert meta["format"] == "pt" and meta["step"] == "10" and meta["job"] == "exported", meta
H, L, V, S = 32, 2, 64, 16
assert (meta["n_embd"], meta["n_layer"], meta["vocab_size"], meta["n_positions"]) == (str(H), str(L), str(V), str(S)), meta
expected = {"wte.weight": [V, H], "wpe.weight": [S, H], "ln_f.weight": [H], "ln_f.bias": [H]}
for i in range(L):
    p = f"h.{i}."
    expected.update({p + "ln_1.weight": [H], p + "ln_1.bias": [H],
                     p + "attn.c_attn.weight": [H, 3 * H], p + "attn.c_attn.bias": [3 * H],
                     p + "attn.c_proj.weight": [H, H], p + "attn.c_proj.bias": [H],
                     p + "ln_2.weight": [H], p + "ln_2.bias": [H],
                     p + "mlp.c_fc.weight": [H, 4 * H], p + "mlp.c_fc.bias": [4 * H],
                     p + "mlp.c_proj.weight": [4 * H, H], p + "mlp.c_proj.bias": [H]})
assert sorted(tensors) == sorted(expected), sorted(set(tensors) ^ set(expected))
for name, shape in expected.items():
    assert list(tensors[name].shape) == shape, (name, tensors[name].shape, shape)
    assert torch.isfinite(tensors[name]).all(), name
assert order[0] == "wte.weight" and order[-1] == "ln_f.bias", order
# Trained: the layer norms moved away from 1 and 0.
assert not torch.equal(tensors["h.0.ln_1.weight"], torch.ones(H))
# A forward pass of GPT-2 built from these tensors runs and predicts.
x = tensors["wte.weight"][torch.tensor([1, 2, 3])] + tensors["wpe.weight"][:3]
for i in range(L):
    p = f"h.{i}."
    h = torch.nn.functional.layer_norm(x, [H], tensors[p + "ln_1.weight"], tensors[p + "ln_1.bias"])
    q, k, v = (h @ tensors[p + "attn.c_attn.weight"] + tensors[p + "attn.c_attn.bias"]).split(H, dim=-1)
    heads = lambda t: t.view(3, 4, H // 4).transpose(0, 1)
    a = torch.nn.functional.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True) \
        if hasattr(torch.nn.functional, "scaled_dot_product_attention") else None
    if a is None:
        att = (heads(q) @ heads(k).transpose(-1, -2)) / (H // 4) ** 0.5
        att = att.masked_fill(torch.triu(torch.ones(3, 3, dtype=torch.bool), 1), float("-inf")).softmax(-1)
        a = att @ heads(v)
    x = x + a.transpose(0, 1).reshape(3, H) @ tensors[p + "attn.c_proj.weight"] + tensors[p + "attn.c_proj.bias"]
    h = torch.nn.functional.layer_norm(x, [H], tensors[p + "ln_2.weight"], tensors[p + "ln_2.bias"])
    h = torch.nn.functional.gelu(h @ tensors[p + "mlp.c_fc.weight"] + tensors[p + "mlp.c_fc.bias"], approximate="tanh")
    x = x + h @ tensors[p + "mlp.c_proj.weight"] + tensors[p + "mlp.c_proj.bias"]
logits = torch.nn.functional.layer_norm(x, [H], tensors["ln_f.weight"], tensors["ln_f.bias"]) @ tensors["wte.weight"].T
assert logits.shape == (3, V) and torch.isfinite(logits).all()
print(f"{len(tensors)} tensors with GPT-2's names and shapes, step {meta['step']}; a forward pass runs")
PYEOF

# Two tensor-parallel ranks, two data ranks each keeping half of the
# optimizer states (parallel.shard: optimizer), and two keeping half of
# everything (full): the shards are joined into the same weights one rank
# trains (up to rounding, which AdamW can magnify where a gradient is near
# zero).
job "$WORK/two.yaml" "$WORK/two-ckpt" 10 2
job "$WORK/sharded.yaml" "$WORK/sharded-ckpt" 10 1 2 optimizer
job "$WORK/full.yaml" "$WORK/full-ckpt" 10 1 2 full
TWO="$("$FERRY" submit "$WORK/two.yaml" -o json | json "d['id']")"
SHARDED="$("$FERRY" submit "$WORK/sharded.yaml" -o json | json "d['id']")"
FULL="$("$FERRY" submit "$WORK/full.yaml" -o json | json "d['id']")"
"$FERRY" watch "$TWO" >"$WORK/two.watch" 2>&1 || fail "the tensor-parallel job failed: $(tail -3 "$WORK/two.watch")"
"$FERRY" watch "$SHARDED" >"$WORK/sharded.watch" 2>&1 || fail "the sharded job failed: $(tail -3 "$WORK/sharded.watch")"
"$FERRY" watch "$FULL" >"$WORK/full.watch" 2>&1 || fail "the fully sharded job failed: $(tail -3 "$WORK/full.watch")"
[ -d "$WORK/sharded-ckpt/rank1" ] || fail "the second data rank wrote no checkpoint"
"$FERRY" export "$TWO" "$WORK/two.safetensors" || fail "ferry export of the tensor-parallel job failed"
"$FERRY" export "$SHARDED" "$WORK/sharded.safetensors" || fail "ferry export of the sharded job failed"
"$FERRY" export "$FULL" "$WORK/full.safetensors" || fail "ferry export of the fully sharded job failed"
for parallel in two sharded full; do
"$PY" - "$WORK/one.safetensors" "$WORK/$parallel.safetensors" "$parallel" <<'PYEOF' || fail "$parallel export differs from one rank's"
import json, struct, sys
import torch
def load(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n]); header.pop("__metadata__")
    body = bytearray(data[8 + n:])
    return {k: torch.frombuffer(body, dtype=torch.float32, offset=v["data_offsets"][0],
                                count=(v["data_offsets"][1] - v["data_offsets"][0]) // 4).reshape(v["shape"])
            for k, v in header.items()}
one, other = load(sys.argv[1]), load(sys.argv[2])
assert one.keys() == other.keys()
worst = max((one[k] - other[k]).abs().max().item() for k in one)
print(f"{sys.argv[3]} and one-rank exports differ by at most {worst:.2e}")
assert worst < 1e-3, worst  # rounding; a misjoined shard is off by ~0.02
PYEOF
done

# A running job exports its newest checkpoint; before its first, the
# refusal says when there will be one.
job "$WORK/long.yaml" "$WORK/long-ckpt" 100000
LONG="$("$FERRY" submit "$WORK/long.yaml" -o json | json "d['id']")"
set +e; out="$("$FERRY" export "$LONG" "$WORK/long.safetensors" 2>&1)"; rc=$?; set -e
if [ "$rc" -ne 0 ]; then
  grep -qF "failed precondition: checkpoint.dir: no checkpoint yet" <<<"$out" || fail "early export: $out"
  echo "refused as expected before the first checkpoint"
fi
for _ in $(seq 1 300); do
  "$FERRY" export "$LONG" "$WORK/long.safetensors" >"$WORK/long.txt" 2>&1 && break
  sleep 0.2
done
grep -q "^exported 28 tensors" "$WORK/long.txt" || fail "export of the running job: $(cat "$WORK/long.txt")"
[ "$("$FERRY" get "$LONG" -o json | json "d['state']")" = "JOB_STATE_RUNNING" ] || fail "the job is no longer running"
"$FERRY" cancel "$LONG" >/dev/null
set +e; "$FERRY" watch "$LONG" >/dev/null 2>&1; set -e
"$FERRY" info >/dev/null || fail "ferryd is not answering after the exports"

# A Llama-family job exported as a Hugging Face model folder: config.json,
# model.safetensors with Llama's names (q/k/v and gate/up split back out of
# their fused layers), generation_config.json; an independent PyTorch
# forward (llama_reference.py's) reads it and gives the loss Ferry's eval
# gives; a new job starts from the folder (model.init_from) and generation
# runs from it.
cat >"$WORK/llama.yaml" <<YAML
name: llama-export
model: {preset: llama-tiny, layers: 2, seq_len: 32}
data: {synthetic: {}}
train: {steps: 6, batch_size: 4, lr: 3.0e-3, threads: 1}
checkpoint: {dir: $WORK/llama-ckpt, every_steps: 6, keep: 1}
YAML
LLAMA="$("$FERRY" submit "$WORK/llama.yaml" -o json | json "d['id']")"
"$FERRY" watch "$LLAMA" >"$WORK/llama.watch" 2>&1 || fail "the llama job failed: $(tail -3 "$WORK/llama.watch")"
"$FERRY" export "$LLAMA" "$WORK/llama-hf" >"$WORK/llama.txt" || fail "folder export failed: $(cat "$WORK/llama.txt")"
cat "$WORK/llama.txt"
grep -q "^exported 21 tensors (.* in 3 files) of $LLAMA at step 6 to $WORK/llama-hf$" "$WORK/llama.txt" \
  || fail "ferry export said: $(cat "$WORK/llama.txt")"
[ "$(ls "$WORK/llama-hf" | tr '\n' ' ')" = "config.json generation_config.json model.safetensors " ] \
  || fail "the folder holds: $(ls "$WORK/llama-hf")"
expect_refusal 2 "exists; export a model folder into a new one" -- export "$LLAMA" "$WORK/llama-hf"
"$PY" - "$WORK/llama-hf" "$RUNFILES/engine/train" <<'PYEOF' || fail "the exported folder is not Llama's layout"
import json, struct, sys
import torch
sys.path.insert(0, sys.argv[2])
import llama_reference as ref

folder = sys.argv[1]
config = json.load(open(folder + "/config.json"))
assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"], config
assert (config["num_hidden_layers"], config["hidden_size"], config["num_key_value_heads"]) == (2, 128, 2), config
assert config["rope_scaling"]["rope_type"] == "llama3" and config["tie_word_embeddings"] is False, config
data = open(folder + "/model.safetensors", "rb").read()
(n,) = struct.unpack("<Q", data[:8])
header = json.loads(data[8:8 + n]); meta = header.pop("__metadata__")
assert meta["model_type"] == "llama" and meta["step"] == "6", meta
body = bytearray(data[8 + n:])
w = {k: torch.frombuffer(body, dtype=torch.float32, offset=v["data_offsets"][0],
                         count=(v["data_offsets"][1] - v["data_offsets"][0]) // 4).reshape(v["shape"]).double()
     for k, v in header.items()}
class A: pass
a = A()
a.model_type, a.layers, a.hidden, a.heads = "llama", 2, 128, 4
a.kv_heads, a.head_dim, a.intermediate, a.vocab = 2, 32, 352, 256
a.tied, a.rope_theta, a.llama3_factor, a.llama3_original = False, 500000.0, 8.0, 64
a.eps = config["rms_norm_eps"]
expected = dict(ref.names(a))
assert sorted(w) == sorted(expected), sorted(set(w) ^ set(expected))
for name, shape in expected.items():
    assert tuple(w[name].shape) == tuple(shape), (name, w[name].shape, shape)
tokens = torch.arange(33).remainder(256).unsqueeze(0)
loss = ref.forward_loss(w, tokens, a).item()
assert 0 < loss < 10, loss
print(f"{len(w)} tensors with Llama's names and shapes; the reference's loss on a window: {loss:.4f}")
PYEOF
cat >"$WORK/from-folder.yaml" <<YAML
name: from-folder
model: {init_from: $WORK/llama-hf, seq_len: 32}
data: {synthetic: {}}
train: {steps: 2, batch_size: 2, lr: 1.0e-4, threads: 1}
YAML
FROM="$("$FERRY" submit "$WORK/from-folder.yaml" -o json | json "d['id']")"
"$FERRY" watch "$FROM" >"$WORK/from.watch" 2>&1 || fail "the job from the folder failed: $(tail -3 "$WORK/from.watch")"
[ "$("$FERRY" get "$FROM" -o json | json "d['spec']['model']['architecture']['model_type']")" = "llama" ] \
  || fail "the job from the folder is not a llama: $("$FERRY" get "$FROM" -o json)"
"$FERRY" generate --weights="$WORK/llama-hf" --prompt_ids=1,2,3 --max_tokens=5 --temperature=0 -o json \
  >"$WORK/gen.json" 2>&1 || fail "generate from the folder: $(cat "$WORK/gen.json")"
echo "generated from the folder: $(cat "$WORK/gen.json" | head -c 300)"

# ferry-worker --export on its own: bad usage exits 2 with the field named.
printf 'name: x\ndata: {synthetic: {}}\n' >"$WORK/nodir.yaml"
set +e; out="$("$WORKER" --export="$WORK/x.safetensors" --spec="$WORK/nodir.yaml" 2>&1)"; rc=$?; set -e
[ "$rc" -eq 2 ] && grep -q "checkpoint.dir" <<<"$out" || fail "ferry-worker --export without checkpoint.dir: $rc $out"
echo "PASS"
