#!/usr/bin/env bash
# Installs those of the Debian packages named that are not installed (as root),
# saying which on stderr; nothing when all are there.
#
#   bash scripts/apt-missing.sh LABEL PACKAGE...      (LABEL starts the message)
set -euo pipefail
label=$1
shift
missing=()
for p in "$@"; do
  dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null | grep -qx installed || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "$label: installing ${missing[*]}" >&2
apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 \
  --no-install-recommends "${missing[@]}" >&2
