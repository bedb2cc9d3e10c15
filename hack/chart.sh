#!/usr/bin/env bash
# The chart is the one source of Ferry's install: deploy/ is charts/ferry rendered with values-deploy.yaml.
#   hack/chart.sh          renders deploy/ from the chart (after changing the chart)
#   hack/chart.sh --check  what CI runs: helm lint (default values, deploy/'s, and every option on), deploy/ as
#                          rendered, the CRDs as `ferry crds` prints them, and the alert rules through promtool's
#                          checker and unit tests.
# Needs FERRY_TOOLS_BIN (hack/setup.sh prints it): helm and promtool are built there from tools/.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${FERRY_TOOLS_BIN:-$(hack/setup.sh)}
helm=$bin/helm promtool=$bin/promtool
chart=charts/ferry

# deploy/'s files, each one template of the chart: helm's "# Source:" lines and the blank lines it leaves before
# a document's end dropped.
declare -A files=(
  [rbac/ferry-rbac.yaml]=templates/rbac.yaml
  [rbac/ferry-admission.yaml]=templates/admission.yaml
  [rbac/ferry-providers.yaml]=templates/providers.yaml
  [controller.yaml]="templates/deployment.yaml templates/service.yaml"
)
render() {
  local out=$1 file t args
  for file in "${!files[@]}"; do
    args=()
    for t in ${files[$file]}; do args+=(--show-only "$t"); done
    mkdir -p "$(dirname "$out/$file")"
    "$helm" template ferry "$chart" --namespace ferry-system -f "$chart/values-deploy.yaml" "${args[@]}" |
      grep -v '^# Source: ' | sed '1{/^---$/d}' |
      awk '/^$/ { blank++; next } { if ($0 != "---") while (blank-- > 0) print ""; blank = 0; print }' >"$out/$file"
  done
}

if [ "${1:-}" != --check ]; then
  render deploy
  echo "deploy/ rendered from $chart"
  exit 0
fi

"$helm" lint --strict "$chart"
"$helm" lint --strict "$chart" -f "$chart/values-deploy.yaml"
"$helm" lint --strict "$chart" --namespace team-ops --set 'watchNamespaces={team-a,team-b}' \
  --set metrics.serviceMonitor.enabled=true --set metrics.prometheusRule.enabled=true \
  --set metrics.dashboard.enabled=true

work=$(mktemp -d "${TMPDIR:-/tmp}/ferry-chart-XXXXXX")
trap 'rm -rf "$work"' EXIT
render "$work"
fail=0
for file in "${!files[@]}"; do
  if ! diff -u "deploy/$file" "$work/$file"; then
    echo "error: deploy/$file differs from the chart; run hack/chart.sh" >&2
    fail=1
  fi
done
if ! cmp -s deploy/crds/ferry.yaml "$chart/crds/ferry.yaml"; then
  echo "error: $chart/crds/ferry.yaml differs from deploy/crds/ferry.yaml; copy it (cargo run -q --bin ferry -- crds)" >&2
  fail=1
fi
jq empty "$chart/files/dashboard.json"
"$promtool" check rules "$chart/files/alerts.yaml"
(cd "$chart/tests" && "$promtool" test rules alerts_test.yaml)
[ "$fail" = 0 ] && echo "chart: lint, deploy/ as rendered, CRDs, alert rules and their tests"
exit "$fail"
