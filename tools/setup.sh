#!/usr/bin/env bash
# Create .venv and install the pinned requirements (torch pinned to 2.13.0 through
# constraints.txt, so no package can pull a CUDA build). Re-running is cheap: nothing
# is installed again unless requirements.txt, constraints.txt or pyproject.toml changed.
#   bash tools/setup.sh            # the Python environment
#   bash tools/setup.sh --browser  # also headless Chromium for the site tests (Debian, needs root)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
want=$(cat requirements.txt constraints.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat .venv/.installed 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install --disable-pip-version-check -q -c constraints.txt -r requirements.txt
  .venv/bin/python -m pip install --disable-pip-version-check -q --no-deps --no-build-isolation -e .
  echo "$want" > .venv/.installed
fi
# Refuse an environment that a stray requirement turned into a CUDA install.
.venv/bin/python - <<'PY'
import importlib.metadata as md, sys
import torch
if not torch.__version__.startswith("2.13.0"):
    sys.exit(f"setup: torch {torch.__version__} is installed, the course pins 2.13.0 (constraints.txt)")
cuda = sorted(d.metadata["Name"] for d in md.distributions() if d.metadata["Name"].lower().startswith("nvidia-"))
if cuda and not torch.cuda.is_available():
    sys.exit(f"setup: CUDA wheels were pulled in on a machine without a GPU: {', '.join(cuda)}")
PY

# apt_install PACKAGE WHY: install a Debian package when we are root with apt-get; return 1 otherwise.
apt_install() {
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing Debian's $1 $2"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1" >/dev/null
  else
    return 1
  fi
}
if [ "${1:-}" = "--browser" ] && ! command -v chromium >/dev/null 2>&1; then
  apt_install chromium "for the site tests" || {
    echo "setup: chromium is missing and cannot be installed here (needs root and apt-get)" >&2
    exit 1
  }
fi
# The exercise grader (tools/exercises.py grade / prove) runs every notebook in a bubblewrap sandbox.
if ! command -v bwrap >/dev/null 2>&1; then
  apt_install bubblewrap "for the exercise grader's sandbox" ||
    echo "setup: warning: bubblewrap (bwrap) is missing; the exercise grader needs it (apt-get install bubblewrap)" >&2
fi
echo "setup: .venv ready ($(du -sh .venv | cut -f1), torch $(.venv/bin/python -c 'import torch; print(torch.__version__)'))"
