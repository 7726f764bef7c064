#!/bin/sh
# tests/fresh_machine.sh [--keep] [DIR]: the README's two commands on a bare
# Debian 12, as a new user meets them.
#
# Builds a minimal Debian 12 root with debootstrap (--variant=minbase, the
# sources of Debian's own container image) in DIR (default: a new folder
# under /var/tmp), installs git there and nothing else, clones this
# repository's committed HEAD into /root/kiln, and runs the README's set-up
# block (the ```sh block that holds `make test`), taken from the README and
# not copied here, one command at a time exactly as written, as root in
# the new root (chroot, with /proc, /sys and /dev mounted). Each command's
# exit status and time are printed, then a summary; the exit status is 1
# when any command failed. The root is removed at the end unless --keep.
#
# KILN_FRESH_MAKEFLAGS=-j8 runs the block's make commands in parallel.
# Needs: root, the Debian mirror, about 4 GiB of disk and 30 to 40 minutes
# on a 2-core machine (mostly the test suite). Not part of `make test`
# (CI's run would exceed its budget): run it before resolving anything
# that touches set-up.
set -eu
keep=0
if [ "${1:-}" = "--keep" ]; then keep=1; shift; fi
here=$(cd "$(dirname "$0")/.." && pwd)
root=${1:-$(mktemp -d /var/tmp/kiln-fresh.XXXXXX)}
mirror=${KILN_DEBIAN_MIRROR:-http://deb.debian.org/debian}
[ "$(id -u)" = 0 ] || { echo "fresh_machine: run as root (debootstrap, chroot, mount)"; exit 1; }

cleanup() {
  for m in dev/pts dev sys proc; do umount "$root/$m" 2>/dev/null || true; done
  [ "$keep" = 1 ] || rm -rf "$root"
}
trap cleanup EXIT

step() { echo "fresh_machine: $*"; }
t0=$(date +%s)
if ! command -v debootstrap >/dev/null; then
  step "installing debootstrap on this machine"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
step "debootstrap --variant=minbase bookworm $root"
debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.debootstrap.log" 2>&1 ||
  { tail -20 "$root.debootstrap.log"; exit 1; }
rm -f "$root.debootstrap.log"
cat >"$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${mirror%/debian}/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
rm -f "$root/etc/apt/sources.list"
cp /etc/resolv.conf "$root/etc/resolv.conf"
mount -t proc proc "$root/proc"
mount -t sysfs sys "$root/sys"
mount --bind /dev "$root/dev"
mount --bind /dev/pts "$root/dev/pts"

# KILN_FRESH_MAKEFLAGS (say -j8): MAKEFLAGS for the commands, so that the
# README's `make` runs in parallel as a user's `make -j8` would.
in_root() {
  chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
    ${KILN_FRESH_MAKEFLAGS:+MAKEFLAGS=$KILN_FRESH_MAKEFLAGS} \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin /bin/bash -c "$1"
}
step "apt-get install git (to clone, as a user would)"
in_root "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq git >/dev/null"
git clone -q "$here" "$root/root/kiln"
step "cloned $(git -C "$here" rev-parse --short HEAD) into /root/kiln; set-up took $(( $(date +%s) - t0 )) s"

# The README's block with `make test`: its command lines (a line holding
# only a comment continues the one before it and is not a command).
awk '/^```sh$/ { inblock = 1; n = 0; next }
     /^```/ && inblock { if (has) { for (i = 1; i <= n; i++) print lines[i]; exit }
                         inblock = 0; next }
     inblock { if ($0 ~ /^make test/) has = 1
               if ($0 !~ /^[ \t]*#/ && $0 !~ /^[ \t]*$/) lines[++n] = $0 }' \
  "$root/root/kiln/README.md" >"$root/root/commands.txt"
[ -s "$root/root/commands.txt" ] || { echo "fresh_machine: no README block with make test"; exit 1; }

failed=0
summary=""
while IFS= read -r cmd; do
  step "\$ $cmd"
  s=$(date +%s)
  rc=0
  in_root "cd /root/kiln && $cmd" </dev/null || rc=$?
  secs=$(( $(date +%s) - s ))
  step "exit $rc in $secs s: $cmd"
  summary="$summary
  exit $rc  ${secs} s  $cmd"
  [ "$rc" = 0 ] || failed=1
  [ "$rc" = 0 ] || break
done <"$root/root/commands.txt"
echo "fresh_machine: summary (bare Debian 12, $(nproc) cores, $(date -u +%Y-%m-%d)):$summary"
[ "$failed" = 0 ] && echo "fresh_machine: passed" || echo "fresh_machine: FAILED"
exit "$failed"
