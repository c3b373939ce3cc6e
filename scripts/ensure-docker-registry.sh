#!/usr/bin/env bash
# The real OCI registry of the ModelCatalog tests (tests/oci_registry.py): Debian's docker-registry
# (distribution 2.8; the tests run `docker-registry serve CONFIG` themselves on a free port, the
# package's own service is not used) and openssl (the token-auth test signs its JWTs with it).
# Idempotent: nothing to do when both commands exist. Without apt (or root) it says so and stops
# without failing `make test`; the tests that need the registry then skip, naming this script.
set -uo pipefail
missing=()
command -v docker-registry >/dev/null || missing+=(docker-registry)
command -v openssl >/dev/null || missing+=(openssl)
[ ${#missing[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null || [ "$(id -u)" != 0 ]; then
  echo "==> ${missing[*]} not installed and apt-get (as root) not available: the OCI catalog tests will skip" >&2
  exit 0
fi
echo "==> installing ${missing[*]} (apt) for the ModelCatalog tests"
apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
  || echo "==> apt-get install ${missing[*]} failed: the OCI catalog tests will skip" >&2
exit 0
