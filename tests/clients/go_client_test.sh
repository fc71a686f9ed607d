#!/usr/bin/env bash
# The Go example client (client/go) against a live ferryd: built offline from
# the GOPATH tree //proto:ferry_v1_go generates and Debian's Go packages, it
# watches a job to SUCCEEDED and prints its placement; the watch resumes after
# dropped connections without losing an event, and follows the job through a
# graceful restart of the daemon.
set -euo pipefail
CLIENT_NAME=go
source "${TEST_SRCDIR:-$PWD}/ferry/tests/clients/lib.sh"

# Build in a GOPATH of our own (the generated tree) beside Debian's
# /usr/share/gocode, with a writable cache; no network, no modules.
mkdir -p "$WORK/gopath" "$WORK/client"
cp -rL "$RUNFILES/proto/go/src" "$WORK/gopath/"
cp -L "$RUNFILES/client/go/main.go" "$WORK/client/"
export GO111MODULE=off GOPATH="$WORK/gopath:/usr/share/gocode" GOCACHE="$WORK/gocache" \
  GOFLAGS= GOPROXY=off GOENV=off HOME="$WORK"
UNFORMATTED="$(gofmt -l "$WORK/client" "$WORK/gopath/src")"
[ -z "$UNFORMATTED" ] || fail "not gofmt-clean: $UNFORMATTED"
start="$(date +%s)"
(cd "$WORK/client" && go vet . && go build -o "$WORK/ferry-client" .) >"$WORK/build.out" 2>&1 \
  || fail "go build failed: $(cat "$WORK/build.out")"
echo "ok: built with $(go version | cut -d' ' -f3) in $(($(date +%s) - start)) s"

CLIENT=("$WORK/ferry-client")
start_daemon
start_proxy

scenario_direct --preset=gpt2-tiny
scenario_dropped_stream
scenario_daemon_restart stop_daemon
scenario_errors
scenario_snapshot_fallback
scenario_tls
echo PASS
