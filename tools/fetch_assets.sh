#!/usr/bin/env bash
# Vendor what the reader's browser loads, so that the book works offline: from the npm
# registry MathJax 3 (math typesetting), require.js and the Jupyter widgets HTML manager
# (interactive widgets, with its icon fonts) and Noto Sans KR for Korean text (Fontsource's
# web-font slices, SIL OFL 1.1, LICENSE kept beside them). Nothing here is committed: the
# files land in book/_static_vendor/ (git-ignored) and Sphinx copies them into _static/.
#
# Why not the NanumGothic.ttf of the koreanize-matplotlib wheel the plots use: Chromium's font
# sanitizer rejects that file ("OTS parsing error: TSI3: zero-length table"), so the browser
# would still draw boxes; repairing it would make a Modified Version, which the font's
# license (OFL with Reserved Font Name "NanumGothic") forbids to carry its name.
set -euo pipefail
cd "$(dirname "$0")/.."

MATHJAX=mathjax@3.2.2
REQUIREJS=requirejs@2.3.7
HTML_MANAGER=@jupyter-widgets/html-manager@1.0.15
NOTO_KR=@fontsource/noto-sans-kr@5.3.0

dest=book/_static_vendor
stamp="$dest/.versions"
want="$MATHJAX $REQUIREJS $HTML_MANAGER $NOTO_KR (widget fonts)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
   && [ -f "$dest/mathjax/es5/tex-mml-chtml.js" ] && [ -f "$dest/widgets/embed-amd.js" ] \
   && [ -f "$dest/fonts/noto-sans-kr/400.css" ]; then
  echo "assets: up to date ($want)"
  exit 0
fi
command -v npm >/dev/null || { echo "assets: npm is needed to fetch MathJax and the widget manager (apt-get install npm)" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for pkg in $MATHJAX $REQUIREJS $HTML_MANAGER $NOTO_KR; do
  (cd "$tmp" && npm pack --silent "$pkg" >/dev/null 2>"$tmp/npm.log") \
    || { cat "$tmp/npm.log" >&2; echo "assets: could not fetch $pkg from the npm registry" >&2; exit 1; }
done
mkdir -p "$tmp/mj" "$tmp/rq" "$tmp/hm" "$tmp/kr"
tar -xzf "$tmp"/mathjax-*.tgz -C "$tmp/mj"
tar -xzf "$tmp"/requirejs-*.tgz -C "$tmp/rq"
tar -xzf "$tmp"/jupyter-widgets-html-manager-*.tgz -C "$tmp/hm"
tar -xzf "$tmp"/fontsource-noto-sans-kr-*.tgz -C "$tmp/kr"

new="$dest.new"
rm -rf "$new" && mkdir -p "$new/mathjax" "$new/widgets" "$new/fonts/noto-sans-kr/files"
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
# Noto Sans KR, regular weight: 400.css declares one @font-face per slice of the font with its
# unicode-range, so a page downloads only the slices its characters need. Only the WOFF2
# files are kept (every browser that runs the site reads them); the WOFF fallbacks go.
cp "$tmp/kr/package/LICENSE" "$new/fonts/noto-sans-kr/LICENSE"
cp "$tmp/kr/package/files/"*-400-normal.woff2 "$new/fonts/noto-sans-kr/files/"
sed -E "s#, url\(\./files/[^)]*\.woff\) format\('woff'\)##" "$tmp/kr/package/400.css" > "$new/fonts/noto-sans-kr/400.css"
echo "$want" > "$new/.versions"
rm -rf "$dest" && mv "$new" "$dest"
echo "assets: fetched $want into $dest ($(du -sh "$dest" | cut -f1))"
