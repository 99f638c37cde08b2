#!/usr/bin/env bash
# Copies executables and the shared libraries they need into a root-file-
# system tree for a slim runtime image:
#
#   deploy/collect-runtime.sh OUT_ROOT BINARY...
#
# Binaries go to OUT_ROOT/usr/local/bin, their libraries (from ldd) to
# OUT_ROOT/usr/local/lib/matmul, registered in OUT_ROOT/etc/ld.so.conf.d.
# Left out: the C runtime (the base image has it) and the CUDA driver, CUDA
# runtime and cuBLAS (the NVIDIA runtime base image and the node provide
# them).
set -euo pipefail
out=$1
shift
mkdir -p "$out/usr/local/bin" "$out/usr/local/lib/matmul" "$out/etc/ld.so.conf.d"
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|libgcc_s\.so|libstdc\+\+\.so|libcuda\.so|libcudart\.so|libcublas\.so|libcublasLt\.so|libnvidia)'
for binary in "$@"; do
  cp -L "$binary" "$out/usr/local/bin/"
  strip --strip-unneeded "$out/usr/local/bin/$(basename "$binary")" 2>/dev/null || true
  ldd "$binary" | awk '/=>/ {print $1, $3}' | while read -r name path; do
    [[ $name =~ $skip ]] && continue
    if [[ $path == not || -z $path ]]; then
      echo "collect-runtime: $binary needs $name, which is not installed" >&2
      exit 1
    fi
    cp -Ln "$path" "$out/usr/local/lib/matmul/" 2>/dev/null || true
  done
done
echo /usr/local/lib/matmul >"$out/etc/ld.so.conf.d/matmul.conf"
