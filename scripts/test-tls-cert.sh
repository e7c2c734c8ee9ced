#!/usr/bin/env bash
# A certificate authority of its own and a server certificate it signs, for HTTPS on this
# machine only (the tests' and the E2B suite's `guilds serve --tls-cert`):
#
#   bash scripts/test-tls-cert.sh DIR NAME
#
# writes DIR/ca.pem (what clients trust: SSL_CERT_FILE, curl --cacert), DIR/server.pem and
# DIR/server.key (for NAME and *.NAME, valid two days). Needs openssl.
set -euo pipefail
DIR=${1:?usage: test-tls-cert.sh DIR NAME}
NAME=${2:?usage: test-tls-cert.sh DIR NAME}
mkdir -p "$DIR"
cd "$DIR"
curve=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
openssl req -x509 "${curve[@]}" -days 2 -subj "/CN=guilds test authority" -keyout ca.key -out ca.pem 2>/dev/null
openssl req "${curve[@]}" -subj "/CN=$NAME" -keyout server.key -out server.csr 2>/dev/null
printf 'subjectAltName=DNS:%s,DNS:*.%s\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' "$NAME" "$NAME" >server.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile server.ext \
  -out server.pem 2>/dev/null
rm -f server.csr server.ext ca.srl ca.key
chmod 600 server.key
