#!/usr/bin/env bash
# E2B's own Python SDK suite (its sandbox-level tests), unedited, against `guilds serve --e2b`.
#
#   bash scripts/e2b-suite.sh TESTS [PYTHON]
#
# TESTS: E2B's packages/python-sdk/tests folder (of the SDK release pinned below), kept
# outside this repository; PYTHON: guilds' venv python (default .venv/bin/python).
# 1. The pinned SDK and the suite's test tools into a venv of their own
#    ($E2B_SUITE_VENV, default /tmp/guilds-e2b-suite-venv; a second run reuses it).
# 2. `guilds serve --e2b` on a fresh data folder, its agent on $E2B_SUITE_BACKEND
#    (default bwrap), and the suite run with the variables it prints: by default over HTTPS
#    by E2B's host names (E2B_DOMAIN=guilds.localhost:PORT, a certificate of a test authority
#    of its own, SSL_CERT_FILE), which needs this machine's resolver to resolve *.localhost
#    (libnss-myhostname) and openssl; E2B_SUITE_BY=urls: by E2B_API_URL and E2B_SANDBOX_URL.
# 3. Each area's passed/total and every test that did not pass, with its reason
#    (scripts/e2b_suite_count.py); fails when fewer pass than the floor
#    ($E2B_SUITE_FLOOR, default FLOOR below).
# The suite's settings (its pytest.ini) are restated here, so TESTS alone is enough.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
TESTS=${1:?usage: e2b-suite.sh TESTS [PYTHON]}
TESTS=$(cd "$TESTS" 2>/dev/null && pwd) || { echo "e2b suite: $1 is not a folder" >&2; exit 2; }
PYTHON=${2:-$ROOT/.venv/bin/python}
SDK_VERSION=2.45.1
VENV=${E2B_SUITE_VENV:-/tmp/guilds-e2b-suite-venv}
BACKEND=${E2B_SUITE_BACKEND:-bwrap}
BY=${E2B_SUITE_BY:-domain}
DOMAIN=guilds.localhost
FLOOR=${E2B_SUITE_FLOOR:-330}  # the count on bwrap that a change may only raise (docs/e2b.md)
read -r -a AREAS <<<"${E2B_SUITE_AREAS:-sync/sandbox_sync async/sandbox_async sync/api_sync async/api_async}"
# E2B_SUITE_AREAS: other folders of the suite instead (the template builds':
#   "sync/template_sync async/template_async shared/template", with E2B_SUITE_FLOOR of their own)
WORK=$(mktemp -d /tmp/guilds-e2b-suite.XXXXXX)
SERVER=

fail() { echo "e2b suite: $*" >&2; exit 1; }
cleanup() {
  if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; fi
  "$PYTHON" -m guilds.fronts.cli sandbox rm --config "$WORK/agent.toml" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
[ -f "$TESTS/conftest.py" ] && [ -d "$TESTS/sync/sandbox_sync" ] || fail "$TESTS is not E2B's packages/python-sdk/tests"
case $BY in
  domain)
    getent hosts "probe.$DOMAIN" >/dev/null ||
      fail "this machine does not resolve *.localhost names (install libnss-myhostname), or run with E2B_SUITE_BY=urls"
    bash scripts/test-tls-cert.sh "$WORK/tls" "$DOMAIN"
    SERVE_BY=(--tls-cert "$WORK/tls/server.pem" --tls-key "$WORK/tls/server.key" --e2b-domain "$DOMAIN") ;;
  urls) SERVE_BY=(); FLOOR=${E2B_SUITE_FLOOR:-320} ;;
  *) fail "E2B_SUITE_BY=$BY: domain or urls" ;;
esac

# --- 1. the pinned SDK -----------------------------------------------------------------
if ! "$VENV/bin/python" -c "import e2b, importlib.metadata as m; assert m.version('e2b') == '$SDK_VERSION'" 2>/dev/null; then
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install -q "e2b==$SDK_VERSION" "pytest>=9.0.3,<10" "pytest-asyncio>=1.3.0,<2" \
    "pytest-timeout>=2.4.0,<3" "python-dotenv>=1.0.0,<2" || fail "pip could not install the pinned SDK"
fi
cat >"$WORK/pytest.ini" <<INI
[pytest]
markers =
    skip_debug: skip test if E2B_DEBUG is set.
asyncio_mode = auto
asyncio_default_fixture_loop_scope = session
asyncio_default_test_loop_scope = session
addopts = --import-mode=importlib
pythonpath = $TESTS
timeout = 30
INI

# --- 2. the server ---------------------------------------------------------------------
mkdir -p "$WORK/home"
printf '[agent]\nid = "e2bsuite%s"\nhome = "%s/home"\nsandbox = "%s"\nmax_tool_calls = 100000\n[agents]\nmax_per_owner = 40\n' \
  "$$" "$WORK" "$BACKEND" >"$WORK/agent.toml"
GUILDS_DATA=$WORK/data "$PYTHON" -m guilds.fronts.cli serve --port 0 --config "$WORK/agent.toml" --e2b \
  "${SERVE_BY[@]}" >/dev/null 2>"$WORK/serve.log" </dev/null &
SERVER=$!
for _ in $(seq 600); do
  grep -q '^export E2B_API_KEY=' "$WORK/serve.log" && break
  kill -0 "$SERVER" 2>/dev/null || { cat "$WORK/serve.log" >&2; fail "guilds serve --e2b ended"; }
  sleep 0.2
done
grep -q '^export E2B_API_KEY=' "$WORK/serve.log" || { cat "$WORK/serve.log" >&2; fail "guilds serve --e2b did not start"; }
unset E2B_API_URL E2B_SANDBOX_URL E2B_DOMAIN E2B_DEBUG E2B_ACCESS_TOKEN
eval "$(grep '^export E2B_' "$WORK/serve.log")"
[ "$BY" = urls ] || export SSL_CERT_FILE=$WORK/tls/ca.pem

# --- 3. the suite ----------------------------------------------------------------------
echo "== E2B SDK $SDK_VERSION suite against guilds serve --e2b ($BACKEND, by $BY)"
(cd "$TESTS/.." && PYTHONDONTWRITEBYTECODE=1 "$VENV/bin/python" -m pytest -c "$WORK/pytest.ini" \
  --rootdir "$TESTS/.." -p no:cacheprovider -q --junitxml "$WORK/results.xml" \
  "${AREAS[@]/#/$TESTS/}" >"$WORK/pytest.log" 2>&1) || true
[ -f "$WORK/results.xml" ] || { tail -40 "$WORK/pytest.log" >&2; fail "the suite did not run"; }
[ -z "${E2B_SUITE_RESULTS:-}" ] || cp "$WORK/results.xml" "$E2B_SUITE_RESULTS"
"$PYTHON" "$ROOT/scripts/e2b_suite_count.py" "$WORK/results.xml" "$FLOOR"
