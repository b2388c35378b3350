#!/usr/bin/env bash
# CI test of the Debian package: builds it from binaries already built, then checks it
# without installing anything on this machine.
#
#   deploy/deb/check.sh [--bin-dir DIR] [--keep] [BUILD.SH ARGUMENTS...]
#
#   --bin-dir DIR   `flotilla` and `flotilla-enter` (default: target/release if it has them,
#                   else target/debug, as `cargo test` leaves it)
#   --keep          keep the work folder (the package, the scratch roots) and print its path
#   other arguments go to deploy/deb/build.sh (e.g. --man-dir DIR); the package is compressed
#   with gzip here unless --compress is given (xz takes minutes on a debug build)
#
# What it checks, printing one line per check ("ok: ..." or "FAIL: ..."); it exits non-zero
# if any failed:
#   1. dpkg-deb --info: the fields, the conffiles, the maintainer scripts;
#   2. dpkg-deb --contents: every expected path, with its mode, all owned by root;
#   3. dpkg -x into a scratch folder: `usr/bin/flotilla --version` runs and reports the
#      package's version; flotilla-enter is beside it and runs; every man page is intact
#      gzip and renders with `man -l`; the shell completions are there;
#   4. systemd-analyze verify on the extracted units, their ExecStart= pointed at the
#      extracted binary and MANPATH at the extracted pages (so Documentation=man:... is
#      checked too); the workers stop with SIGTERM to the worker alone (KillMode=mixed); the
#      template against flotilla-worker.service; systemd-analyze security
#      --offline exposure within a bound (no hardening dropped unnoticed);
#   5. dpkg --root=SCRATCH --force-script-chrootless -i, a reinstall (the upgrade path), -r
#      and --purge in an empty dpkg database: the maintainer scripts run on this machine
#      with DPKG_ROOT=SCRATCH (scratch has no shell or adduser to chroot into), create the
#      users in SCRATCH/etc/passwd (systemd-sysusers --root), keep an edited conffile on
#      remove, drop it and the enablement links on purge, and leave this machine alone.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

bin_dir=""
keep=0
build_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --bin-dir) bin_dir="${2:?--bin-dir DIR}"; shift 2 ;;
        --keep) keep=1; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) build_args+=("$1"); shift ;;
    esac
done
if [ -z "$bin_dir" ]; then
    if [ -x "$root/target/release/flotilla" ] && [ -x "$root/target/release/flotilla-enter" ]; then
        bin_dir="$root/target/release"
    else
        bin_dir="$root/target/debug"
    fi
fi
case " ${build_args[*]-} " in
    *" --compress "*) ;;
    *) build_args+=(--compress gzip) ;;
esac

failures=0
ok() { echo "ok: $*"; }
fail() {
    echo "FAIL: $*"
    failures=$((failures + 1))
}
need() {
    command -v "$1" >/dev/null 2>&1 || {
        echo "FAIL: $1 is needed ($2)"
        exit 1
    }
}
need dpkg-deb "apt-get install dpkg"
need dpkg "apt-get install dpkg"
need gzip "apt-get install gzip"
need systemd-analyze "apt-get install systemd: it verifies the units"
need man "apt-get install man-db: it renders the pages"

work="$(mktemp -d "${TMPDIR:-/tmp}/flotilla-deb-check.XXXXXX")"
if [ "$keep" = 1 ]; then
    trap 'echo "kept: $work"' EXIT
else
    trap 'rm -rf "$work"' EXIT
fi

# Users on this machine before: the maintainer scripts must not create any here.
host_users_before="$(getent passwd flotilla flotilla-worker || true)"

# --- Build.
echo "== build from $bin_dir"
if ! deb="$("$here/build.sh" --bin-dir "$bin_dir" --out "$work/out" "${build_args[@]}" | tail -n 1)"; then
    fail "deploy/deb/build.sh failed (above)"
    exit 1
fi
[ -f "$deb" ] || { fail "build.sh printed '$deb', not a package"; exit 1; }
ok "built $(basename "$deb") ($(du -h "$deb" | cut -f1))"
version="$(dpkg-deb --field "$deb" Version)"
upstream="${version%-*}"
arch="$(dpkg-deb --field "$deb" Architecture)"
case "$(basename "$deb")" in
    "flotilla_${version}_${arch}.deb") ok "file name flotilla_${version}_${arch}.deb" ;;
    *) fail "file name $(basename "$deb") is not flotilla_${version}_${arch}.deb" ;;
esac

# --- 1. dpkg-deb --info.
echo "== dpkg-deb --info"
info="$(dpkg-deb --info "$deb")"
field() { dpkg-deb --field "$deb" "$1"; }
[ "$(field Package)" = flotilla ] && ok "Package: flotilla" || fail "Package: $(field Package)"
[ -n "$(field Maintainer)" ] && ok "Maintainer: $(field Maintainer)" || fail "no Maintainer"
[ -n "$(field Installed-Size)" ] && ok "Installed-Size: $(field Installed-Size) KiB" || fail "no Installed-Size"
depends="$(field Depends)"
for d in 'libc6 (>= ' adduser; do
    case "$depends" in
        *"$d"*) ok "Depends has $d" ;;
        *) fail "Depends ($depends) lacks $d" ;;
    esac
done
recommends="$(field Recommends)"
for d in bubblewrap ocl-icd-libopencl1; do
    case ", $recommends," in
        *", $d,"*) ok "Recommends has $d" ;;
        *) fail "Recommends ($recommends) lacks $d" ;;
    esac
done
for s in postinst prerm postrm conffiles md5sums; do
    if printf '%s\n' "$info" | grep -Eq "^ +[0-9]+ bytes, +[0-9]+ lines +(\* +)?$s( |$)"; then
        ok "control member $s"
    else
        fail "no control member $s"
    fi
done
mkdir -p "$work/control"
dpkg-deb --control "$deb" "$work/control"
for s in postinst prerm postrm; do
    if [ -x "$work/control/$s" ] && sh -n "$work/control/$s"; then
        ok "$s is executable and parses (sh -n)"
    else
        fail "$s is not an executable, parseable shell script"
    fi
done
expected_conffiles="$(printf '/etc/default/flotilla-server\n/etc/default/flotilla-worker\n')"
[ "$(cat "$work/control/conffiles")" = "$expected_conffiles" ] &&
    ok "conffiles: /etc/default/flotilla-server, /etc/default/flotilla-worker" ||
    fail "conffiles: $(tr '\n' ' ' <"$work/control/conffiles")"

# --- 2. dpkg-deb --contents.
echo "== dpkg-deb --contents"
contents="$(dpkg-deb --contents "$deb")"
# mode path
expected="
-rwxr-xr-x ./usr/bin/flotilla
-rwxr-xr-x ./usr/bin/flotilla-enter
-rw-r--r-- ./usr/lib/systemd/system/flotilla-server.service
-rw-r--r-- ./usr/lib/systemd/system/flotilla-worker.service
-rw-r--r-- ./usr/lib/systemd/system/flotilla-worker@.service
-rw-r--r-- ./usr/lib/sysusers.d/flotilla.conf
-rw-r--r-- ./etc/default/flotilla-server
-rw-r--r-- ./etc/default/flotilla-worker
drwxr-xr-x ./etc/flotilla/
-rw-r--r-- ./usr/share/man/man1/flotilla.1.gz
-rw-r--r-- ./usr/share/man/man1/flotilla-server.1.gz
-rw-r--r-- ./usr/share/man/man1/flotilla-worker.1.gz
-rw-r--r-- ./usr/share/doc/flotilla/copyright
-rw-r--r-- ./usr/share/doc/flotilla/README.md.gz
-rw-r--r-- ./usr/share/doc/flotilla/systemd.md.gz
-rw-r--r-- ./usr/share/doc/flotilla/changelog.Debian.gz
-rw-r--r-- ./usr/share/doc/flotilla/examples/flotilla-worker-root.conf
-rw-r--r-- ./usr/share/bash-completion/completions/flotilla
-rw-r--r-- ./usr/share/zsh/vendor-completions/_flotilla
-rw-r--r-- ./usr/share/fish/vendor_completions.d/flotilla.fish
"
while read -r mode path; do
    [ -n "$path" ] || continue
    if printf '%s\n' "$contents" | awk -v m="$mode" -v p="$path" '$1 == m && $6 == p { found = 1 } END { exit !found }'; then
        ok "contains $mode $path"
    else
        fail "lacks $mode $path (got: $(printf '%s\n' "$contents" | awk -v p="$path" '$6 == p { print $1 }'))"
    fi
done <<<"$expected"
not_root="$(printf '%s\n' "$contents" | awk '$2 != "root/root"')"
[ -z "$not_root" ] && ok "every entry is owned by root/root" || fail "entries not owned by root/root: $not_root"
outside="$(printf '%s\n' "$contents" | awk '{ print $6 }' | grep -Ev '^\./$|^\./(usr|etc)/' || true)"
[ -z "$outside" ] && ok "nothing outside /usr and /etc" || fail "entries outside /usr and /etc: $outside"
pages="$(printf '%s\n' "$contents" | awk '{ print $6 }' | grep -c '^\./usr/share/man/man1/.*\.1\.gz$' || true)"
ok "$pages man pages"

# --- 3. dpkg -x.
echo "== dpkg -x into a scratch folder"
x="$work/x"
dpkg -x "$deb" "$x"
if out="$("$x/usr/bin/flotilla" --version 2>&1)"; then
    case " $out " in
        *" $upstream "*) ok "usr/bin/flotilla --version: $out" ;;
        *) fail "usr/bin/flotilla --version says '$out', not $upstream" ;;
    esac
else
    fail "usr/bin/flotilla --version failed: $out"
fi
if [ "$(dirname "$x/usr/bin/flotilla-enter")" = "$(dirname "$x/usr/bin/flotilla")" ] && [ -x "$x/usr/bin/flotilla-enter" ]; then
    # Without arguments it says what it needs, on stderr, naming itself, and fails (126).
    out="$("$x/usr/bin/flotilla-enter" 2>&1 >/dev/null || true)"
    case "$out" in
        flotilla-enter:*) ok "usr/bin/flotilla-enter is beside flotilla (where the worker looks) and runs ($out)" ;;
        *) fail "usr/bin/flotilla-enter does not run: $out" ;;
    esac
else
    fail "usr/bin/flotilla-enter is not beside usr/bin/flotilla"
fi
for page in "$x"/usr/share/man/man1/*.1.gz; do
    name="$(basename "$page" .1.gz)"
    if ! gzip -t "$page" 2>/dev/null; then
        fail "man page $name: not intact gzip"
        continue
    fi
    rendered="$(MANWIDTH=80 man -l "$page" 2>&1 || true)"
    if grep -q '^NAME' <<<"$rendered" && grep -q "$name" <<<"$rendered"; then
        ok "man page $name: gzip intact, renders with man -l (NAME section names it)"
    else
        fail "man page $name does not render a NAME section naming it: $(printf '%s\n' "$rendered" | head -n 3)"
    fi
done
bash -n "$x/usr/share/bash-completion/completions/flotilla" &&
    ok "bash completion parses (bash -n)" || fail "bash completion does not parse"
grep -q 'flotilla' "$x/usr/share/zsh/vendor-completions/_flotilla" &&
    grep -q 'flotilla' "$x/usr/share/fish/vendor_completions.d/flotilla.fish" &&
    ok "zsh and fish completions name flotilla" || fail "zsh or fish completion is empty"
for f in copyright; do
    grep -q '^License: MIT or Apache-2.0' "$x/usr/share/doc/flotilla/$f" &&
        ok "copyright: MIT or Apache-2.0 (the workspace's licence)" || fail "copyright lacks the licence"
done
for f in README.md.gz systemd.md.gz changelog.Debian.gz; do
    gzip -t "$x/usr/share/doc/flotilla/$f" 2>/dev/null && ok "doc $f: gzip intact" || fail "doc $f: not intact gzip"
done

# --- 4. The units.
echo "== systemd-analyze"
units="$x/usr/lib/systemd/system"
for u in flotilla-server.service flotilla-worker.service flotilla-worker@.service; do
    if grep -q '^ExecStart=/usr/bin/flotilla ' "$units/$u"; then
        ok "$u: ExecStart=/usr/bin/flotilla (a path the package holds)"
    else
        fail "$u: ExecStart does not run /usr/bin/flotilla"
    fi
done
# Stopping a worker is a drain: SIGTERM (which `flotilla worker` drains on) to the worker
# alone (KillMode=mixed: it signals its tasks itself, each in its sandbox, and gives them
# --grace), within a stop timeout above the default --grace 30s + 15 s.
for u in flotilla-worker.service flotilla-worker@.service; do
    stop="$(grep -E '^(KillSignal|KillMode|TimeoutStopSec)=' "$units/$u" | sort | tr '\n' ' ')"
    if [ "$stop" = "KillMode=mixed KillSignal=SIGTERM TimeoutStopSec=120 " ]; then
        ok "$u: stops with SIGTERM to the worker alone (KillMode=mixed), TimeoutStopSec=120"
    else
        fail "$u: stop settings are '$stop', not KillMode=mixed KillSignal=SIGTERM TimeoutStopSec=120"
    fi
done
v="$work/verify"
mkdir -p "$v"
for u in flotilla-server.service flotilla-worker.service flotilla-worker@.service; do
    sed "s|^ExecStart=/usr/bin/flotilla |ExecStart=$x/usr/bin/flotilla |" "$units/$u" >"$v/$u"
done
ln -s flotilla-worker@.service "$v/flotilla-worker@check.service"
for u in flotilla-server.service flotilla-worker.service flotilla-worker@check.service; do
    if out="$(cd "$v" && MANPATH="$x/usr/share/man" systemd-analyze verify "./$u" 2>&1)" && [ -z "$out" ]; then
        ok "systemd-analyze verify $u: clean (binary and man pages resolved)"
    else
        fail "systemd-analyze verify $u: $out"
    fi
done
# The root drop-in shipped as an example applies to the worker and verifies.
mkdir -p "$work/verify-root/flotilla-worker.service.d"
cp "$v/flotilla-worker.service" "$work/verify-root/"
cp "$x/usr/share/doc/flotilla/examples/flotilla-worker-root.conf" "$work/verify-root/flotilla-worker.service.d/root.conf"
# (The security report is read whole before it is searched: `grep -q` leaving early would
# end systemd-analyze with SIGPIPE, which pipefail makes a failure now and then.)
if out="$(MANPATH="$x/usr/share/man" SYSTEMD_UNIT_PATH="$work/verify-root:" systemd-analyze verify flotilla-worker.service 2>&1)" &&
    [ -z "$out" ] &&
    security="$(SYSTEMD_UNIT_PATH="$work/verify-root:" systemd-analyze security --offline=yes flotilla-worker.service 2>&1)" &&
    grep -q 'User=/DynamicUser=.*runs as root' <<<"$security"; then
    ok "flotilla-worker.service with examples/flotilla-worker-root.conf: verifies, runs as root"
else
    fail "flotilla-worker.service with the root drop-in: $out"
fi
# The template is flotilla-worker.service but for its instance lines.
strip_instance() {
    sed -n '/^\[Unit\]/,$p' "$1" | grep -v -e '^Description=' -e '^ExecStart=' -e '^StateDirectory=' \
        -e '^EnvironmentFile=-/etc/default/flotilla-worker-%i$' -e '^#   /run/credentials/flotilla-worker'
}
if diff <(strip_instance "$units/flotilla-worker.service") <(strip_instance "$units/flotilla-worker@.service") >"$work/template.diff"; then
    ok "flotilla-worker@.service matches flotilla-worker.service but for its instance lines"
else
    fail "flotilla-worker@.service and flotilla-worker.service differ: $(cat "$work/template.diff")"
fi
# Exposure bounds (0 to 10, as systemd-analyze prints it; --threshold takes tenths): the
# values measured when the units were written, plus a little.
for pair in flotilla-server.service:15 flotilla-worker.service:75 flotilla-worker@check.service:75; do
    u="${pair%%:*}"
    bound="${pair##*:}"
    out="$(cd "$v" && systemd-analyze security --offline=yes --threshold="$bound" "./$u" 2>&1)" && rc=0 || rc=$?
    level="$(printf '%s\n' "$out" | sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')"
    if printf '%s\n' "$out" | grep -Eq 'Failed to parse|Unknown key|Unknown section|[Ii]gnoring'; then
        fail "systemd-analyze security $u reports a setting it ignores: $(printf '%s\n' "$out" | grep -E 'Failed to parse|Unknown key|Unknown section|[Ii]gnoring' | head -n 3)"
    elif [ "$rc" = 0 ] && [ -n "$level" ]; then
        ok "systemd-analyze security $u: exposure $level (bound $((bound / 10)).$((bound % 10)))"
    else
        fail "systemd-analyze security $u: exposure ${level:-?} over $((bound / 10)).$((bound % 10)), or it failed: $(printf '%s\n' "$out" | tail -n 2)"
    fi
done

# --- 5. dpkg --root.
echo "== dpkg --root (maintainer scripts chrootless, DPKG_ROOT set)"
r="$work/root"
mkdir -p "$r/var/lib/dpkg/info" "$r/var/lib/dpkg/updates" "$r/var/lib/dpkg/triggers" \
    "$r/var/lib/dpkg/alternatives" "$r/var/log" "$r/etc"
: >"$r/var/lib/dpkg/status"
: >"$r/var/lib/dpkg/available"
# The scratch root has no libc6 or adduser (--force-depends), nor a shell to chroot into: the
# scripts run here with DPKG_ROOT=$r (--force-script-chrootless), and honour it. Not root:
# --force-not-root (dpkg then leaves file ownership alone).
dpkg_r() {
    local force="script-chrootless,depends"
    [ "$(id -u)" = 0 ] || force="$force,not-root"
    dpkg --root="$r" --log="$r/var/log/dpkg.log" --force-"$force" "$@"
}
query() { dpkg-query --admindir="$r/var/lib/dpkg" "$@"; }
if dpkg_r -i "$deb" >"$work/dpkg-i.log" 2>&1; then
    ok "dpkg --root -i"
else
    fail "dpkg --root -i: $(tail -n 5 "$work/dpkg-i.log")"
fi
[ "$(query -W -f='${Status}' flotilla 2>/dev/null)" = "install ok installed" ] &&
    ok "status: install ok installed" || fail "status: $(query -W -f='${Status}' flotilla 2>&1)"
registered="$(query -W -f='${Conffiles}\n' flotilla | awk 'NF { print $1 }')"
[ "$registered" = "$expected_conffiles" ] && ok "conffiles registered in the dpkg database" ||
    fail "conffiles registered: $registered"
if out="$("$r/usr/bin/flotilla" --version 2>&1)"; then
    ok "installed usr/bin/flotilla --version: $out"
else
    fail "installed usr/bin/flotilla --version failed: $out"
fi
if command -v systemd-sysusers >/dev/null 2>&1; then
    for u in flotilla flotilla-worker; do
        if grep -q "^$u:x:[0-9]*:[0-9]*:[^:]*:/var/lib/flotilla/[a-z]*:/usr/sbin/nologin$" "$r/etc/passwd" 2>/dev/null &&
            grep -q "^$u:" "$r/etc/group"; then
            ok "postinst created the system user and group $u in the scratch root"
        else
            fail "postinst did not create $u in the scratch root: $(cat "$r/etc/passwd" 2>&1)"
        fi
    done
else
    echo "note: systemd-sysusers is not installed: users in the scratch root not checked"
fi
# Again, over itself: the upgrade path (prerm upgrade, postinst configure OLD-VERSION).
if dpkg_r -i "$deb" >"$work/dpkg-i2.log" 2>&1; then
    ok "dpkg --root -i again (upgrade path)"
else
    fail "dpkg --root -i again: $(tail -n 5 "$work/dpkg-i2.log")"
fi
# An admin's change to a conffile survives removal; purge drops it and the enablement link.
echo "FLOTILLA_SERVER=coordinator.test:7070" >>"$r/etc/default/flotilla-worker"
mkdir -p "$r/etc/systemd/system/multi-user.target.wants"
ln -s /usr/lib/systemd/system/flotilla-worker.service "$r/etc/systemd/system/multi-user.target.wants/flotilla-worker.service"
if dpkg_r -r flotilla >"$work/dpkg-r.log" 2>&1; then
    ok "dpkg --root -r"
else
    fail "dpkg --root -r: $(tail -n 5 "$work/dpkg-r.log")"
fi
[ "$(query -W -f='${Status}' flotilla 2>/dev/null)" = "deinstall ok config-files" ] &&
    ok "after -r: deinstall ok config-files" || fail "after -r: $(query -W -f='${Status}' flotilla 2>&1)"
[ ! -e "$r/usr/bin/flotilla" ] && ok "after -r: usr/bin/flotilla removed" || fail "after -r: usr/bin/flotilla still there"
grep -q '^FLOTILLA_SERVER=coordinator.test:7070$' "$r/etc/default/flotilla-worker" 2>/dev/null &&
    ok "after -r: the edited conffile is kept" || fail "after -r: the edited conffile is gone"
if dpkg_r --purge flotilla >"$work/dpkg-purge.log" 2>&1; then
    ok "dpkg --root --purge"
else
    fail "dpkg --root --purge: $(tail -n 5 "$work/dpkg-purge.log")"
fi
[ -z "$(query -W -f='${Status}' flotilla 2>/dev/null)" ] && ok "after --purge: unknown to dpkg" ||
    fail "after --purge: $(query -W -f='${Status}' flotilla 2>&1)"
[ ! -e "$r/etc/default/flotilla-worker" ] && [ ! -e "$r/etc/default/flotilla-server" ] &&
    ok "after --purge: conffiles removed" || fail "after --purge: conffiles remain"
[ ! -L "$r/etc/systemd/system/multi-user.target.wants/flotilla-worker.service" ] &&
    ok "after --purge: the enablement link is removed" || fail "after --purge: the enablement link remains"

host_users_after="$(getent passwd flotilla flotilla-worker || true)"
[ "$host_users_after" = "$host_users_before" ] &&
    ok "this machine's users are unchanged (the scripts stayed in DPKG_ROOT)" ||
    fail "this machine's users changed: '$host_users_before' -> '$host_users_after'"

echo
if [ "$failures" -eq 0 ]; then
    echo "deploy/deb/check.sh: all checks passed ($(basename "$deb"))"
else
    echo "deploy/deb/check.sh: $failures check(s) FAILED"
    exit 1
fi
