#!/usr/bin/env bash
# The placement study's page in headless Chromium, as html_chromium.sh checks the conformance
# report: `normcheck study placement` on three depths with low-precision counts at every step
# writes one file with no external URL; its self-test (#selftest) draws every norm and depth at
# initialization and after the last step, each plot with pixels; no script or console error; a
# screenshot is kept under WORK_DIR. A page from a results file that is not one is refused.
# Usage: study_chromium.sh NORMCHECK WORK_DIR
set -uo pipefail
nc="$1" work="$2"
rm -rf "$work" && mkdir -p "$work"
virtual_time_budget=20000
source "$(dirname "$0")/chromium_common.sh"

"$nc" study placement --layers 6,12,24 --steps 2 --lowp float16,bfloat16 --lowp-every 1 --seeds 2 --sweep-lr 1e-3,1e-1 --sweep-steps 2 --json "$work/study.json" --html "$work/page" \
  --markdown "$work/study.md" >"$work/study.out" 2>&1
check "study placement --html: exit 0" test $? = 0
dir="$work/page"
check "one file, no external URL" \
  bash -c "test \"\$(ls '$dir')\" = index.html && ! grep -qE '<(script|link|img)[^>]+(src|href)=' '$dir/index.html'"
timeout 120 "$browser" "${flags[@]}" --enable-logging=stderr --v=0 --dump-dom "file://$dir/index.html#selftest" \
  >"$work/dom.html" 2>"$work/chromium.log"
check "chromium ran" test -s "$work/dom.html"
status="$(grep -o '<p id="nc-status"[^>]*>[^<]*' "$work/dom.html")"
echo "     $status"
check "page check ok" grep -q 'data-status="ok"' <<<"$status"
check "no script or console errors" grep -q 'data-errors="0"' <<<"$status"
check "no blank plot" grep -q 'data-blank="0"' <<<"$status"
views="$(sed -n 's/.*data-views="\([0-9]*\)".*/\1/p' <<<"$status")"
plots="$(sed -n 's/.*data-charts="\([0-9]*\)".*/\1/p' <<<"$status")"
# 2 norms x 3 depths x 2 steps in the self-test, then the default view; each view 5 per-layer
# plots, 2 of the attention projections, 1 of the pre-norm sums, 3 per low-precision dtype (2),
# 2 across depths (3 after a step), 2 of the learning-rate sweep.
check "every view drawn ($views of 13)" test "${views:-0}" -eq 13
check "at least 7 x 18 + 6 x 19 plots drawn ($plots)" test "${plots:-0}" -ge 240
check "the checks table is on the page" grep -q 'pre_over_post_last_layer_exponent' "$work/dom.html"
# At initialization the per-layer plots of the gradients and the activations are over the 2 seeds
# (the geometric mean and its min-max band: 4 plots in the default view); after a step, one seed.
bands="$(grep -o "geometric mean over the 2 seeds" "$work/dom.html" | wc -l)"
check "the default view's 4 per-layer plots are over the seeds ($bands)" test "$bands" -eq 4
check "the page has the bands over the seeds" grep -q 'id="nc-seed-bands">{"seeds":2,"runs":\[{' "$work/dom.html"
check "no console error in chromium's log" \
  bash -c "! grep -E 'CONSOLE|Uncaught' '$work/chromium.log' | grep -v 'dbus' | grep -q ."
timeout 120 "$browser" "${flags[@]}" --hide-scrollbars --window-size=1500,3400 \
  --screenshot="$work/study.png" "file://$dir/index.html" >/dev/null 2>&1
check "screenshot kept ($work/study.png)" test -s "$work/study.png"
echo "$fails failed"
exit $((fails > 0))
