#!/bin/sh
# Screenshot of a tvm-dpu HTML report in headless Chromium (Debian's `chromium` package).
# Usage: scripts/screenshot_report.sh REPORT.html OUT.png [WIDTHxHEIGHT]
# Exit 3 when no chromium is installed (callers skip), the browser's status otherwise.
set -eu
if [ $# -lt 2 ]; then
    echo "usage: $0 REPORT.html OUT.png [WIDTHxHEIGHT]" >&2
    exit 2
fi
html=$(realpath "$1")
out=$(realpath -m "$2")
size=${3:-1280x2000}
browser=""
for b in chromium chromium-browser google-chrome; do
    if command -v "$b" >/dev/null 2>&1; then browser=$b; break; fi
done
if [ -z "$browser" ]; then
    echo "$0: no chromium found (Debian: apt-get install chromium)" >&2
    exit 3
fi
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
# The report is self-contained; the flags keep the browser off the network and away from the user's profile.
timeout 120 "$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync --hide-scrollbars \
    --user-data-dir="$profile" --window-size="$(echo "$size" | tr x ,)" --screenshot="$out" "file://$html" \
    >/dev/null 2>&1
test -s "$out"
echo "wrote $out"
