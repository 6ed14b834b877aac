#!/usr/bin/env bash
# Puts the `nft` program of a current nftables release (Debian trixie's
# nftables 1.1.3 with libnftnl 1.2.9) at target/nft-current/bin/nft and
# prints that path. The kernel tests list what the proxy commits with it and
# with the system's nft (bookworm's 1.0.6): everything committed must list,
# unchanged, with both (issue 26).
#
# Nothing is installed: the packages are fetched with apt-get's own state in
# target/nft-current/apt (its sources list, lists and cache; the system's
# apt state, /etc and /usr are untouched) and unpacked with `dpkg-deb -x`.
# Trixie's libnftables needs glibc 2.38 and bookworm has 2.36, so trixie's
# C library comes too, and the wrapper runs nft through trixie's own
# dynamic loader with every library from the unpacked tree.
#
# Run again, it only checks the wrapper (well under a second). Any failure
# is one line on stderr and exit status 1; nothing is skipped.
#
# Usage: scripts/lib/nft-current.sh   (prints the wrapper's absolute path)
set -euo pipefail

# The releases tested. Debian stable keeps the upstream version for its
# lifetime (fixes come as -1+deb13uN), so only the upstream part is checked.
NFTABLES_VERSION=1.1.3
LIBNFTNL_VERSION=1.2.9
SUITE=trixie
MIRROR=${KP_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# Debian's archive keys, the union of every key the package holds; bookworm's
# debian-archive-keyring has held trixie's since 2023.3+deb12u2 (which ships
# TRIXIE_KEYRING too).
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
TRIXIE_KEYRING=/usr/share/keyrings/debian-archive-trixie-automatic.gpg
# nft and every shared library it loads, C library and loader included (the
# wrapper checks below that none comes from the system instead).
PACKAGES=(nftables libnftables1 libnftnl11 libc6 libmnl0 libxtables12
  libjansson4 libgmp10 libedit2 libtinfo6 libbsd0 libmd0)

die() {
  echo "error: nft-current: $*" >&2
  exit 1
}

cd "$(dirname "$0")/../.."
prefix=$PWD/target/nft-current
wrapper=$prefix/bin/nft

# The wrapper runs and is the release wanted: nothing to do.
if [ -x "$wrapper" ] \
  && "$wrapper" --version 2>/dev/null | grep -qx "nftables v$NFTABLES_VERSION .*"; then
  echo "$wrapper"
  exit 0
fi

for program in apt-get apt-cache dpkg-deb; do
  command -v "$program" >/dev/null 2>&1 \
    || die "$program not found: fetching Debian $SUITE's nft needs apt and dpkg (a Debian machine)"
done
[ -r "$KEYRING" ] && [ -r "$TRIXIE_KEYRING" ] \
  || die "$TRIXIE_KEYRING missing: install debian-archive-keyring 2023.3+deb12u2 or later (it verifies Debian $SUITE's packages)"

rm -rf "$prefix"
apt_dir=$prefix/apt
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$prefix/debs" "$prefix/root" "$prefix/bin"
echo "deb [signed-by=$KEYRING target=Packages] $MIRROR $SUITE main" >"$apt_dir/sources.list"
: >"$apt_dir/status"
apt_options=(
  -o "Dir::Etc::sourcelist=$apt_dir/sources.list"
  -o Dir::Etc::sourceparts=/dev/null
  -o "Dir::State::Lists=$apt_dir/lists"
  -o "Dir::State::status=$apt_dir/status"
  -o "Dir::Cache=$apt_dir/cache"
  -o Acquire::Languages=none
)
# As root apt would fetch as the _apt user, who cannot write here.
[ "$(id -u)" = 0 ] && apt_options+=(-o APT::Sandbox::User=root)

# apt-get update exits 0 when an index could not be fetched (a warning), so
# success is the package list being there.
fetched=
for attempt in 1 2 3; do
  if apt-get "${apt_options[@]}" -qq update >"$prefix/apt.log" 2>&1 \
    && compgen -G "$apt_dir/lists/*_Packages*" >/dev/null; then
    fetched=yes
    break
  fi
  [ "$attempt" = 3 ] || sleep 5
done
[ -n "$fetched" ] \
  || die "apt-get update of $MIRROR $SUITE failed three times: $(tail -n 3 "$prefix/apt.log" | tr '\n' ' ')"

# The candidates must be the releases this project tests.
candidate() {
  apt-cache "${apt_options[@]}" policy "$1" | awk '$1 == "Candidate:" {print $2}'
}
nftables_deb=$(candidate nftables)
libnftnl_deb=$(candidate libnftnl11)
case "$nftables_deb" in
  "$NFTABLES_VERSION"-*) ;;
  *) die "Debian $SUITE offers nftables '${nftables_deb:-none}', not $NFTABLES_VERSION: update NFTABLES_VERSION in $0 and the docs that name it" ;;
esac
case "$libnftnl_deb" in
  "$LIBNFTNL_VERSION"-*) ;;
  *) die "Debian $SUITE offers libnftnl11 '${libnftnl_deb:-none}', not $LIBNFTNL_VERSION: update LIBNFTNL_VERSION in $0" ;;
esac

(cd "$prefix/debs" && apt-get "${apt_options[@]}" -qq download "${PACKAGES[@]}") >>"$prefix/apt.log" 2>&1 \
  || die "apt-get download ${PACKAGES[*]} from $SUITE failed: $(tail -n 3 "$prefix/apt.log" | tr '\n' ' ')"
for deb in "$prefix"/debs/*.deb; do
  dpkg-deb -x "$deb" "$prefix/root" || die "dpkg-deb -x $deb failed"
done

# The loader of the unpacked C library, and the directory of its libraries
# (usr/lib/<multiarch triplet>/ in trixie).
loaders=("$prefix"/root/usr/lib/*/ld-linux*.so.*)
[ -e "${loaders[0]}" ] || die "no dynamic loader in the unpacked libc6 of $SUITE (looked for usr/lib/*/ld-linux*.so.*)"
loader=${loaders[0]#"$prefix"/}
libdir=$(dirname "$loader")

# Paths relative to the wrapper's own place, so the tree may move with the
# repository; --argv0 keeps nft's own name in its messages. Written beside
# its place and moved there only once every check below has passed, so that
# a wrapper in place is always a checked one.
cat >"$wrapper.new" <<EOF
#!/bin/sh
# Debian $SUITE's nft $NFTABLES_VERSION (libnftnl $LIBNFTNL_VERSION) with $SUITE's C library,
# unpacked by scripts/lib/nft-current.sh.
prefix=\$(cd "\$(dirname "\$0")/.." && pwd)
exec "\$prefix/$loader" --library-path "\$prefix/$libdir" --argv0 nft "\$prefix/root/usr/sbin/nft" "\$@"
EOF
chmod +x "$wrapper.new"

# Every library must come from the unpacked tree: one taken from the system
# would mix bookworm's code into the release under test.
listed=$("$prefix/$loader" --library-path "$prefix/$libdir" --list "$prefix/root/usr/sbin/nft" 2>&1) \
  || die "trixie's loader cannot load nft: $listed"
outside=$(echo "$listed" | awk -v inside="$prefix/" '/=>/ && index($3, inside) != 1 {print $1}' | tr '\n' ' ')
[ -z "$outside" ] || die "nft loads ${outside}from outside $prefix: add their $SUITE packages to PACKAGES in $0"

version=$("$wrapper.new" --version 2>&1) || die "$wrapper.new does not run: $version"
echo "$version" | grep -qx "nftables v$NFTABLES_VERSION .*" \
  || die "$wrapper.new reports '$version', not nftables v$NFTABLES_VERSION"
# Only the unpacked tree and the wrapper are needed from here on.
rm -rf "$apt_dir" "$prefix/debs" "$prefix/apt.log"
mv "$wrapper.new" "$wrapper"
echo "nft-current: Debian $SUITE nftables $nftables_deb, libnftnl $libnftnl_deb at $wrapper" >&2
echo "$wrapper"
