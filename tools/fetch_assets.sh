#!/usr/bin/env bash
# Vendor what the reader's browser loads, so that the book works offline: from the npm
# registry MathJax 3 (math typesetting), require.js and the Jupyter widgets HTML manager
# (interactive widgets, with its icon fonts). Nothing here is committed: the files land in
# book/_static_vendor/ (git-ignored) and Sphinx copies them into _static/.
#
# The Korean web font is not fetched: the book's extension (book/_ext/course_site.py) cuts it
# at build time from the NanumGothic of the koreanize-matplotlib wheel, to the Hangul the site
# shows, and renames it (the font's license reserves the name NanumGothic for the unmodified
# font). Cutting it also drops the TSI* tables (VTT hinting sources) that Chromium's font
# sanitizer rejects in the wheel's file ("OTS parsing error: TSI3: zero-length table").
set -euo pipefail
cd "$(dirname "$0")/.."

MATHJAX=mathjax@3.2.2
REQUIREJS=requirejs@2.3.7
HTML_MANAGER=@jupyter-widgets/html-manager@1.0.15

dest=book/_static_vendor
stamp="$dest/.versions"
want="$MATHJAX $REQUIREJS $HTML_MANAGER (widget fonts)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
   && [ -f "$dest/mathjax/es5/tex-mml-chtml.js" ] && [ -f "$dest/widgets/embed-amd.js" ]; then
  echo "assets: up to date ($want)"
  exit 0
fi
command -v npm >/dev/null || { echo "assets: npm is needed to fetch MathJax and the widget manager (apt-get install npm)" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for pkg in $MATHJAX $REQUIREJS $HTML_MANAGER; do
  (cd "$tmp" && npm pack --silent "$pkg" >/dev/null 2>"$tmp/npm.log") \
    || { cat "$tmp/npm.log" >&2; echo "assets: could not fetch $pkg from the npm registry" >&2; exit 1; }
done
mkdir -p "$tmp/mj" "$tmp/rq" "$tmp/hm"
tar -xzf "$tmp"/mathjax-*.tgz -C "$tmp/mj"
tar -xzf "$tmp"/requirejs-*.tgz -C "$tmp/rq"
tar -xzf "$tmp"/jupyter-widgets-html-manager-*.tgz -C "$tmp/hm"

new="$dest.new"
rm -rf "$new" && mkdir -p "$new/mathjax" "$new/widgets"
cp -r "$tmp/mj/package/es5" "$new/mathjax/es5"
cp "$tmp/mj/package/LICENSE" "$new/mathjax/LICENSE"
# The speech-rule engine is only used by MathJax's accessibility menu; it is large.
rm -rf "$new/mathjax/es5/sre"
cp "$tmp/rq/package/require.js" "$new/widgets/require.js"
cp "$tmp/hm/package/dist/embed-amd.js" "$new/widgets/embed-amd.js"
cp "$tmp/hm/package/LICENSE"* "$new/widgets/" 2>/dev/null || true
# The icon fonts (Font Awesome 4, SIL OFL 1.1) the widget manager's CSS points to: they are
# loaded from the folder of embed-amd.js (book/_static/widgets/paths.js tells require.js).
cp "$tmp/hm/package/dist/"*.{woff2,woff,ttf,eot,svg} "$new/widgets/"
cp "$tmp/hm/package/dist/embed.js.LICENSE.txt" "$new/widgets/" 2>/dev/null || true
echo "$want" > "$new/.versions"
rm -rf "$dest" && mv "$new" "$dest"
echo "assets: fetched $want into $dest ($(du -sh "$dest" | cut -f1))"
