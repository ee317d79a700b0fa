#!/usr/bin/env bash
# Publish the built book (_build/html) by hand: commit it as the only content of the gh-pages
# branch with ghp-import (pinned in requirements.txt) and push that branch. The CI workflow
# (.github/workflows/book.yml) is the usual path; this is for a fork or a host without it
# (repository Settings > Pages > Source: Deploy from a branch, gh-pages).
#
#   bash tools/test.sh && bash tools/publish.sh      # test, build, then publish to origin
#   bash tools/publish.sh --remote URL_OR_NAME       # another remote (a URL or a remote name)
#   bash tools/publish.sh --no-push                  # only update the local gh-pages branch
#
# Publish a site that passed the test pass: this script does not build or test anything.
set -euo pipefail
cd "$(dirname "$0")/.."

remote=origin
push=1
site=_build/html
while [ $# -gt 0 ]; do
  case $1 in
    --remote) remote=${2:?--remote needs a remote name or URL}; shift 2 ;;
    --no-push) push=0; shift ;;
    --site) site=${2:?--site needs a folder}; shift 2 ;;
    *) echo "publish: unknown argument $1 (see the top of tools/publish.sh)" >&2; exit 2 ;;
  esac
done

[ -f "$site/index.html" ] || {
  echo "publish: $site/index.html is missing: build the book first (bash tools/test.sh or bash tools/build.sh)" >&2
  exit 1
}
ghp_import=.venv/bin/ghp-import
[ -x "$ghp_import" ] || ghp_import=$(command -v ghp-import) || {
  echo "publish: ghp-import is not installed (bash tools/setup.sh installs requirements.txt)" >&2
  exit 1
}
commit=$(git rev-parse --short HEAD 2>/dev/null || echo "an uncommitted tree")
dirty=$(git status --porcelain 2>/dev/null | head -1)
message="Publish the book built from $commit${dirty:+ (with uncommitted changes)}"

# -n: add .nojekyll (GitHub Pages must serve _static/ and the other folders starting with _)
args=(-n -m "$message" -b gh-pages)
[ "$push" = 1 ] && args+=(-p -r "$remote")
"$ghp_import" "${args[@]}" "$site"
if [ "$push" = 1 ]; then
  echo "publish: $site -> gh-pages of $remote ($message)"
else
  echo "publish: $site -> local branch gh-pages ($message); push it with: git push origin gh-pages"
fi
