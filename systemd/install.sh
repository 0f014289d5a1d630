#!/bin/sh
# Installs scdlfs as a service: the binary, the unit scdlfs@.service, the mount helper
# /sbin/mount.scdlfs (for /etc/fstab) and an example /etc/scdlfs/example.conf.
#
#   cargo build --release && sudo systemd/install.sh [BINARY]
#
# BINARY defaults to target/release/scdlfs. BINDIR (default /usr/local/bin) is where
# the binary goes and what the unit and the helper run; DESTDIR stages everything
# under another root (for packaging) without touching the running system.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
binary=${1:-$here/../target/release/scdlfs}
bindir=${BINDIR:-/usr/local/bin}
root=${DESTDIR:-}

if [ ! -x "$binary" ]; then
    echo "install.sh: no scdlfs binary at $binary (run cargo build --release first)" >&2
    exit 1
fi

# The unit and the helper name the binary by its installed path.
point_at_bindir() {
    sed "s|/usr/local/bin/scdlfs|$bindir/scdlfs|g" "$1"
}

install -d "$root$bindir" "$root/etc/systemd/system" "$root/sbin"
install -m 0755 "$binary" "$root$bindir/scdlfs"
point_at_bindir "$here/scdlfs@.service" >"$root/etc/systemd/system/scdlfs@.service"
chmod 0644 "$root/etc/systemd/system/scdlfs@.service"
point_at_bindir "$here/mount.scdlfs" >"$root/sbin/mount.scdlfs"
chmod 0755 "$root/sbin/mount.scdlfs"
# Configurations hold credentials: root only. An existing example is left as edited.
install -d -m 0700 "$root/etc/scdlfs"
if [ ! -e "$root/etc/scdlfs/example.conf" ]; then
    install -m 0600 "$here/example.conf" "$root/etc/scdlfs/example.conf"
fi

if [ -z "$root" ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload
fi
cat <<DONE
Installed $bindir/scdlfs, /etc/systemd/system/scdlfs@.service and /sbin/mount.scdlfs
under ${root:-/}. Next:
  cp /etc/scdlfs/example.conf /etc/scdlfs/NAME.conf   # then edit it
  systemctl enable --now scdlfs@NAME
or add an /etc/fstab line (see docs/service.md).
DONE
