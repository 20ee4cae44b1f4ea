#!/usr/bin/env bash
# Builds the test control plane (kube-apiserver, etcd) and the CNI reference plugins
# from source through the Go module proxy, at the versions pinned in the build modules
# under hack/, and caches them outside the work tree. A second run finds the cache and
# costs well under a second.
#
# Usage:
#   hack/test-assets.sh            build what is missing, print where everything is
#   hack/test-assets.sh env        build what is missing, print shell exports for
#                                  KUBEBUILDER_ASSETS and HWIPAM_CNI_BIN_DIR
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache_root=${HWIPAM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hwipam}
go_version=$(go env GOVERSION)

log() { printf 'test-assets: %s\n' "$*" >&2; }

# module_version MODDIR MODULE prints the version of MODULE that MODDIR's go.mod requires.
module_version() {
	(cd "$1" && go list -m -f '{{.Version}}' "$2")
}

# cache_key DIR... hashes the build modules' go.mod/go.sum and the Go version, so that a
# change of any pin or of the toolchain builds into a fresh directory.
cache_key() {
	local d
	for d in "$@"; do cat "$d/go.mod" "$d/go.sum"; done | { cat; echo "$go_version"; } | sha256sum | cut -c1-12
}

# build_into DEST BUILDFN runs BUILDFN with a scratch directory and moves the result to
# DEST only when it succeeded, so an interrupted build never leaves a partial cache.
build_into() {
	local dest=$1 fn=$2 tmp
	mkdir -p "$(dirname "$dest")"
	tmp=$(mktemp -d "$dest.tmp.XXXXXX")
	trap 'rm -rf "$tmp"' RETURN
	"$fn" "$tmp"
	rm -rf "$dest"
	mv "$tmp" "$dest"
	trap - RETURN
}

cp_dir="$here/controlplane"
k8s_version=$(module_version "$cp_dir/kube-apiserver" k8s.io/kubernetes)
etcd_version=$(module_version "$cp_dir/etcd" go.etcd.io/etcd/server/v3)
cp_out="$cache_root/controlplane/k8s-$k8s_version-etcd-$etcd_version-$(cache_key "$cp_dir/kube-apiserver" "$cp_dir/etcd")"

build_controlplane() {
	local out=$1 minor
	minor=$(echo "$k8s_version" | cut -d. -f2)
	local pkg=k8s.io/component-base/version cpkg=k8s.io/client-go/pkg/version
	local date
	date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
	local ldflags="-s -w"
	for p in $pkg $cpkg; do
		ldflags+=" -X $p.gitVersion=$k8s_version -X $p.gitMajor=1 -X $p.gitMinor=$minor"
		ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=$date"
	done
	log "building kube-apiserver $k8s_version (first run only; ~8-10 minutes on 2 cores)"
	(cd "$cp_dir/kube-apiserver" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" \
		-o "$out/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver)
	log "building etcd $etcd_version"
	(cd "$cp_dir/etcd" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/etcd" .)
}

cni_dir="$here/cniplugins"
cni_version=$(module_version "$cni_dir" github.com/containernetworking/plugins)
cni_out="$cache_root/cni/plugins-$cni_version-$(cache_key "$cni_dir")"

build_cni() {
	local out=$1 t
	log "building CNI plugins $cni_version and cnitool"
	(cd "$cni_dir" && for t in cnitool ipam/host-local main/bridge main/host-device main/macvlan; do
		case $t in
		cnitool) pkg=github.com/containernetworking/cni/cnitool ;;
		*) pkg=github.com/containernetworking/plugins/plugins/$t ;;
		esac
		CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/$(basename "$t")" "$pkg"
	done)
	# The floor for the CNI benchmark: the cost of exec'ing a trivial Go binary.
	(cd "$cni_dir" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/noop" ./noop)
}

mkdir -p "$cache_root"
exec 9>"$cache_root/.lock"
flock 9

if [[ -x "$cp_out/kube-apiserver" && -x "$cp_out/etcd" ]]; then
	log "control plane cached in $cp_out"
else
	build_into "$cp_out" build_controlplane
fi
if [[ -x "$cni_out/macvlan" && -x "$cni_out/cnitool" && -x "$cni_out/noop" ]]; then
	log "CNI plugins cached in $cni_out"
else
	build_into "$cni_out" build_cni
fi

case ${1:-} in
env)
	printf 'export KUBEBUILDER_ASSETS=%q\n' "$cp_out"
	printf 'export HWIPAM_CNI_BIN_DIR=%q\n' "$cni_out"
	;;
*)
	printf 'KUBEBUILDER_ASSETS=%s\nHWIPAM_CNI_BIN_DIR=%s\n' "$cp_out" "$cni_out"
	;;
esac
