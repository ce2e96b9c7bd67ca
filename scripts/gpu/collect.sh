#!/usr/bin/env bash
# Here, after the last device call: bring what run.sh packed into bench/gpu/.
#
#   scripts/gpu/collect.sh FILES_AT [NAME]
#
# FILES_AT is the folder the device tool copied $OUT into (its reply's files_at). The run
# folders (reports, records, manifests) land in bench/gpu/NAME/ (default: the UTC date of
# facts.txt), with facts.txt and status beside them; the log tails stay in
# bench/gpu/NAME/logs.tar.gz only if it is under 1 MB. Files over 1 MB are listed and
# left out, since nothing that large is committed.
set -euo pipefail
FROM=${1:?usage: collect.sh FILES_AT [NAME]}
cd "$(dirname "$0")/../.."
NAME=${2:-$(grep -m1 -oE '[0-9]{4}-[0-9]{2}-[0-9]{2}' "$FROM/facts.txt" || date -u +%F)}
DEST=bench/gpu/$NAME
mkdir -p "$DEST"
cp "$FROM/facts.txt" "$FROM/status" "$DEST/" 2>/dev/null || true
[ -f "$FROM/runs.tar.gz" ] && tar -xzf "$FROM/runs.tar.gz" -C "$DEST"
if [ -f "$FROM/logs.tar.gz" ] && [ "$(stat -c %s "$FROM/logs.tar.gz")" -lt 1000000 ]; then
    cp "$FROM/logs.tar.gz" "$DEST/"
fi
find "$DEST" -type f -size +1000k -print -delete | sed 's/^/collect: left out (over 1 MB): /'
find "$DEST" -type f | sort
