# Shortcuts; each target is one documented command.
.PHONY: docs check-docs lock test

docs:  ## measure every figure on this host, publish its records, render README.md and docs/
	python scripts/make_docs.py

check-docs:  ## fail when a document differs from its records (CI runs it inside the tests)
	python scripts/render_docs.py --check

lock:  ## refresh requirements/lock.txt and rerun the checks against it
	bash scripts/refresh_lock.sh

test:  ## the test command of the README and CI
	python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile
