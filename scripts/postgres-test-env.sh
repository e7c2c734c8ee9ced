#!/usr/bin/env bash
# Start a local PostgreSQL for the run record's PostgreSQL tests (Debian's
# packages, as root), and print the URL to export as GUILDS_TEST_POSTGRES_URL.
# Idempotent: an already running cluster and an existing role/database are kept.
set -euo pipefail
if ! command -v pg_ctlcluster >/dev/null; then
  apt-get install -y -qq postgresql >/dev/null
fi
version=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
if ! pg_lsclusters -h | awk -v v="$version" '$1 == v && $2 == "main"' | grep -q .; then
  pg_createcluster "$version" main >/dev/null
fi
pg_ctlcluster "$version" main start >/dev/null 2>&1 || true
for _ in $(seq 50); do
  pg_isready -q -h 127.0.0.1 -p 5432 && break
  sleep 0.2
done
su postgres -c "psql -q -tc \"SELECT 1 FROM pg_roles WHERE rolname='guilds'\"" | grep -q 1 \
  || su postgres -c "psql -q -c \"CREATE ROLE guilds LOGIN SUPERUSER PASSWORD 'guilds'\""
su postgres -c "psql -q -tc \"SELECT 1 FROM pg_database WHERE datname='guilds_test'\"" | grep -q 1 \
  || su postgres -c "createdb -O guilds guilds_test"
echo "postgresql://guilds:guilds@127.0.0.1:5432/guilds_test"
