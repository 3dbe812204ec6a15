# Sourced by the headless-Chromium tests (html_chromium.sh, study_chromium.sh) after they set
# `work`: check NAME CMD... (counts failures in `fails`), the browser, and its flags (no
# network, no GPU, a profile under $work).
fails=0
check() {
  local name="$1"; shift
  if "$@"; then echo "ok   $name"; else echo "FAIL $name"; fails=$((fails + 1)); fi
}
browser="$(command -v chromium || command -v chromium-browser || true)"
if [[ -z "$browser" ]]; then
  echo "FAIL chromium is not installed (scripts/install-deps.sh installs it)"
  exit 1
fi
flags=(--headless --no-sandbox --disable-gpu --disable-background-networking --disable-extensions
       --no-first-run --user-data-dir="$work/profile" --virtual-time-budget=${virtual_time_budget:-10000})
