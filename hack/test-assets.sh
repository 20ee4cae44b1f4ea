#!/usr/bin/env bash
# Builds the test control plane (kube-apiserver, etcd), the CNI reference plugins, Prometheus with promtool and
# the real node (kubelet, kube-scheduler, kube-controller-manager, kubectl, containerd,
# Multus, NFD's nfd-master, the image tool and the pause binary) from source through
# the Go module proxy, at the versions pinned in the build modules under hack/, and
# caches them outside the work tree. A second run finds the cache and costs well under
# a second. Builds run one at a time (a lock on the cache), so two work trees share one
# build.
#
# Usage:
#   hack/test-assets.sh            build what is missing, print where everything is
#   hack/test-assets.sh env        build what is missing, print shell exports for
#                                  KUBEBUILDER_ASSETS, HWIPAM_CNI_BIN_DIR,
#                                  HWIPAM_NODE_BIN_DIR, HWIPAM_PROMTOOL and HWIPAM_PROMETHEUS
#   hack/test-assets.sh image-tool build only hwipam-image (for `make image`), print its path
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

# Prometheus and promtool: promtool tests deploy/monitoring's alerting rules, the
# real-node suite runs the server on the node's daemons.
prom_dir="$here/monitoring/prometheus"
prom_version=$(module_version "$prom_dir" github.com/prometheus/prometheus)
prom_out="$cache_root/monitoring/prometheus-$prom_version-$(cache_key "$prom_dir")"

build_prometheus() {
	local out=$1
	log "building prometheus and promtool $prom_version (first run only; ~5 minutes on 2 cores)"
	(cd "$prom_dir" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/" \
		github.com/prometheus/prometheus/cmd/promtool github.com/prometheus/prometheus/cmd/prometheus)
}

# The real node: Kubernetes node components at the apiserver's version, containerd,
# Multus, and hwipam-image (images and a registry without Docker) with the pause binary.
node_dir="$here/node"
kube_node_version=$(module_version "$node_dir/kubernetes" k8s.io/kubernetes)
kube_node_out="$cache_root/node/kubernetes-$kube_node_version-$(cache_key "$node_dir/kubernetes")"
containerd_version=$(module_version "$node_dir/containerd" github.com/containerd/containerd/v2)
containerd_out="$cache_root/node/containerd-$containerd_version-$(cache_key "$node_dir/containerd")"
multus_version=$(module_version "$node_dir/multus" gopkg.in/k8snetworkplumbingwg/multus-cni.v4)
multus_out="$cache_root/node/multus-$multus_version-$(cache_key "$node_dir/multus")"
nfd_version=$(module_version "$node_dir/nfd" sigs.k8s.io/node-feature-discovery)
nfd_out="$cache_root/node/nfd-$nfd_version-$(cache_key "$node_dir/nfd")"
image_dir="$here/image"
image_out="$cache_root/node/image-$(cache_key "$image_dir")-$(cat "$image_dir"/*.go "$image_dir"/pause/*.go | sha256sum | cut -c1-12)"
node_bin="$cache_root/node/bin-$(echo "$kube_node_out $containerd_out $multus_out $nfd_out $image_out" | sha256sum | cut -c1-12)"

build_kube_node() {
	local out=$1 minor t
	minor=$(echo "$kube_node_version" | cut -d. -f2)
	local date ldflags="-s -w"
	date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags+=" -X $p.gitVersion=$kube_node_version -X $p.gitMajor=1 -X $p.gitMinor=$minor"
		ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=$date"
	done
	for t in kubelet kube-scheduler kube-controller-manager kubectl; do
		log "building $t $kube_node_version (first run only; kubelet ~4, the rest ~2 minutes each on 2 cores)"
		(cd "$node_dir/kubernetes" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" \
			-o "$out/$t" "k8s.io/kubernetes/cmd/$t")
	done
}

build_containerd() {
	local out=$1 t
	log "building containerd $containerd_version, its runc shim and ctr (first run only; ~2 minutes)"
	for t in containerd containerd-shim-runc-v2 ctr; do
		(cd "$node_dir/containerd" && CGO_ENABLED=0 go build -trimpath -tags "no_btrfs no_devmapper no_zfs" \
			-ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$containerd_version" \
			-o "$out/$t" "github.com/containerd/containerd/v2/cmd/$t")
	done
}

build_multus() {
	local out=$1
	log "building multus $multus_version (thin plugin; first run only; ~1 minute)"
	(cd "$node_dir/multus" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" \
		-o "$out/multus" gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus)
}

build_nfd() {
	local out=$1
	log "building nfd-master $nfd_version (first run only; ~4 minutes on 2 cores)"
	(cd "$node_dir/nfd" && CGO_ENABLED=0 go build -trimpath \
		-ldflags "-s -w -X sigs.k8s.io/node-feature-discovery/pkg/version.version=$nfd_version" \
		-o "$out/nfd-master" sigs.k8s.io/node-feature-discovery/cmd/nfd-master)
}

build_image_tool() {
	local out=$1
	log "building hwipam-image and pause"
	(cd "$image_dir" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/hwipam-image" . &&
		CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/pause" ./pause)
}

# link_node_bin DEST puts one symlink per node binary into DEST, so that the harness
# finds them all in one directory.
link_node_bin() {
	local out=$1 d f
	for d in "$kube_node_out" "$containerd_out" "$multus_out" "$nfd_out" "$image_out"; do
		for f in "$d"/*; do ln -s "$f" "$out/$(basename "$f")"; done
	done
}

mkdir -p "$cache_root"
exec 9>"$cache_root/.lock"
flock 9

if [[ ${1:-} == image-tool ]]; then
	[[ -x "$image_out/hwipam-image" ]] || build_into "$image_out" build_image_tool
	echo "$image_out/hwipam-image"
	exit 0
fi

# ensure WHAT DEST BUILDFN FILE... builds into DEST unless every FILE is there.
ensure() {
	local what=$1 dest=$2 fn=$3 f
	shift 3
	for f in "$@"; do
		if [[ ! -x "$dest/$f" ]]; then
			build_into "$dest" "$fn"
			return
		fi
	done
	log "$what cached in $dest"
}

ensure "control plane" "$cp_out" build_controlplane kube-apiserver etcd
ensure "CNI plugins" "$cni_out" build_cni macvlan cnitool noop
ensure "prometheus, promtool" "$prom_out" build_prometheus prometheus promtool
ensure "hwipam-image" "$image_out" build_image_tool hwipam-image pause
ensure containerd "$containerd_out" build_containerd containerd containerd-shim-runc-v2 ctr
ensure multus "$multus_out" build_multus multus
ensure nfd-master "$nfd_out" build_nfd nfd-master
ensure "kubelet, kube-scheduler, kube-controller-manager, kubectl" "$kube_node_out" build_kube_node \
	kubelet kube-scheduler kube-controller-manager kubectl
[[ -d "$node_bin" ]] || build_into "$node_bin" link_node_bin

case ${1:-} in
env)
	printf 'export KUBEBUILDER_ASSETS=%q\n' "$cp_out"
	printf 'export HWIPAM_CNI_BIN_DIR=%q\n' "$cni_out"
	printf 'export HWIPAM_NODE_BIN_DIR=%q\n' "$node_bin"
	printf 'export HWIPAM_PROMTOOL=%q\n' "$prom_out/promtool"
	printf 'export HWIPAM_PROMETHEUS=%q\n' "$prom_out/prometheus"
	;;
*)
	printf 'KUBEBUILDER_ASSETS=%s\nHWIPAM_CNI_BIN_DIR=%s\nHWIPAM_NODE_BIN_DIR=%s\nHWIPAM_PROMTOOL=%s\nHWIPAM_PROMETHEUS=%s\n' \
		"$cp_out" "$cni_out" "$node_bin" "$prom_out/promtool" "$prom_out/prometheus"
	;;
esac
