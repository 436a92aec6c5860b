#!/bin/sh
# apply-patches.sh TREE (--series DIR | PATCH...): apply patches in order to a git tree.
# Each patch is checked first; one that does not apply fails the build, naming it.
set -eu
[ $# -ge 1 ] || { echo "usage: apply-patches.sh TREE (--series DIR | PATCH...)" >&2; exit 2; }
tree=$1; shift
if [ "${1:-}" = --series ]; then
  dir=$2
  if [ -f "$dir/series" ]; then
    list=$(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$dir/series" | awk '{print $1}')
  else
    list=$(cd "$dir" && ls -1 -- *.patch 2>/dev/null | LC_ALL=C sort || true)
  fi
  set --
  for name in $list; do set -- "$@" "$dir/$name"; done
fi
n=0
for patch in "$@"; do
  [ -f "$patch" ] || { echo "apply-patches.sh: missing patch file $patch" >&2; exit 1; }
  if ! git -C "$tree" apply --check --whitespace=nowarn "$(realpath "$patch")"; then
    echo "apply-patches.sh: $patch does not apply to $tree" >&2
    exit 1
  fi
  git -C "$tree" apply --whitespace=nowarn "$(realpath "$patch")"
  n=$((n + 1))
  echo "apply-patches.sh: applied $(basename "$patch")"
done
echo "apply-patches.sh: $n patch(es) applied to $tree"
