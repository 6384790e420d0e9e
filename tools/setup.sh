#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test flashattn.
# Idempotent: packages already present are skipped. Run as root (or with sudo).
set -euo pipefail

apt_pkgs=(cmake g++ pkg-config libsqlite3-dev libxxhash-dev libcmocka-dev libcli11-dev
          python3 python3-venv python3-numpy python3-pytest golang-go)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
