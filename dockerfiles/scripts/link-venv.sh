#!/bin/sh
# link-venv.sh: put the venv's commands where toolbx and distrobox shells find them. Those
# start from the host's PATH, not the image's ENV, so /opt/venv/bin is not on it; /usr/local/bin
# is. python/python3 are wrappers, not links: a linked venv python looks for pyvenv.cfg beside
# the link, misses it and runs without the venv's packages.
set -eu
venv=${VIRTUAL_ENV:-/opt/venv}
dest=${TOOLBOX_LINK_DIR:-/usr/local/bin}
for f in "$venv"/bin/*; do
  n=${f##*/}
  case "$n" in activate* | Activate* | python*) continue ;; esac
  if [ -x "$f" ] && [ ! -e "$dest/$n" ]; then
    ln -s "$f" "$dest/$n"
  fi
done
for n in python python3; do
  printf '#!/bin/sh\nexec %s/bin/python "$@"\n' "$venv" > "$dest/$n"
  chmod 755 "$dest/$n"
done
