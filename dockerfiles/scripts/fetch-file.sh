#!/bin/sh
# fetch-file.sh --url URL --sha256 HEX --out FILE: download, then check the sha256 before the
# file gets its name. --sha256 UNVERIFIED (only for pins marked unverified) prints the hash instead.
set -eu
url="" sum="" out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --url) url=$2; shift 2 ;;
    --sha256) sum=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "fetch-file.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$url" ] && [ -n "$sum" ] && [ -n "$out" ] || { echo "fetch-file.sh: need --url, --sha256, --out" >&2; exit 2; }
if [ "$sum" != UNVERIFIED ] && ! printf '%s' "$sum" | grep -Eq '^[0-9a-f]{64}$'; then
  echo "fetch-file.sh: --sha256 must be 64 hex characters, got '$sum'" >&2; exit 2
fi
mkdir -p "$(dirname "$out")"
tmp="$out.part"
set -- --fail --silent --show-error --location --retry 3 --output "$tmp"
[ -s /run/secrets/ca ] && set -- --cacert /run/secrets/ca "$@"
curl "$@" "$url"
if [ "$sum" = UNVERIFIED ]; then
  echo "fetch-file.sh: WARNING: $url is not verified; its sha256 is:" >&2
  sha256sum "$tmp" | cut -d' ' -f1 >&2
else
  got=$(sha256sum "$tmp" | cut -d' ' -f1)
  if [ "$got" != "$sum" ]; then
    rm -f "$tmp"
    echo "fetch-file.sh: sha256 mismatch for $url: pinned $sum, downloaded $got" >&2; exit 1
  fi
fi
mv "$tmp" "$out"
