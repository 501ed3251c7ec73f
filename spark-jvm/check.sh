#!/usr/bin/env bash
# Build the jar and run the smoke check (spark-jvm/smoke.py) with the repo's venv.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
export PATH="$root/.venv/bin:$PATH" PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}"
"$here/build.sh"
exec python "$here/smoke.py"
