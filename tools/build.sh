#!/usr/bin/env bash
# Set up the environment and build the book into _build/html, executing every chapter.
#   bash tools/build.sh                       # the CI recipe (default without a GPU)
#   COURSE_MODE=full bash tools/build.sh      # the full recipe (for a GPU)
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/env.sh
bash tools/setup.sh
bash tools/fetch_assets.sh
.venv/bin/python tools/exercises.py build
.venv/bin/python tools/execute_chapters.py
# -W: any warning, including a notebook that failed to execute, fails the build.
# --all: re-read every page, so that outputs refreshed in the cache above are never hidden
# behind a doctree Sphinx kept from an earlier build of an unchanged notebook.
.venv/bin/jupyter-book build . --all --warningiserror --keep-going
echo "build: open _build/html/index.html"
