#!/usr/bin/env bash
# ferry generate through ferryd: a job trained with checkpoints continues a
# prompt (ids for synthetic data, text for a token file with a tokenizer);
# greedy generation repeats itself and matches generation from the job's
# exported weights file; and bad requests are refused with the right codes.
set -euo pipefail

RUNFILES="${TEST_SRCDIR:-$PWD}/ferry"
source "$RUNFILES/tests/lib/ferryd.sh"
WORK="$(mktemp -d "${TEST_TMPDIR:-/tmp}/generate.XXXXXX")"

fail() { echo "FAIL: $*" >&2; echo "--- ferryd log ---" >&2; tail -40 "$WORK/ferryd.log" >&2 || true; exit 1; }

"$FERRYD" --state_dir="$WORK/state" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
  --allowed_roots="$WORK" --ready_file="$WORK/ready.json" >"$WORK/ferryd.log" 2>&1 &
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

# Synthetic data: no tokenizer, ids in and out.
cat >"$WORK/chain.yaml" <<YAML
name: chain
model: {layers: 2, hidden: 32, heads: 4, vocab_size: 64, seq_len: 16}
data: {synthetic: {}}
train: {steps: 10, batch_size: 4, lr: 3.0e-3, threads: 1}
checkpoint: {dir: $WORK/chain-ckpt, every_steps: 5}
YAML
CHAIN="$("$FERRY" submit "$WORK/chain.yaml" -o json | json "d['id']")"
"$FERRY" watch "$CHAIN" >"$WORK/chain.watch" 2>&1 || fail "the job failed: $(tail -3 "$WORK/chain.watch")"
"$FERRY" generate "$CHAIN" --prompt_ids=1,2,3 --max_tokens=6 --temperature=0 >"$WORK/greedy.txt" 2>"$WORK/greedy.err" \
  || fail "ferry generate failed: $(cat "$WORK/greedy.txt" "$WORK/greedy.err")"
cat "$WORK/greedy.txt" "$WORK/greedy.err"
grep -Eq '^[0-9]+( [0-9]+){5}$' "$WORK/greedy.txt" || fail "six ids expected: $(cat "$WORK/greedy.txt")"
grep -q "6 tokens after a prompt of 3" "$WORK/greedy.err" || fail "no summary: $(cat "$WORK/greedy.err")"
"$FERRY" generate "$CHAIN" --prompt_ids=1,2,3 --max_tokens=6 --temperature=0 2>/dev/null | cmp -s - "$WORK/greedy.txt" \
  || fail "greedy generation differs between two runs"
"$FERRY" generate "$CHAIN" --prompt_ids=5 --max_tokens=4 --seed=3 -o json >"$WORK/sampled.json" || fail "-o json failed"
[ "$(json "d['generated_tokens'], len(d['ids']), d['step'], d['tokenizer']" <"$WORK/sampled.json")" = "4 4 10 " ] \
  || fail "ferry generate -o json: $(cat "$WORK/sampled.json")"
ls "$WORK/state/jobs/$CHAIN" | grep -q "generate" && fail "the daemon left files: $(ls "$WORK/state/jobs/$CHAIN")"

# The same model from its exported weights file gives the same tokens.
"$FERRY" export "$CHAIN" "$WORK/chain.safetensors" >/dev/null || fail "ferry export failed"
"$FERRY" generate --weights="$WORK/chain.safetensors" --prompt_ids=1,2,3 --max_tokens=6 --temperature=0 \
  2>/dev/null >"$WORK/weights.txt" || fail "ferry generate --weights failed: $(cat "$WORK/weights.txt")"
cmp -s "$WORK/weights.txt" "$WORK/greedy.txt" \
  || fail "the weights file generated $(cat "$WORK/weights.txt"), the job $(cat "$WORK/greedy.txt")"
"$FERRY" generate --weights="$WORK/chain.safetensors" --tokenizer=byte --prompt=ab --max_tokens=3 >/dev/null 2>&1 \
  && fail "a byte tokenizer (256 ids) was accepted for a model of 64"
expect_refusal 2 "tokenizer: its vocabulary of 256 ids is larger than the model's 64" -- \
  generate --weights="$WORK/chain.safetensors" --tokenizer=byte --prompt=ab --max_tokens=3

# A token file with a tokenizer: text in and out.
for i in $(seq 1 200); do echo "the cat sat on the mat. the dog sat on the log."; done >"$WORK/corpus.txt"
"$FERRY" data prepare --out="$WORK/corpus.tokens" "$WORK/corpus.txt" >/dev/null 2>&1 || fail "data prepare failed"
cat >"$WORK/text.yaml" <<YAML
name: text
model: {layers: 2, hidden: 32, heads: 4, vocab_size: 256, seq_len: 32}
data: {path: $WORK/corpus.tokens}
train: {steps: 40, batch_size: 8, lr: 1.0e-2, threads: 1}
checkpoint: {dir: $WORK/text-ckpt, every_steps: 40}
YAML
TEXT="$("$FERRY" submit "$WORK/text.yaml" -o json | json "d['id']")"
"$FERRY" watch "$TEXT" >"$WORK/text.watch" 2>&1 || fail "the text job failed: $(tail -3 "$WORK/text.watch")"
"$FERRY" generate "$TEXT" --prompt="the cat" --max_tokens=20 --temperature=0 >"$WORK/text.txt" 2>"$WORK/text.err" \
  || fail "ferry generate with text failed: $(cat "$WORK/text.txt" "$WORK/text.err")"
cat "$WORK/text.txt"
[ "$(json "d['tokenizer'], d['generated_tokens']" < <("$FERRY" generate "$TEXT" --prompt="the cat" --max_tokens=20 \
  --temperature=0 -o json))" = "byte 20" ] || fail "the text job's generation is not byte-tokenised"
[ "$(wc -c <"$WORK/text.txt")" -ge 2 ] || fail "no text came out: $(cat "$WORK/text.txt")"

# Refusals.
expect_refusal 2 "not found" -- generate j-00000000 --prompt_ids=1
expect_refusal 2 "temperature" -- generate "$CHAIN" --prompt_ids=1 --temperature=-1
expect_refusal 2 "top_p" -- generate "$CHAIN" --prompt_ids=1 --top_p=0
expect_refusal 2 "top_p" -- generate "$CHAIN" --prompt_ids=1 --top_p=1.5
expect_refusal 2 "max_tokens" -- generate "$CHAIN" --prompt_ids=1 --max_tokens=0
expect_refusal 2 "prompt: the job's data records no tokenizer" -- generate "$CHAIN" --prompt=hello
expect_refusal 2 "outside the model's vocabulary of 64" -- generate "$CHAIN" --prompt_ids=1,64
expect_refusal 2 "permission denied" -- generate --weights=/etc/passwd --prompt_ids=1
expect_refusal 2 "generate needs --prompt" -- generate "$CHAIN"
printf 'name: plain\nmodel: {layers: 1, hidden: 32, heads: 4, vocab_size: 64, seq_len: 16}\ndata: {synthetic: {}}\ntrain: {steps: 2, batch_size: 2}\n' \
  >"$WORK/plain.yaml"
PLAIN="$("$FERRY" submit "$WORK/plain.yaml" -o json | json "d['id']")"
expect_refusal 2 "failed precondition: checkpoint.dir: job $PLAIN keeps no checkpoints" -- generate "$PLAIN" --prompt_ids=1
"$FERRY" watch "$PLAIN" >/dev/null 2>&1 || fail "the job without checkpoints failed"
echo PASS
