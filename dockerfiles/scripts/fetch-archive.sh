#!/bin/sh
# fetch-archive.sh --url URL --sha256 HEX --dest DIR [--strip N] --expect PATH...:
# download + sha256 check, then check that the archive holds every expected path (so a tarball
# of the wrong layout fails here, not at run time), then extract into DIR.
set -eu
here=$(dirname "$0")
url="" sum="" dest="" strip=0 expect=""
while [ $# -gt 0 ]; do
  case "$1" in
    --url) url=$2; shift 2 ;;
    --sha256) sum=$2; shift 2 ;;
    --dest) dest=$2; shift 2 ;;
    --strip) strip=$2; shift 2 ;;
    --expect) expect="$expect $2"; shift 2 ;;
    *) echo "fetch-archive.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$dest" ] || { echo "fetch-archive.sh: need --dest" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$here/fetch-file.sh" --url "$url" --sha256 "$sum" --out "$work/archive"
tar -tf "$work/archive" > "$work/list"
# Entries as they land after --strip-components, without a leading ./
awk -v n="$strip" '{ sub(/^\.\//, ""); k = split($0, p, "/"); s = ""; for (i = n + 1; i <= k; i++) s = s (s == "" ? "" : "/") p[i]; if (s != "") print s }' "$work/list" > "$work/paths"
missing=""
for p in $expect; do
  grep -Fxq "$p" "$work/paths" || grep -Fxq "$p/" "$work/paths" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "fetch-archive.sh: $url has the wrong layout; missing:$missing" >&2
  exit 1
fi
mkdir -p "$dest"
tar -xf "$work/archive" -C "$dest" --strip-components="$strip" --no-same-owner
