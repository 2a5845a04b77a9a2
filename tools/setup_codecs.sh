#!/bin/sh
# The image codecs of cross targets, for `make setup` (idempotent: apt-get runs only
# when something is missing).
#
#   aarch64-linux-gnu  Debian's arm64 builds of libjpeg62-turbo-dev, libpng-dev and
#                      zlib1g-dev (multiarch: dpkg --add-architecture arm64), which
#                      aarch64-linux-gnu-gcc finds in /usr/lib/aarch64-linux-gnu.
#   wasm32-wasi        no Debian build exists: `python -m cuvil.wasm_codecs` (run by
#                      make setup after this script) compiles the same libraries from
#                      their Debian source packages; this script enables the deb-src
#                      entries `apt-get source` needs and installs cmake and dpkg-dev.
#
# Usage: tools/setup_codecs.sh [SUDO]   (SUDO: "sudo" or empty when running as root)
set -eu
SUDO=${1:-}
ARM64_PACKAGES="libjpeg62-turbo-dev:arm64 libpng-dev:arm64 zlib1g-dev:arm64"
BUILD_PACKAGES="cmake dpkg-dev llvm-14 clang lld wasi-libc"
SRC_LIST=/etc/apt/sources.list.d/cuvil-deb-src

if ! command -v dpkg >/dev/null 2>&1; then
  echo "not a Debian system: install the arm64 static libjpeg, libpng and zlib yourself, and build them" \
       "for wasm32-wasi (see compiler/cuvil/wasm_codecs.py)"
  exit 0
fi

update=
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  $SUDO dpkg --add-architecture arm64
  update=1
fi

# deb-src entries mirroring the system's Debian deb entries (deb822 .sources files or
# one-line sources.list), unless some deb-src entry exists already.
if ! grep -rqsE '^(Types:.*deb-src|deb-src )' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  tmp=$(mktemp)
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    grep -q 'deb.debian.org\|debian.org/debian\|snapshot.debian.org' "$f" || continue
    sed 's/^Types: deb$/Types: deb-src/' "$f" >>"$tmp"
    echo >>"$tmp"
  done
  if [ -s "$tmp" ]; then
    $SUDO install -m 644 "$tmp" "$SRC_LIST.sources"
  elif [ -f /etc/apt/sources.list ] && grep -q '^deb ' /etc/apt/sources.list; then
    sed -n 's/^deb /deb-src /p' /etc/apt/sources.list >"$tmp"
    $SUDO install -m 644 "$tmp" "$SRC_LIST.list"
  else
    echo "no Debian deb entries found: add deb-src entries yourself (apt-get source must work)" >&2
  fi
  rm -f "$tmp"
  update=1
fi

if [ -n "$update" ] || ! dpkg -s $ARM64_PACKAGES $BUILD_PACKAGES >/dev/null 2>&1; then
  $SUDO apt-get update
  $SUDO apt-get install -y --no-install-recommends $ARM64_PACKAGES $BUILD_PACKAGES
fi
