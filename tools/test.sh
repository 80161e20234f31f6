#!/usr/bin/env bash
# Install everything the test suite needs on a fresh machine, then run it.
# Usage: bash tools/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need_apt+=(nginx)
tar --version 2>/dev/null | grep -q 'GNU tar' || need_apt+=(tar)
if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# torch first, pinned: it is a local CPU wheel; the [all] extra is then already satisfied.
python -m pip install -q --disable-pip-version-check torch==2.13.0
python -m pip install -q --disable-pip-version-check -c tools/constraints.txt -e '.[all,test]'

export PATH="/usr/sbin:$PATH"
python -m pytest -q "$@"
