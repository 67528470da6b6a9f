#!/usr/bin/env bash
# Refresh requirements/lock.txt, then rerun the checks against it (fresh venv, the whole suite).
#
#   bash scripts/refresh_lock.sh            # newest versions setup.py's ranges allow
#   bash scripts/refresh_lock.sh --no-upgrade   # keep the pins, re-resolve only what changed
#
# The lock pins every package of `pip install -e '.[test,bench]'` to one exact version with the sha256
# of each of its files, for CPython 3.11 on Linux x86_64 (the Python of CI and of the hosts the
# published figures were recorded on; the hashes cover every wheel of each pinned version, so it
# usually installs on other Pythons and platforms too). torch is left out on purpose
# (requirements/overrides.txt says why). `pip install -r requirements/lock.txt` installs it with
# pip alone, in hash-checking mode.
#
# Tool: uv (`uv pip compile`), not pip-tools. Both write a pip requirements file with hashes;
# uv resolves for a stated Python version and platform without that interpreter being installed
# and without reading this machine's pip configuration (a local wheel directory or index would
# otherwise leak into the lock), drops torch with an override, and takes seconds, so a scheduled
# job can refresh the lock cheaply. Only refreshing needs uv; installing needs pip.
set -euo pipefail
cd "$(dirname "$0")/.."
upgrade=--upgrade
if [[ "${1:-}" == --no-upgrade ]]; then upgrade=; fi
python3 -m pip install -q 'uv>=0.5'
python3 -m uv pip compile setup.py --extra test --extra bench \
    --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
    --generate-hashes $upgrade --override requirements/overrides.txt \
    --custom-compile-command 'bash scripts/refresh_lock.sh' \
    --output-file requirements/lock.txt
git --no-pager diff --stat -- requirements/lock.txt || true
# The checks: a fresh venv installed from the lock with the README's command, the whole suite
# (render_docs --check included). A figure measured with the old lock keeps its recorded
# versions; rerun `python scripts/make_docs.py` on a quiet host to publish new ones.
bash .ci/run
