#!/usr/bin/env bash
# Renders every Kustomize overlay with kubectl and validates the objects
# offline (validate.mjs); installs the schema packages from npm (pinned by
# package-lock.json) into WORK_DIR.
#
#   run.sh WORK_DIR SOURCE_DIR
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
work=$1 src=$2
command -v kubectl >/dev/null || { echo "k8s test: kubectl (with kustomize) is required" >&2; exit 1; }
mkdir -p "$work"
cp "$here/package.json" "$here/package-lock.json" "$here/validate.mjs" "$work/"
cd "$work"
if ! cmp -s package-lock.json node_modules/.matmul-installed-lock 2>/dev/null; then
  npm ci --no-audit --no-fund --loglevel=error
  cp package-lock.json node_modules/.matmul-installed-lock
fi
for overlay in cpu gpu multi-gpu; do
  kubectl kustomize "$src/deploy/k8s/overlays/$overlay" >"$work/$overlay.yaml"
  node validate.mjs "$overlay" <"$work/$overlay.yaml"
done
