#!/usr/bin/env bash
# //tools:docs_links_test: runs tools/docs_links_check.sh on the source tree this runfiles tree
# links to.
set -euo pipefail
root="$(dirname "$(readlink -f README.md)")"
exec tools/docs_links_check.sh "$root"
