#!/bin/sh
# git-fetch.sh REPO COMMIT DIR: check out exactly COMMIT (40 hex) of REPO into DIR.
# A branch or tag is refused: the stack pins commits, and the checkout is verified.
set -eu
[ $# -eq 3 ] || { echo "usage: git-fetch.sh REPO COMMIT DIR" >&2; exit 2; }
repo=$1 commit=$2 dir=$3
if ! printf '%s' "$commit" | grep -Eq '^[0-9a-f]{40}$'; then
  echo "git-fetch.sh: '$commit' is not a 40-hex commit (pin it in the stack, or run toolbox bump)" >&2
  exit 2
fi
[ -s /run/secrets/ca ] && export GIT_SSL_CAINFO=/run/secrets/ca
git init -q "$dir"
git -C "$dir" remote add origin "$repo"
git -C "$dir" -c protocol.version=2 fetch -q --depth 1 origin "$commit"
git -C "$dir" -c advice.detachedHead=false checkout -q FETCH_HEAD
got=$(git -C "$dir" rev-parse HEAD)
if [ "$got" != "$commit" ]; then
  echo "git-fetch.sh: $repo gave $got, expected $commit" >&2
  exit 1
fi
