#!/usr/bin/env bash
# scripts/setup.sh — install dependencies (Debian packages, npm test oracles) and build.
# Safe to re-run. Needs root (or sudo) for apt-get when packages are missing.
set -eu
cd "$(dirname "$0")/.."
PKGS="build-essential pkg-config libcjson-dev libpcre2-dev libmicrohttpd-dev libutf8proc-dev"
missing=""
for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
# node/npm may come from elsewhere than Debian: only install them when absent
command -v node >/dev/null 2>&1 || missing="$missing nodejs"
command -v npm >/dev/null 2>&1 || missing="$missing npm"
if [ -n "$missing" ]; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi
# test oracles (HF tokenizers, jinja, API clients): installed into tests/node_modules
if [ -f tests/package.json ] && command -v npm >/dev/null; then
    (cd tests && npm install --no-audit --no-fund --loglevel=error) || echo "setup: npm install failed; oracle tests will skip"
fi
make -j"$(nproc)" all
