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
    "$py" -m pip check
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
