# Sourced by the build and test scripts: the environment every chapter runs in.
# shellcheck shell=bash
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export ROOT
# This checkout's lib first, whichever checkout the venv was installed from.
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# Real data: ../shared/data beside the checkout is a complete mirror of the datasets.
if [ -z "${COURSE_DATA_MIRROR:-}" ] && [ -d "$ROOT/../shared/data" ]; then
  COURSE_DATA_MIRROR="$(cd "$ROOT/../shared/data" && pwd)"
  export COURSE_DATA_MIRROR
fi
# The CI recipe writes its numbers to _build/results so that running the chapters never
# changes the committed results/; the full recipe records into results/ itself (lib.results
# decides when it records, from the recipe, so COURSE_MODE may be set before or after this).
export COURSE_CI_RESULTS_DIR="${COURSE_CI_RESULTS_DIR:-$ROOT/_build/results}"
export PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1
export TOKENIZERS_PARALLELISM=false
# Kernels talk to the notebook runner over loopback only.
export JUPYTER_IP=127.0.0.1
