#!/usr/bin/env bash
# Validates the Kubernetes deployment offline, with no cluster:
#   1. renders every overlay (cpu-only, gpu) and each optional component on top of one, with
#      `kubectl kustomize` (any failure to render fails the check);
#   2. validates every rendered object against the Kubernetes API schemas of K8S_VERSION
#      (strict: unknown fields fail) with the PyPI package kubernetes-validate, installed in
#      a venv this script makes; the custom resources (KEDA's ScaledObject, the
#      prometheus-operator's ServiceMonitor) have no schema there and are checked field by
#      field against what their CRDs define (check.py);
#   3. checks what the manifests mean for Flotilla (check.py): each overlay holds the objects
#      it should (the gpu overlay a container requesting nvidia.com/gpu, cpu-only none), the
#      flags exist (docs/cli.md), the autoscaler's metric exists (the coordinator's http.rs),
#      selectors, ports, Secrets, the worker's grace against the pod's, security settings;
#   4. static checks of the Containerfile (deploy/container/check.sh builds the image and runs
#      it as these manifests do).
# Exits non-zero on any failure. Needs: bash, python3 (with venv), kubectl whose kustomize is
# v5 or later (kubectl >= 1.27), and PyPI for the first run (later runs reuse the venv).
#   deploy/kubernetes/check.sh
set -euo pipefail

K8S_VERSION=1.30           # the Kubernetes API the manifests are validated against
KV_VERSION=1.37.0          # kubernetes-validate (ships the schemas of 1.25 to 1.37)
KUSTOMIZE_MIN_MAJOR=5      # components, `labels` with includeTemplates, `patches`

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
venv=${FLOTILLA_KV_VENV:-${TMPDIR:-/tmp}/flotilla-kv}

say() { printf '%s\n' "$*"; }
die() { printf 'check.sh: %s\n' "$*" >&2; exit 1; }

# --- kubectl (kustomize) ---
command -v kubectl >/dev/null 2>&1 || die "kubectl not found. Debian's kubernetes-client (bookworm: 1.20) embeds kustomize v2, too old for these kustomizations; install kubectl >= 1.27"
kver=$(kubectl version --client 2>/dev/null | sed -n 's/^Kustomize Version: v\{0,1\}\([0-9][0-9]*\)\..*/\1/p')
[ -n "$kver" ] && [ "$kver" -ge "$KUSTOMIZE_MIN_MAJOR" ] \
  || die "kubectl's kustomize is v${kver:-unknown}; these kustomizations need v$KUSTOMIZE_MIN_MAJOR or later (kubectl >= 1.27)"
say "kubectl: $(kubectl version --client 2>/dev/null | tr '\n' ' ')"

# --- the validator, in its own venv ---
if ! "$venv/bin/python" -c "import kubernetes_validate.version as v, sys; sys.exit(v.__version__ != '$KV_VERSION')" 2>/dev/null; then
  say "making $venv with kubernetes-validate==$KV_VERSION"
  rm -rf "$venv"
  if ! python3 -m venv "$venv" 2>/dev/null; then
    # Debian ships venv apart from python3; CI runs as root.
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      say "python3 -m venv failed: installing python3-venv"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null; }
      rm -rf "$venv"
      python3 -m venv "$venv"
    else
      die "python3 -m venv failed (Debian: apt-get install python3-venv)"
    fi
  fi
  "$venv/bin/pip" install -q --disable-pip-version-check "kubernetes-validate==$KV_VERSION"
fi

# --- render ---
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# A component is used as docs/kubernetes.md says: listed under `components:` in an overlay's
# own kustomization. So each combination is a copy of an overlay with that list appended,
# written beside a copy of this folder (kustomize refuses absolute paths to bases).
cp -r "$here" "$tmp/k"
renders=()
render() { # NAME DIR
  local out="$tmp/$1.yaml"
  if ! kubectl kustomize "$2" >"$out" 2>"$tmp/err"; then
    cat "$tmp/err" >&2
    die "kubectl kustomize failed for $1"
  fi
  say "rendered $1: $(grep -c '^kind:' "$out") objects"
  renders+=("$1=$out")
}
combo() { # OVERLAY COMPONENT...
  local name=$1 dir
  for c in "${@:2}"; do name="$name+$c"; done
  dir="$tmp/k/overlays/$name"
  cp -r "$tmp/k/overlays/$1" "$dir"
  if grep -q '^components:' "$dir/kustomization.yaml"; then die "overlays/$1 already lists components"; fi
  {
    printf '\ncomponents:\n'
    for c in "${@:2}"; do printf '  - ../../components/%s\n' "$c"; done
  } >>"$dir/kustomization.yaml"
  render "$name" "$dir"
}

for o in "$here"/overlays/*/; do
  o=$(basename "$o")
  render "$o" "$tmp/k/overlays/$o"
done
for c in "$here"/components/*/; do
  [ -f "$c/kustomization.yaml" ] || continue
  combo cpu-only "$(basename "$c")"
done
combo gpu prometheus-servicemonitor autoscale-keda
combo gpu tls
combo gpu ha

# --- validate ---
"$venv/bin/python" "$here/check.py" "$K8S_VERSION" "$repo" "${renders[@]}"
