#!/usr/bin/env bash
# scripts/gpu_deps.sh — prepare .gpudeps/ (git-ignored locally: add "/.gpudeps/" to .git/info/exclude):
# the Debian libraries the full tern needs, extracted (not installed) so they can travel to the GPU
# machine with `carry: [".gpudeps"]` (it has no package registry). scripts/gpu_check.sh uses
# .gpudeps/root for the core build (cJSON); scripts/gpu_runtime_bench.sh for the full build.
set -eu
cd "$(dirname "$0")/.."
grep -qx "/.gpudeps/" .git/info/exclude 2>/dev/null || echo "/.gpudeps/" >> .git/info/exclude
rm -rf .gpudeps && mkdir -p .gpudeps/dl && cd .gpudeps/dl
apt-get download libcjson1 libcjson-dev libmicrohttpd12 libmicrohttpd-dev libutf8proc2 libutf8proc-dev \
    libpcre2-dev libpcre2-8-0 libgnutls30 libnettle8 libhogweed6 libgmp10 libp11-kit0 libidn2-0 \
    libunistring2 libtasn1-6 libffi8 >/dev/null
for f in *.deb; do dpkg -x "$f" x; done
cd ..
mkdir -p root/usr/include root/usr/lib/x86_64-linux-gnu root/gnutls
cp -r dl/x/usr/include/. root/usr/include/
L=dl/x/usr/lib/x86_64-linux-gnu
for lib in libcjson libmicrohttpd libutf8proc libpcre2-8; do   # links become copies (carry keeps links as links)
    for f in "$L/$lib".so*; do cp -L "$f" root/usr/lib/x86_64-linux-gnu/; done
done
for f in $(find dl/x -name 'lib*.so.*' \( -path '*gnutls*' -o -name 'libnettle*' -o -name 'libhogweed*' -o -name 'libgmp*' \
           -o -name 'libp11-kit*' -o -name 'libidn2*' -o -name 'libunistring*' -o -name 'libtasn1*' -o -name 'libffi*' \)); do
    cp -L "$f" root/gnutls/
done
rm -rf dl
du -sh .
