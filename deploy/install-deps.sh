#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages listed in deploy/deps/<set>.txt that are
# missing, for each set named (build, runtime, test). Uses sudo when not root.
#
#   deploy/install-deps.sh build test
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[[ $# -ge 1 ]] || { echo "usage: $0 build|runtime|test ..." >&2; exit 2; }

packages=()
for set in "$@"; do
  list="$here/deps/$set.txt"
  [[ -f $list ]] || { echo "install-deps: no list $list" >&2; exit 2; }
  while read -r pkg _; do
    [[ -z $pkg || $pkg == \#* ]] && continue
    packages+=("$pkg")
  done <"$list"
done

missing=()
for pkg in "${packages[@]}"; do
  # Node.js and npm may come from elsewhere (e.g. NodeSource); a working
  # command is enough.
  if [[ $pkg == nodejs ]] && command -v node >/dev/null; then continue; fi
  if [[ $pkg == npm ]] && command -v npm >/dev/null; then continue; fi
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [[ $status == "install ok installed" ]] || missing+=("$pkg")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: everything for '$*' is installed"
  exit 0
fi

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo=(sudo)
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
