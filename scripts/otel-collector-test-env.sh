#!/usr/bin/env bash
# An OpenTelemetry Collector of our own for the traces tests: the OTLP receiver
# (HTTP, on loopback) and the file exporter, which writes every request it gets
# as one line of OTLP JSON.
#
#   eval "$(bash scripts/otel-collector-test-env.sh)"   # prints the GUILDS_TEST_OTLP_* exports
#   bash scripts/otel-collector-test-env.sh --build      # only builds it (CI, beside the other builds)
#   bash scripts/otel-collector-test-env.sh --stop       # stops the collector
#
# The collector is built from Go modules: scripts/otel-collector/ is the module
# (main.go: the program the Collector's builder generates for these two
# components; go.mod and go.sum pin the core collector's otelcol and otlpreceiver
# and contrib's fileexporter at one release, and everything they need, so a build
# fetches only what it compiles). The binary is kept in $GUILDS_OTELCOL_CACHE
# (default /var/cache/guilds-otelcol) under that release, so a later run builds nothing.
#
# Idempotent: starts the collector only if its port does not answer. It runs
# under $GUILDS_OTELCOL_DIR (default /tmp/guilds-otelcol): its config, pidfile,
# log, and spans.jsonl, emptied at each start. Progress goes to stderr; stdout is
# only the export lines:
#   GUILDS_TEST_OTLP_ENDPOINT  the receiver's base URL (OTEL_EXPORTER_OTLP_ENDPOINT)
#   GUILDS_TEST_OTLP_SPANS     the file the received spans are written to
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODULE="$ROOT/scripts/otel-collector"
version=$(sed -n 's#^\tgo.opentelemetry.io/collector/otelcol v\(.*\)$#\1#p' "$MODULE/go.mod")
cache=${GUILDS_OTELCOL_CACHE:-/var/cache/guilds-otelcol}
bin="$cache/v$version/otelcol"
DIR=${GUILDS_OTELCOL_DIR:-/tmp/guilds-otelcol}
PORT=${GUILDS_OTELCOL_PORT:-14318}

log() { echo "otel-collector-test-env: $*" >&2; }

build() {  # in a folder of its own, then renamed: a build cut off leaves nothing that looks whole
  [ -x "$bin" ] && return 0
  command -v go >/dev/null || PATH=$PATH:/usr/local/go/bin
  command -v go >/dev/null || { log "no go on PATH (Go 1.26 builds the collector)"; exit 1; }
  export GOWORK=off CGO_ENABLED=0 GOFLAGS=-mod=readonly
  mkdir -p "$cache"
  exec 8>"$cache/.build.lock"  # one build at a time: a second waits, then finds the first's
  flock 8
  if [ -x "$bin" ]; then exec 8>&-; return 0; fi
  local part="$cache/v$version.part" began=$SECONDS
  rm -rf "$part" && mkdir -p "$part/module"
  cp "$MODULE/main.go" "$MODULE/go.mod" "$MODULE/go.sum" "$part/module/"
  log "building the collector v$version"
  (cd "$part/module" && go build -trimpath -ldflags "-s -w" -o "$part/otelcol" . >&2)
  mkdir -p "$cache" && rm -rf "$cache/v$version" && mv "$part" "$cache/v$version"
  exec 8>&-
  log "built in $((SECONDS - began)) s"
}

answers() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }

start() {
  answers && [ -f "$DIR/otelcol.pid" ] && kill -0 "$(cat "$DIR/otelcol.pid")" 2>/dev/null && return 0
  answers && { log "port $PORT answers but is not our collector's (GUILDS_OTELCOL_PORT picks another)"; exit 1; }
  mkdir -p "$DIR" && : >"$DIR/spans.jsonl"
  cat >"$DIR/config.yaml" <<EOF
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:$PORT
exporters:
  file:
    path: $DIR/spans.jsonl
    flush_interval: 100ms
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [file]
EOF
  log "starting the collector on 127.0.0.1:$PORT ($DIR)"
  setsid "$bin" --config "$DIR/config.yaml" </dev/null >"$DIR/otelcol.log" 2>&1 &
  echo $! >"$DIR/otelcol.pid"
  for _ in $(seq 100); do answers && return 0; sleep 0.1; done
  log "the collector did not answer in 10 s:"; tail -5 "$DIR/otelcol.log" >&2; exit 1
}

stop() {
  [ -f "$DIR/otelcol.pid" ] || { log "no collector of ours to stop"; return 0; }
  kill "$(cat "$DIR/otelcol.pid")" 2>/dev/null || true
  rm -f "$DIR/otelcol.pid"
}

case "${1:-}" in
  --stop) stop; exit 0 ;;
  --build) build; echo "$bin"; exit 0 ;;
esac
build
start
echo "export GUILDS_TEST_OTLP_ENDPOINT=http://127.0.0.1:$PORT"
echo "export GUILDS_TEST_OTLP_SPANS=$DIR/spans.jsonl"
