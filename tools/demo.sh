#!/usr/bin/env bash
# The wids demo: install what it needs into this checkout's virtualenv, then run tools/demo.py.
# Usage: bash tools/demo.sh [demo.py args...]   (e.g. --server s3, --grid out.png)
#
# - .venv (tools/venv.sh; $WIDS_VENV to put it elsewhere): torch==2.13.0, then this checkout
#   editable with the `all` extra; a second run installs nothing;
# - nginx, which serves the shards over HTTP on 127.0.0.1, is installed with apt-get only when
#   it is missing and you are root; otherwise the demo serves them from moto_server (S3) if
#   installed, else reads the local files, and says so.
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/venv.sh

if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
    if [ "$(id -u)" = 0 ]; then
        echo "demo.sh: installing nginx with apt-get" >&2
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null \
            || echo "demo.sh: could not install nginx; the demo will read local files" >&2
    else
        echo "demo.sh: nginx not found (installing it needs root: sudo apt-get install nginx);" \
            "the demo will not use an HTTP server" >&2
    fi
fi

wids_venv all
export PATH="$PATH:/usr/sbin"
exec python tools/demo.py "$@"
