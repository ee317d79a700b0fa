#!/usr/bin/env bash
# Set up the environment and build the book into _build/html (English) and _build/html/ko (Korean),
# executing every chapter once.
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
# The Korean edition into _build/html/ko: the same sources and the same executed notebooks (the
# jupyter-cache filled above: no chapter runs again), with the catalogs of locales/ko applied, -W too.
.venv/bin/python tools/i18n.py build --lang ko
echo "build: open _build/html/index.html (English) or _build/html/ko/index.html (Korean)"
