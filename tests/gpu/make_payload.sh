#!/usr/bin/env bash
# Packs binaries built on this machine, with the non-system shared libraries
# they need, into one compressed file for a GPU machine that lacks those
# libraries. A bundle with matmul-server is about 95 MB (OpenBLAS alone is
# 36 MB) and a lent machine takes far less in a carry; compressed it is about
# 13 MB.
#
#   BUNDLER=path/to/bundle-for-gpu tests/gpu/make_payload.sh OUT.tar.xz BINARY...
#
# BUNDLER makes DIR/bin (the binaries) and DIR/lib (their libraries) from
# BINARY... (`ldd` picks the libraries). On the GPU machine:
#
#   mkdir -p DIR && tar xJf OUT.tar.xz -C DIR && export LD_LIBRARY_PATH=$PWD/DIR/lib
#   DIR/bin/gemm-bench ...
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: BUNDLER=bundle-for-gpu $0 OUT.tar.xz BINARY..." >&2
  exit 2
fi
out=$1
shift
bundler=${BUNDLER:?set BUNDLER to the tool that copies binaries and their libraries into a folder}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bundler" "$tmp" "$@" >/dev/null
strip "$tmp"/bin/* 2>/dev/null || true
tar cJf "$out" -C "$tmp" bin lib
echo "$out: $(du -h "$out" | cut -f1) ($(ls "$tmp/bin" | tr '\n' ' '))"
