#!/usr/bin/env bash
# Build the wheel, install it into a clean virtual environment, and use it there:
# the app's templates and static files and the helpers' sources are in it,
# `guilds --version` answers, and a `guilds call` builds the helpers from the
# installed sources and runs a command.
#
#   bash scripts/wheel-check.sh [PYTHON]     (PYTHON: the interpreter for the clean venv, default python3)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${1:-python3}
WORK=$(mktemp -d /tmp/guilds-wheel.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
fail() { echo "wheel check: $*" >&2; exit 1; }

"$PYTHON" -m pip wheel -q --no-deps -w "$WORK/dist" . >"$WORK/build.log" 2>&1 || { cat "$WORK/build.log" >&2; fail "the wheel did not build"; }
WHEEL=$(ls "$WORK"/dist/guilds-*.whl)
echo "wheel check: built $(basename "$WHEEL")"

listing=$("$PYTHON" -m zipfile -l "$WHEEL")
for path in guilds/web/templates/ guilds/web/static/ guilds_code/__main__.py guilds_harness/__main__.py \
    guilds/sandbox/helpers.py guilds/adapters/anthropic.py; do
  grep -q "$path" <<<"$listing" || fail "$path is missing from the wheel"
done
[ "$(grep -c 'guilds/web/templates/.*\.html' <<<"$listing")" -gt 0 ] || fail "no templates in the wheel"

"$PYTHON" -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q "$WHEEL" >"$WORK/install.log" 2>&1 || { cat "$WORK/install.log" >&2; fail "the wheel did not install"; }
cd "$WORK"  # away from the checkout: only the installed package can be imported
version=$("$WORK/venv/bin/guilds" --version)
[ "$version" = "guilds $("$WORK/venv/bin/python" -c 'import importlib.metadata as m; print(m.version("guilds"))')" ] \
  || fail "guilds --version said: $version"
export GUILDS_DATA=$WORK/data
mkdir -p "$GUILDS_DATA"
printf '[agent]\nhome = "%s/home"\nsandbox = "local"\n' "$WORK" >"$GUILDS_DATA/settings.toml"
out=$("$WORK/venv/bin/guilds" call shell '{"command": "echo from the wheel"}')
[ "$out" = $'from the wheel\nremaining_tool_calls: 199' ] || fail "guilds call said: $out"
ls "$GUILDS_DATA"/helpers/guilds-code-*.py >/dev/null || fail "the helpers were not built into the data folder"
"$WORK/venv/bin/python" - <<'EOF' || fail "the installed app cannot render"
import guilds.web.app, pathlib, importlib.resources as r
root = r.files("guilds.web")
assert any(p.name.endswith(".html") for p in (root / "templates").iterdir())
assert any(p.name.endswith(".css") for p in (root / "static").iterdir())
EOF
echo "wheel check: $version installs into a clean venv and runs a call"
