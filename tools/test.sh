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
# Two pytest-xdist workers, a test file each at a time (--dist loadfile): a file's tests run in
# order in one process, as without xdist, so its module fixtures are made once; each worker
# starts its own storage servers (session fixtures, free ports, its own temporary directory).
# The suite waits on servers, subprocesses and DataLoader workers much of the time, so two
# files at once use the two cores of the CI machine. Files are handed out in collection order
# (--no-loadscope-reorder), which puts files with a `slow` test first (tests/ordering.py).
# `-n 0` (last wins) runs it in one process.
python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder "$@"
