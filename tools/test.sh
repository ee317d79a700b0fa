#!/usr/bin/env bash
# The whole test pass (what CI runs): the linter (ruff, its rules in pyproject.toml), lib
# unit tests, the exercise proofs, every chapter executed once in the CI recipe with its
# checked outputs compared (nbval-lax semantics, tools/execute_chapters.py --check), the book
# build with -W from those executions, and the built site in headless Chromium. Prints how long each stage took.
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/env.sh
export COURSE_MODE=${COURSE_MODE:-ci}
reports=_build/test-reports
rm -rf "$reports" && mkdir -p "$reports"
declare -a STAGES=()
status=0

stage() {  # stage NAME COMMAND...: run, time, remember the result
  local name=$1; shift
  echo; echo "=== stage: $name"
  local start=$SECONDS
  "$@"; local rc=$?
  local took=$((SECONDS - start))
  STAGES+=("$(printf '%-10s %5ds  %s' "$name" "$took" "$([ $rc = 0 ] && echo ok || echo "FAILED ($rc)")")")
  [ $rc = 0 ] || status=1
  return $rc
}

pytest_stage() {  # pytest with a JUnit report per stage; exit 5 (nothing collected) is a failure
  local name=$1; shift
  .venv/bin/python -m pytest -q --junitxml="$reports/$name.xml" "$@"
}

notebooks() {
  # Each chapter runs once, here: executed into the book's jupyter-cache (--force: even if
  # cached, since the cache key ignores lib), its checked cells compared with their stored
  # outputs as nbval --nbval-lax would (--check), per-chapter times printed; chapters run side
  # by side where the cores allow (two on a 2-core machine, one thread each). The book stage
  # then finds every chapter in the cache and only renders it.
  .venv/bin/python tools/execute_chapters.py --force --check --junit "$reports/notebooks.xml"
}

stage setup bash tools/setup.sh --browser || { printf '%s\n' "${STAGES[@]}"; exit 1; }
stage lint .venv/bin/ruff check lib tools tests benchmarks chapters
# the tests are grouped by what they test, one folder a stage: tests/lib (lib/models, lib/data, lib/train
# and the rest of lib) and tests/tools here; tests/i18n, tests/exercises and tests/site below
stage lib pytest_stage lib tests/lib tests/tools
# the Korean catalogs: complete, current with their pages (extracted again), the glossary's terms used
stage i18n pytest_stage i18n tests/i18n
stage exercises pytest_stage exercises tests/exercises
stage notebooks notebooks
stage book bash tools/build.sh
# the built site in headless Chromium, and the book's Sphinx extensions on small projects of their own
COURSE_REQUIRE_SITE=1 stage site pytest_stage site tests/site

echo; echo "=== stage timings"
printf '%s\n' "${STAGES[@]}"
.venv/bin/python - "$reports" <<'PY'
import sys, pathlib, xml.etree.ElementTree as ET
t = f = s = 0
for x in pathlib.Path(sys.argv[1]).glob("*.xml"):
    root = ET.parse(x).getroot()
    for suite in ([root] if root.tag == "testsuite" else root.iter("testsuite")):
        n, fail, err, skip = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
        t += n; f += fail + err; s += skip
print(f"{t - f - s} passed, {f} failed, {s} skipped")
PY
exit $status
