#!/usr/bin/env bash
# The wids demo on a fresh machine: install what it needs, then run tools/demo.py.
# Usage: bash tools/demo.sh [demo.py args...]   (e.g. --server s3, --grid out.png)
set -euo pipefail
cd "$(dirname "$0")/.."

# nginx serves the shards over HTTP on 127.0.0.1; without it the demo falls back to moto_server
# (S3) if installed, else to local files.
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null \
            || echo "demo.sh: could not install nginx; the demo will read local files" >&2
    else
        echo "demo.sh: nginx not found and not root: the demo will not use an HTTP server" >&2
    fi
fi

# torch first, pinned: it is a local CPU wheel (an unpinned torch pulls a multi-GB CUDA build);
# the [all] extra is then already satisfied.
python -m pip install -q --disable-pip-version-check torch==2.13.0
python -m pip install -q --disable-pip-version-check -c tools/constraints.txt -e '.[all]'

export PATH="/usr/sbin:$PATH"
exec python tools/demo.py "$@"
