#!/bin/sh
# Compose's one-shot `secrets` service (image target `init`): fills the shared
# secrets volume before any service starts.
#
#   first run     hs256.secret (signs and verifies every token), callback.secret
#                 (signs task callbacks), grafana-admin.password: 32 random bytes
#                 each, hex; assertion.pem (the router's Ed25519 key that signs
#                 the assertion every forwarded call carries); kept on the
#                 volume across restarts
#   every run     a fresh token per example agent and for the demo caller,
#                 NAME.token, valid $TOKEN_TTL (default 30d)
#
# Files are readable only by the services' user ($OWNER, the distroless
# `nonroot` 65532; Grafana's password by Grafana's 472). Nothing secret is
# printed. SECRETS_DIR (default /secrets) is the volume.
set -eu

dir="${SECRETS_DIR:-/secrets}"
ttl="${TOKEN_TTL:-30d}"
owner="${OWNER:-65532:65532}"
grafana_owner="${GRAFANA_OWNER:-472:0}"
names="${TOKEN_NAMES:-intent_parser order_query shipping_rules reply_writer demo_user}"
umask 077
mkdir -p "$dir"

# Writes through a temp file and a rename: a reader never sees half a file.
secret() {
  if [ -s "$dir/$1" ]; then
    echo "secrets: keeping $1"
    return
  fi
  od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$dir/$1.tmp"
  mv "$dir/$1.tmp" "$dir/$1"
  echo "secrets: generated $1"
}

secret hs256.secret
secret callback.secret
secret grafana-admin.password

if [ -s "$dir/assertion.pem" ]; then
  echo "secrets: keeping assertion.pem"
else
  rm -f "$dir/assertion.pem.tmp"
  agent-reach keys generate --out "$dir/assertion.pem.tmp" >/dev/null
  mv "$dir/assertion.pem.tmp" "$dir/assertion.pem"
  echo "secrets: generated assertion.pem"
fi

for name in $names; do
  agent-reach token issue --name "$name" --secret-file "$dir/hs256.secret" --ttl "$ttl" >"$dir/$name.token.tmp"
  mv "$dir/$name.token.tmp" "$dir/$name.token"
done
echo "secrets: issued tokens ($ttl) for $names"

# Only root can hand the files to the services' users; run as another user
# (the tests do), the files stay that user's.
if [ "$(id -u)" = 0 ]; then
  chmod 0711 "$dir"
  chmod 0400 "$dir"/*
  chown "$owner" "$dir" "$dir"/*
  chown "$grafana_owner" "$dir/grafana-admin.password"
fi
