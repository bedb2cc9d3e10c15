#!/usr/bin/env bash
# Builds the lab's Go tools (kube-apiserver, kube-controller-manager, kubectl, etcd, vcsim, MinIO, KubeVirt's
# and CDI's admission) from the pinned modules
# under tools/, once, into a cache outside the repo. Prints the bin directory on stdout. With --node, the tools of a
# real node (kubelet, kube-scheduler, containerd, CNI plugins, CDI's controller and importer) into a bin directory of
# their own.
# A second run finds the stamp and returns in well under a second.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${FERRY_TOOLS_DIR:-$HOME/.cache/ferry/tools}
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-trimpath

K8S=1.37.2

# build TOOL OUTPUTS... : builds each package into $cache/TOOL-<hash>/bin when its stamp is missing.
key() {
  (cd "$root/tools/$1" && cat go.mod go.sum ./*.go 2>/dev/null
    [ ! -d standin ] || find standin -type f | LC_ALL=C sort | xargs cat
    # Stand-ins shared with another tool (`=> ../other/standin/...`).
    grep -o '=> \.\./[^ ]*' go.mod | cut -c4- | while read -r dir; do find "$dir" -type f | LC_ALL=C sort | xargs cat; done
    go version) | sha256sum | cut -c1-16
}

# The version a Kubernetes binary reports, as a release build stamps it.
kube_ldflags() {
  local ld="-s -w" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X '$p.gitVersion=v$K8S' -X '$p.gitMajor=1' -X '$p.gitMinor=37' -X '$p.gitTreeState=clean'"
    ld+=" -X '$p.buildDate=1970-01-01T00:00:00Z'"
  done
  echo "$ld"
}

build_kube() {
  local out=$1
  (cd "$root/tools/kube" && go build -ldflags "$(kube_ldflags)" -o "$out/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl)
}
build_etcd() { (cd "$root/tools/etcd" && go build -ldflags "-s -w" -o "$1/etcd" go.etcd.io/etcd/server/v3); }
build_vcsim() { (cd "$root/tools/vcsim" && go build -ldflags "-s -w" -o "$1/vcsim" .); }
# MinIO: the real S3-compatible server that staging tests write to.
build_minio() { (cd "$root/tools/minio" && go build -ldflags "-s -w" -o "$1/minio" github.com/minio/minio); }
# virt-api's VM and VMI admission webhooks, from KubeVirt's own module; cdi-apiserver's DataVolume ones, from CDI's.
build_kubevirt_admission() {
  (cd "$root/tools/kubevirt-admission" && go build -ldflags "-s -w" -o "$1/kubevirt-admission" .)
}
# Helm, which installs Ferry's chart (charts/ferry) and lints it; promtool, Prometheus' own checker and unit-test
# runner for the alert rules the chart ships.
build_helm() {
  (cd "$root/tools/helm" && go build -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=v4.3.2" \
    -o "$1/helm" helm.sh/helm/v4/cmd/helm)
}
build_promtool() {
  (cd "$root/tools/promtool" && go build -tags remove_all_sd -ldflags "-s -w" -o "$1/promtool" \
    github.com/prometheus/prometheus/cmd/promtool)
}
build_cdi_admission() { (cd "$root/tools/cdi-admission" && go build -ldflags "-s -w" -o "$1/cdi-admission" .); }
# CDI's controller and importer from CDI's own module (without cgo: a stand-in for the proxy-refused libnbd), and
# the installer that renders them from CDI's operator factories; for a real node, which runs them as pods.
build_cdi() {
  local p=kubevirt.io/containerized-data-importer/cmd
  (cd "$root/tools/cdi" && go build -ldflags "-s -w" -o "$1/" "$p/cdi-controller" "$p/cdi-importer" &&
    go build -ldflags "-s -w" -o "$1/cdi-install" .)
}
# KubeVirt's virt-controller, virt-handler and virt-launcher with its helpers, from KubeVirt's own module: the
# handler and launcher with cgo (the handler includes <linux/kvm.h>; the launcher loads libvirt.so.0 at run time,
# `libvirt_dlopen`, so no libvirt headers), the rest without; the launcher image's scripts and configuration from
# the same module; and the installer that renders them from virt-operator's factories. For a real node.
build_kubevirt() {
  local out=$1 p=kubevirt.io/kubevirt/cmd src
  (cd "$root/tools/kubevirt" &&
    go build -ldflags "-s -w" -o "$out/" "$p/virt-controller" "$p/virt-chroot" "$p/virt-freezer" \
      "$p/virt-launcher-monitor" "$p/virt-probe" "$p/virt-tail" "$p/virt-launcher/libvirt-hook-client" &&
    CGO_ENABLED=1 go build -ldflags "-s -w" -o "$out/" "$p/virt-handler" &&
    CGO_ENABLED=1 go build -tags libvirt_dlopen -ldflags "-s -w" -o "$out/" "$p/virt-launcher" &&
    go build -ldflags "-s -w" -o "$out/kubevirt-install" . &&
    src=$(go list -m -f '{{.Dir}}' kubevirt.io/kubevirt) &&
    mkdir -p "$out/launcher-files" &&
    cp "$src/cmd/virt-launcher/node-labeller/node-labeller.sh" "$src/cmd/virt-launcher/qemu.conf" \
      "$src/cmd/virt-launcher/virtqemud.conf" "$src/cmd/virt-launcher/nsswitch.conf" "$src/cmd/virt-launcher/qemu" \
      "$out/launcher-files/" && chmod -R u+w "$out/launcher-files")
}
# A real node (`ferry lab up --node real`): the kubelet and kube-scheduler of the same Kubernetes release, built with
# the same flags; containerd with its runc shim and `ctr`, and the CNI plugins the lab's bridge network uses (in cni/).
build_node_kube() {
  local out=$1
  (cd "$root/tools/node-kube" && go build -ldflags "$(kube_ldflags)" -o "$out/" k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-scheduler)
}
build_containerd() {
  local out=$1 c=github.com/containerd/containerd/v2/cmd n=github.com/containernetworking/plugins/plugins
  (cd "$root/tools/containerd" &&
    go build -tags "no_btrfs no_devmapper no_zfs" -ldflags "-s -w" -o "$out/" \
      "$c/containerd" "$c/containerd-shim-runc-v2" "$c/ctr" &&
    mkdir -p "$out/cni" &&
    go build -ldflags "-s -w" -o "$out/cni/" "$n/main/bridge" "$n/main/loopback" "$n/ipam/host-local")
}

# Concurrent callers (parallel test binaries, a lab and a test run) wait for one builder.
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9

# The lab's tools; with --node, those of a real node instead (built only when a real node is asked for).
case ${1:-} in
  --node) tools=(node-kube containerd cdi kubevirt) ;;
  "") tools=(etcd vcsim minio kube kubevirt-admission cdi-admission helm promtool) ;;
  *) echo "usage: hack/tools.sh [--node]" >&2; exit 2 ;;
esac
bin="$cache/bin-$(for tool in "${tools[@]}"; do key "$tool"; done | sha256sum | cut -c1-16)"
for tool in "${tools[@]}"; do
  dir="$cache/$tool-$(key "$tool")"
  if [ ! -f "$dir/.done" ]; then
    echo "building $tool into $dir (cold builds of kube and minio take minutes on 2 cores)" >&2
    start=$(date +%s)
    rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
    "build_${tool//-/_}" "$dir.tmp"
    rm -rf "$dir" && mv "$dir.tmp" "$dir" && touch "$dir/.done"
    echo "built $tool in $(( $(date +%s) - start ))s" >&2
  fi
  mkdir -p "$bin"
  for f in "$dir"/*; do ln -sfn "$f" "$bin/$(basename "$f")"; done
done
echo "$bin"
