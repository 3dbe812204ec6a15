#!/usr/bin/env bash
# Installs what the HTML report needs from npm: Chart.js, pinned by reports/web/package-lock.json,
# into reports/web/node_modules (project-local; normcheck inlines it into each report). Called
# by scripts/install-deps.sh; idempotent: npm is not run when the pinned version is there.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
web="$root/reports/web"
want="$(sed -n 's/.*"chart.js": "\([0-9.]*\)".*/\1/p' "$web/package.json")"
have=""
if [[ -f "$web/node_modules/chart.js/package.json" ]]; then
  have="$(sed -n 's/^ *"version": "\([0-9.]*\)".*/\1/p' "$web/node_modules/chart.js/package.json" | head -n1)"
fi
if [[ "$have" == "$want" && -f "$web/node_modules/@kurkle/color/LICENSE.md" ]]; then
  echo "install-report-deps: chart.js $want present"
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "install-report-deps: installing npm"
  if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; else SUDO=; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends npm
fi
echo "install-report-deps: npm ci in reports/web (chart.js $want)"
(cd "$web" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
