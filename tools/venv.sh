# Sourced by tools/demo.sh and tools/test.sh: make and use the project's virtualenv.
#
#   wids_venv EXTRAS        e.g. wids_venv all   or   wids_venv all,test,docs
#
# Creates $WIDS_VENV (default: .venv in the checkout) with ${PYTHON:-python3} if it does not
# exist, and installs into it, never into the Python first on PATH: torch==2.13.0 first (pinned:
# a CPU wheel on the machines this project is tested on; an unpinned torch pulls a multi-GB CUDA
# build), then this checkout editable with EXTRAS, pinned by tools/constraints.txt. A stamp in
# the venv records what was installed, so a second run with the same pyproject.toml,
# constraints and extras installs nothing. pip runs with --no-compile: byte-compiling every
# module of torch and the rest took three quarters of the install time, while Python compiles
# (and caches) only what is imported. Then puts the venv's bin/ first on PATH (as
# `source .venv/bin/activate` would), so `python`, `wids`, `torchrun` and the test servers are
# the venv's.
#
#   wids_reference_venv     the reference wids (webdataset==0.2.111) in a venv of its own
#
# Its import name `wids` collides with ours, so it lives in $WIDS_REFERENCE_VENV (default:
# .venv-reference); exports WIDS_REFERENCE_PYTHON, which the compatibility tests read
# (tests/reference.py), and WIDS_REFERENCE_TESTS, the reference's source archive
# (wids==0.1.11, the same code), whose test file tests/test_reference_tests.py runs against ours.

WIDS_TORCH="torch==2.13.0"
# Pillow and msgpack: the reference's default decoders import them (images, .mp), and the
# side-by-side tests compare decoded fields (tests/test_compat.py).
WIDS_REFERENCE_PACKAGES=("$WIDS_TORCH" "webdataset==0.2.111" "pillow==13.0.0" "msgpack==1.2.4")
WIDS_REFERENCE_SDIST="wids==0.1.11"

_wids_log() { echo "$(basename "$0"): $*" >&2; }

_wids_make_venv() {  # DIR
    if [ ! -x "$1/bin/python" ]; then
        local py="${PYTHON:-python3}"
        if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
            _wids_log "needs Python >= 3.10 as \$PYTHON or python3 (found: $("$py" --version 2>&1))"
            return 1
        fi
        _wids_log "creating the virtualenv $1 ($("$py" --version 2>&1))"
        "$py" -m venv "$1"
    fi
}

_wids_stamp() {  # WHAT...: a digest of what an install depends on
    { printf '%s\n' "$@"; cat pyproject.toml tools/constraints.txt; } | sha256sum | cut -d' ' -f1
}

wids_venv() {  # EXTRAS
    local venv="${WIDS_VENV:-.venv}" extras="$1"
    _wids_make_venv "$venv" || return 1
    local stamp
    stamp="$(_wids_stamp "$WIDS_TORCH" "$extras")"
    if [ "$(cat "$venv/.wids-installed" 2>/dev/null)" != "$stamp" ]; then
        _wids_log "installing $WIDS_TORCH and wids[$extras] into $venv"
        local pip=("$venv/bin/python" -m pip install -q --no-compile --disable-pip-version-check)
        "${pip[@]}" "$WIDS_TORCH"
        "${pip[@]}" -c tools/constraints.txt -e ".[$extras]"
        echo "$stamp" >"$venv/.wids-installed"
    fi
    VIRTUAL_ENV="$(cd "$venv" && pwd)"
    export VIRTUAL_ENV
    export PATH="$VIRTUAL_ENV/bin:$PATH"
}

wids_reference_venv() {
    local venv="${WIDS_REFERENCE_VENV:-.venv-reference}"
    _wids_make_venv "$venv" || return 1
    local stamp
    stamp="$(printf '%s\n' "${WIDS_REFERENCE_PACKAGES[@]}" "$WIDS_REFERENCE_SDIST" | sha256sum | cut -d' ' -f1)"
    if [ "$(cat "$venv/.wids-installed" 2>/dev/null)" != "$stamp" ]; then
        _wids_log "installing the reference wids (${WIDS_REFERENCE_PACKAGES[*]}) into $venv"
        local pip=("$venv/bin/python" -m pip --disable-pip-version-check)
        "${pip[@]}" install -q --no-compile "${WIDS_REFERENCE_PACKAGES[@]}"
        rm -rf "$venv/sdist"
        "${pip[@]}" download -q --no-deps --no-binary :all: -d "$venv/sdist" "$WIDS_REFERENCE_SDIST"
        echo "$stamp" >"$venv/.wids-installed"
    fi
    venv="$(cd "$venv" && pwd)"
    export WIDS_REFERENCE_PYTHON="$venv/bin/python"
    WIDS_REFERENCE_TESTS="$(ls "$venv"/sdist/wids-*.tar.gz)"
    export WIDS_REFERENCE_TESTS
}
