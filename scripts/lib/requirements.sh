# Sourced by scripts/demo, scripts/test and .ci/run: the one list of the
# programs the proxy's demo and tests need, and the Debian package of each.
#
# `require_programs` checks them all. When some are missing it installs their
# packages if it runs as root where apt-get exists; otherwise it prints one
# line naming the missing programs and the command that installs them, and
# exits 1.

# "program-or-file package" pairs. iptables brings both flavors (legacy and
# nft) and both families; the C compiler and the C library's headers and
# start files build and link the C parts of the TLS stack (ring) and every
# Rust binary (gcc only recommends libc6-dev, and recommends are not
# installed). containerd (ctr), skopeo and docker-registry take the built
# image into each runtime's store and a registry (tests/image.rs); setpriv
# and unshare run the proxy as an unprivileged container's process
# (tests/system_capabilities.rs). Debian's archive keys, trixie's among them
# (debian-archive-keyring 2023.3+deb12u2 or later), verify the current nft
# that scripts/lib/nft-current.sh fetches.
KP_REQUIRED_PROGRAMS=(
  "iptables-legacy-restore iptables"
  "iptables-nft-restore iptables"
  "ip6tables-legacy-restore iptables"
  "ip6tables-nft-restore iptables"
  "nft nftables"
  "ipset ipset"
  "conntrack conntrack"
  "ip iproute2"
  "sysctl procps"
  "mmdebstrap mmdebstrap"
  "containerd containerd"
  "ctr containerd"
  "skopeo skopeo"
  "docker-registry docker-registry"
  "setpriv util-linux"
  "unshare util-linux"
  "cc gcc"
  "/usr/include/stdio.h libc6-dev"
  "/usr/share/keyrings/debian-archive-trixie-automatic.gpg debian-archive-keyring"
)

# A program on PATH (in /usr/sbin too, for non-root users), or a file given
# by its absolute path.
kp_find_program() {
  case "$1" in
    /*) [ -e "$1" ] ;;
    *) PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin" command -v "$1" >/dev/null 2>&1 ;;
  esac
}

# Sets KP_MISSING_PROGRAMS and KP_MISSING_PACKAGES.
kp_missing() {
  KP_MISSING_PROGRAMS=()
  KP_MISSING_PACKAGES=()
  local pair program package
  for pair in "${KP_REQUIRED_PROGRAMS[@]}"; do
    program=${pair% *}
    package=${pair#* }
    if ! kp_find_program "$program"; then
      KP_MISSING_PROGRAMS+=("$program")
      case " ${KP_MISSING_PACKAGES[*]} " in
        *" $package "*) ;;
        *) KP_MISSING_PACKAGES+=("$package") ;;
      esac
    fi
  done
}

kp_apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  local attempt
  for attempt in 1 2 3; do
    if apt-get update -qq && apt-get install -y -qq --no-install-recommends "$@" >/dev/null; then
      return 0
    fi
    [ "$attempt" = 3 ] && return 1
    sleep 5
  done
}

require_programs() {
  if ! command -v cargo >/dev/null 2>&1; then
    echo "error: cargo not found: install Rust (rustup) first" >&2
    exit 1
  fi
  kp_missing
  [ "${#KP_MISSING_PROGRAMS[@]}" = 0 ] && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "Installing ${KP_MISSING_PACKAGES[*]} (missing: ${KP_MISSING_PROGRAMS[*]})" >&2
    if ! kp_apt_install "${KP_MISSING_PACKAGES[@]}"; then
      echo "error: apt-get install ${KP_MISSING_PACKAGES[*]} failed three times" >&2
      exit 1
    fi
    kp_missing
    [ "${#KP_MISSING_PROGRAMS[@]}" = 0 ] && return 0
    echo "error: still missing after installing: ${KP_MISSING_PROGRAMS[*]}" >&2
    exit 1
  fi
  echo "error: missing ${KP_MISSING_PROGRAMS[*]}; install with: sudo apt-get install -y ${KP_MISSING_PACKAGES[*]}" >&2
  exit 1
}

# Warns when the file system holding DIR (created if missing) has less free
# space than a full build and test run takes (about 5 GB), so that a full
# disk is named before a linker dies of it.
kp_report_disk_space() {
  mkdir -p "$1"
  local free_kib
  free_kib=$(df -Pk "$1" | awk 'NR == 2 {print $4}')
  if [ -n "$free_kib" ] && [ "$free_kib" -lt $((6 * 1024 * 1024)) ]; then
    echo "warning: only $((free_kib / 1024)) MiB free for $1; building and testing everything takes about 5 GB" >&2
  fi
}
