#!/bin/sh
# tools/packages.sh PACKAGE...: installs the Debian packages among PACKAGE
# that are missing (the Makefile's `deps` and `test-deps` call it).
#
# As root it runs apt-get update and apt-get install, printing a line per
# phase (the packages asked for, how many apt-get brings, download progress
# every 25 packages, unpacking, setting up) instead of apt's full output,
# which goes to a log printed whole if apt-get fails. Not as root, it prints
# the exact `sudo apt-get install` line and exits 1. Exits 0 when nothing is
# missing, printing nothing.
set -u
if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "kiln: not a Debian system; install the equivalents of: $*"
  exit 1
fi
missing=""
for p in "$@"; do
  dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed' ||
    missing="$missing $p"
done
[ -n "$missing" ] || exit 0
if [ "$(id -u)" != 0 ]; then
  echo "kiln: missing packages; run:"
  echo "  sudo apt-get update && sudo apt-get install -y$missing"
  exit 1
fi
log=$(mktemp /tmp/kiln-apt.XXXXXX)
status=$(mktemp /tmp/kiln-apt-status.XXXXXX)
trap 'rm -f "$log" "$status"' EXIT
start=$(date +%s)
echo "kiln: installing$missing"
echo "kiln:   apt-get update"
if ! apt-get update -q >"$log" 2>&1; then
  cat "$log"
  echo "kiln: apt-get update failed"
  exit 1
fi
# apt-get install's output, a line per phase; its status through a file
# (sh has no pipefail).
{ DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing 2>&1; echo $? >"$status"; } |
  tee -a "$log" | awk '
    / newly installed/ { total = $3; print "kiln:   " $0; fflush() }
    /^Get:/ { got++; if (got == 1 || got % 25 == 0)
                printf "kiln:   downloading %d of %d packages\n", got, total; fflush() }
    /^Unpacking / { if (!unpacking++) { print "kiln:   unpacking"; fflush() } }
    /^Setting up / { if (!setup++) { print "kiln:   setting up"; fflush() } }'
if [ "$(cat "$status")" != 0 ]; then
  tail -40 "$log"
  echo "kiln: apt-get install$missing failed"
  exit 1
fi
echo "kiln:   done in $(( $(date +%s) - start )) s"
