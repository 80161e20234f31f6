#!/usr/bin/env bash
# Install what the test suite needs, in virtualenvs of this checkout, then run it.
# Usage: bash tools/test.sh [pytest args...]
#
# - apt (only what is missing; needs root, else sudo): nginx, GNU tar and zstd, which the tests
#   run (zstd: .tar.zst shards made and read by the real tools, also through tar --zstd);
# - .venv (tools/venv.sh; $WIDS_VENV to put it elsewhere): torch==2.13.0, then this checkout
#   editable with the all, test and docs extras, pinned by tools/constraints.txt;
# - .venv-reference ($WIDS_REFERENCE_VENV): the reference wids (webdataset==0.2.111) with the
#   same torch, for the side-by-side compatibility tests (they read $WIDS_REFERENCE_PYTHON).
# A second run installs nothing (a stamp in each venv records what was installed).
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/venv.sh

need_apt=()
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need_apt+=(nginx)
tar --version 2>/dev/null | grep -q 'GNU tar' || need_apt+=(tar)
command -v zstd >/dev/null 2>&1 || need_apt+=(zstd)
if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then SUDO=(); else SUDO=(sudo); fi
    echo "test.sh: installing ${need_apt[*]} with apt-get (needs root${SUDO[*]:+: using sudo})" >&2
    "${SUDO[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

start=$SECONDS
(wids_reference_venv) &  # the two venvs install at once; the second call only sets the variable
reference=$!
wids_venv all,test,docs
wait "$reference"
wids_reference_venv
echo "test.sh: environments ready in $((SECONDS - start)) s" >&2

export PATH="$PATH:/usr/sbin"
# Two pytest-xdist workers, a test file each at a time (--dist loadfile): a file's tests run in
# order in one process, as without xdist, so its module fixtures are made once; each worker
# starts its own storage servers (session fixtures, free ports, its own temporary directory).
# The suite waits on servers, subprocesses and DataLoader workers much of the time, so two
# files at once use the two cores of the CI machine. Files are handed out in collection order
# (--no-loadscope-reorder), which puts files with a `slow` test first (tests/ordering.py).
# -rs lists every skipped test with its reason. `-n 0` (last wins) runs it in one process.
python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -rs "$@"
