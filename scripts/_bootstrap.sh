# Sourced by the scripts in this folder: find Python 3.12+, create .venv in the
# checkout if needed, and (re)install the project when pyproject.toml changed.
# Usage: source scripts/_bootstrap.sh; ensure_venv [EXTRAS]   (EXTRAS e.g. "test")

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"

find_python() {
    local candidate
    # pyenv honours .python-version in the checkout; plain PATH lookups come next.
    for candidate in "$(cd "$ROOT" && command -v pyenv >/dev/null && pyenv which python 2>/dev/null)" \
                     python3.13 python3.12 python3; do
        [ -n "$candidate" ] || continue
        if (cd "$ROOT" && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))') 2>/dev/null; then
            (cd "$ROOT" && command -v "$candidate")
            return 0
        fi
    done
    echo "llm-audit: Python 3.12 or newer is needed (mitmproxy 12 requires it); install it, e.g. 'pyenv install 3.12'" >&2
    return 1
}

ensure_venv() {
    local extras="${1:-}" spec="." stamp want python
    [ -n "$extras" ] && spec=".[$extras]"
    if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
        python="$(find_python)" || return 1
        echo "llm-audit: creating $VENV with $python" >&2
        rm -rf "$VENV"
        "$python" -m venv "$VENV" || return 1
    fi
    stamp="$VENV/.installed-${extras:-base}"
    # setup.py compiles sse_parser.py (mypyc): a change to it is rebuilt like one to pyproject.toml
    want="$(cat "$ROOT/pyproject.toml" "$ROOT/setup.py" "$ROOT/addon/framing/sse_parser.py" | sha256sum | cut -d' ' -f1)"
    if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
        echo "llm-audit: installing $spec into $VENV" >&2
        (cd "$ROOT" && "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e "$spec") || return 1
        echo "$want" > "$stamp"
        # setup.py's own warning is hidden by --quiet: say once, at install, that the parser is the slower fallback
        if [ "${LLM_AUDIT_PURE_PARSER:-}" != 1 ] && ! (cd "$ROOT" && "$VENV/bin/python" -W ignore -c \
            'import sys, addon.framing.sse as s; sys.exit(not s.COMPILED)' 2>/dev/null); then
            echo "llm-audit: the compiled SSE parser was not built (no C compiler, or mypyc refused the module: '$VENV/bin/pip install -e $ROOT' shows why); the pure-Python parser is used, with the same results" >&2
        fi
    fi
}
