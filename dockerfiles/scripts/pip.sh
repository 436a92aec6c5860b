#!/bin/sh
# pip.sh install|wheel|download|check ARGS...: pip in /opt/venv with the build's inputs:
# the CA bundle secret where given, and /wheelhouse as find-links where it holds wheels.
# install --torch-index URL: an extra index for torch wheels, skipped when the wheelhouse
# already carries torch (CI has no route to that index, and a local wheel is the point then).
set -eu
py=${TOOLBOX_PYTHON:-/opt/venv/bin/python}
wheelhouse=${TOOLBOX_WHEELHOUSE:-/wheelhouse}
[ -s /run/secrets/ca ] && export PIP_CERT=/run/secrets/ca
cmd=$1; shift
case "$cmd" in
  check)
    # check [--missing-ok NAME,...]: pip check, where "X requires NAME, which is not installed."
    # is a note, not a failure, for exactly the names given (xformers on ROCm: nothing provides it).
    ok=""
    if [ "${1:-}" = --missing-ok ]; then ok=$2; shift 2; fi
    rc=0
    out=$("$py" -m pip check) || rc=$?
    if [ "$rc" -ne 0 ] && [ -n "$ok" ]; then
      pattern=" requires ($(printf '%s' "$ok" | sed 's/[.]/[.]/g; s/,/|/g')), which is not installed[.]\$"
      rest=$(printf '%s\n' "$out" | grep -v -i -E "$pattern" || true)
      if [ -z "$rest" ]; then
        out=$(printf '%s\n' "$out" | sed 's/^/pip.sh check: allowed (--missing-ok): /')
        rc=0
      fi
    fi
    printf '%s\n' "$out"
    [ "$rc" -eq 0 ] || exit "$rc"
    "$py" -m pip freeze --all > "${TOOLBOX_FREEZE:-/opt/toolbox/pip-freeze.txt}"
    exit 0
    ;;
  install|wheel|download) ;;
  *) echo "pip.sh: unknown command $cmd" >&2; exit 2 ;;
esac
index=""
if [ "${1:-}" = --torch-index ]; then index=$2; shift 2; fi
set -- --no-input "$@"
if ls "$wheelhouse"/*.whl >/dev/null 2>&1; then
  set -- --find-links "$wheelhouse" "$@"
  ls "$wheelhouse"/torch-*.whl >/dev/null 2>&1 && index=""
fi
[ -n "$index" ] && set -- --extra-index-url "$index" "$@"
exec "$py" -m pip "$cmd" "$@"
