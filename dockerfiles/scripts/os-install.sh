#!/bin/sh
# os-install.sh FAMILY PACKAGE...: install OS packages without recommends, then drop the caches.
# A CA bundle given as the build secret `ca` is used for https mirrors where present.
set -eu
family=$1; shift
ca=/run/secrets/ca
case "$family" in
  fedora)
    set -- --setopt=install_weak_deps=False --setopt=keepcache=False "$@"
    [ -s "$ca" ] && set -- --setopt=sslcacert="$ca" "$@"
    dnf -y install "$@"
    dnf clean all
    ;;
  debian)
    opt=""
    [ -s "$ca" ] && opt="-o Acquire::https::CAInfo=$ca"
    export DEBIAN_FRONTEND=noninteractive
    # shellcheck disable=SC2086
    apt-get $opt update
    # shellcheck disable=SC2086
    apt-get $opt install -y --no-install-recommends "$@"
    apt-get clean
    rm -rf /var/lib/apt/lists/*
    ;;
  *)
    echo "os-install.sh: unknown family '$family' (fedora|debian)" >&2
    exit 2
    ;;
esac
