#!/usr/bin/env bash
# Builds the Debian package flotilla_<version>-<revision>_<arch>.deb from binaries already
# built (no cargo here): a plain dpkg-deb script, so CI needs only dpkg (and gzip, binutils).
#
#   deploy/deb/build.sh [--bin-dir DIR] [--out DIR] [--version V] [--revision N] [--arch A]
#                       [--no-strip] [--compress xz|zstd|gzip|none] [--man-dir DIR]
#
#   --bin-dir DIR   the folder holding `flotilla` and `flotilla-enter` (FLOTILLA_BIN_DIR;
#                   default: target/release)
#   --out DIR       where the .deb goes (FLOTILLA_DEB_OUT; default: target/deb)
#   --version V     the upstream version (default: crates/flotilla/Cargo.toml, through the
#                   workspace's version); `flotilla --version` must report it
#   --revision N    the Debian revision (default 1)
#   --arch A        the Debian architecture (default: from the binary's ELF header)
#   --no-strip      keep the binaries' debug information (default: strip --strip-debug on
#                   the packaged copies: function names stay for backtraces; STRIP= names
#                   another strip, e.g. aarch64-linux-gnu-strip)
#   --compress C    dpkg-deb's compressor (default xz, which every dpkg reads)
#   --man-dir DIR   take the man pages from DIR (*.1, written beforehand by `flotilla man
#                   --out DIR`) instead of running `flotilla man`. The binary still runs
#                   here (--version, completions): a cross-built one needs qemu-user.
#
# Environment: DEB_MAINTAINER ("Name <address>"), SOURCE_DATE_EPOCH (timestamps; default:
# the last commit's date, for a reproducible package).
#
# The package holds /usr/bin/flotilla and, beside it where the worker looks for it,
# /usr/bin/flotilla-enter; the systemd units; the man pages (`flotilla man --out DIR`);
# shell completions; /etc/default/flotilla-{server,worker} (conffiles); the sysusers.d file;
# copyright, README, docs/systemd.md. The last line of stdout is the package's path.
set -euo pipefail

die() {
    echo "deploy/deb/build.sh: $*" >&2
    exit 1
}

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

bin_dir="${FLOTILLA_BIN_DIR:-$root/target/release}"
out_dir="${FLOTILLA_DEB_OUT:-$root/target/deb}"
version=""
revision="1"
arch=""
strip_bins=1
compress="xz"
man_from=""
while [ $# -gt 0 ]; do
    case "$1" in
        --bin-dir) bin_dir="${2:?--bin-dir DIR}"; shift 2 ;;
        --out) out_dir="${2:?--out DIR}"; shift 2 ;;
        --version) version="${2:?--version V}"; shift 2 ;;
        --revision) revision="${2:?--revision N}"; shift 2 ;;
        --arch) arch="${2:?--arch A}"; shift 2 ;;
        --no-strip) strip_bins=0; shift ;;
        --compress) compress="${2:?--compress xz|zstd|gzip|none}"; shift 2 ;;
        --man-dir) man_from="${2:?--man-dir DIR}"; shift 2 ;;
        -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument $1 (--help)" ;;
    esac
done

for tool in dpkg-deb gzip install; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool is needed (Debian: apt-get install dpkg gzip coreutils)"
done

bin="$bin_dir/flotilla"
enter="$bin_dir/flotilla-enter"
[ -f "$bin" ] && [ -x "$bin" ] || die "$bin: no such executable (build it, or give --bin-dir)"
[ -f "$enter" ] && [ -x "$enter" ] || die "$enter: no such executable: the worker's sandbox holder needs it beside flotilla"

# --- The version: the workspace's (crates/flotilla/Cargo.toml says version.workspace = true).
toml_value() { # FILE SECTION KEY: the string value of KEY in [SECTION]
    awk -v section="[$2]" -v key="$3" '
        /^\[/ { in_section = ($0 == section) }
        in_section && $0 ~ "^" key "[ \t]*=" {
            sub(/^[^=]*=[ \t]*"/, ""); sub(/".*$/, ""); print; exit
        }' "$1"
}
if [ -z "$version" ]; then
    if grep -Eq '^version\.workspace[ \t]*=[ \t]*true' "$root/crates/flotilla/Cargo.toml"; then
        version="$(toml_value "$root/Cargo.toml" workspace.package version)"
    else
        version="$(toml_value "$root/crates/flotilla/Cargo.toml" package version)"
    fi
    [ -n "$version" ] || die "cannot read the version from crates/flotilla/Cargo.toml or the workspace's Cargo.toml"
fi
printf '%s' "$version" | grep -Eq '^[0-9][A-Za-z0-9.+~]*$' || die "version $version: not a Debian upstream version"
case "$revision" in '' | *[!0-9A-Za-z.+~]*) die "revision $revision: not a Debian revision" ;; esac
deb_version="$version-$revision"

# The binary must be the one this tree describes: `flotilla --version` names the version.
bin_version="$("$bin" --version 2>&1 | head -n 1)" || die "$bin --version failed: $bin_version"
case " $bin_version " in
    *" $version "* | *" $version("* | *" v$version "*) ;;
    *) die "$bin --version says '$bin_version', not $version: a binary from another version?" ;;
esac

# --- The architecture, from the ELF header (cross-built binaries get theirs).
elf_arch() {
    local magic class data machine
    magic="$(od -An -tx1 -N4 "$1" | tr -d ' \n')"
    [ "$magic" = 7f454c46 ] || return 1
    class="$(od -An -tu1 -j4 -N1 "$1" | tr -d ' \n')"   # 1: 32-bit, 2: 64-bit
    data="$(od -An -tu1 -j5 -N1 "$1" | tr -d ' \n')"    # 1: little-endian
    [ "$data" = 1 ] || return 1
    machine="$(od -An -tu2 -j18 -N2 --endian=little "$1" | tr -d ' \n')"
    case "$class:$machine" in
        2:62) echo amd64 ;;
        2:183) echo arm64 ;;
        2:243) echo riscv64 ;;
        2:21) echo ppc64el ;;
        2:258) echo loong64 ;;
        1:3) echo i386 ;;
        1:40) echo armhf ;;
        *) return 1 ;;
    esac
}
if [ -z "$arch" ]; then
    arch="$(elf_arch "$bin")" || die "$bin: cannot tell its Debian architecture from its ELF header; give --arch"
fi
enter_arch="$(elf_arch "$enter")" || die "$enter: not an ELF executable of a known architecture"
[ "$enter_arch" = "$arch" ] || die "flotilla is $arch but flotilla-enter is $enter_arch"

# --- The licence: the copyright file below covers "MIT OR Apache-2.0" only.
license="$(toml_value "$root/Cargo.toml" workspace.package license)"
[ "$license" = "MIT OR Apache-2.0" ] || die "the workspace's licence is now '$license': update the copyright file in deploy/deb/build.sh"

maintainer="${DEB_MAINTAINER:-Flotilla maintainers <flotilla@example.invalid>}"
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
    SOURCE_DATE_EPOCH="$(git -C "$root" log -1 --format=%ct 2>/dev/null || date +%s)"
fi
export SOURCE_DATE_EPOCH

# --- The tree.
work="$(mktemp -d "${TMPDIR:-/tmp}/flotilla-deb.XXXXXX")"
trap 'rm -rf "$work"' EXIT
st="$work/root"
umask 022
mkdir -p "$st/DEBIAN" "$st/usr/bin" "$st/usr/lib/systemd/system" "$st/usr/lib/sysusers.d" \
    "$st/etc/default" "$st/etc/flotilla" "$st/usr/share/man/man1" \
    "$st/usr/share/doc/flotilla/examples" "$st/usr/share/bash-completion/completions" \
    "$st/usr/share/zsh/vendor-completions" "$st/usr/share/fish/vendor_completions.d"

install -m 0755 "$bin" "$st/usr/bin/flotilla"
# Beside flotilla: flotilla::enter_program() looks for it there (current_exe's folder).
install -m 0755 "$enter" "$st/usr/bin/flotilla-enter"
if [ "$strip_bins" = 1 ]; then
    strip_tool="${STRIP:-strip}"
    command -v "$strip_tool" >/dev/null 2>&1 || die "$strip_tool is needed to strip (binutils), or give --no-strip"
    for f in "$st/usr/bin/flotilla" "$st/usr/bin/flotilla-enter"; do
        "$strip_tool" --strip-debug "$f" || die "$strip_tool failed on $(basename "$f") (another architecture? set STRIP= or give --no-strip)"
    done
fi

sd="$root/deploy/systemd"
for u in flotilla-server.service flotilla-worker.service flotilla-worker@.service; do
    install -m 0644 "$sd/$u" "$st/usr/lib/systemd/system/$u"
done
install -m 0644 "$sd/flotilla.sysusers" "$st/usr/lib/sysusers.d/flotilla.conf"
install -m 0644 "$sd/flotilla-server.default" "$st/etc/default/flotilla-server"
install -m 0644 "$sd/flotilla-worker.default" "$st/etc/default/flotilla-worker"
install -m 0644 "$sd/flotilla-worker-root.conf" "$st/usr/share/doc/flotilla/examples/flotilla-worker-root.conf"

# --- Man pages, written by the program itself (clap_mangen). No page is better than a stale
# one, so a binary that cannot write them stops the build.
man_dir="$st/usr/share/man/man1"
if [ -n "$man_from" ]; then
    [ -d "$man_from" ] || die "--man-dir $man_from: no such folder"
    for f in "$man_from"/*.1; do
        [ -f "$f" ] || die "--man-dir $man_from holds no *.1 page"
        install -m 0644 "$f" "$man_dir/"
    done
elif ! man_out="$("$bin" man --out "$man_dir" 2>&1)"; then
    die "'$bin man --out DIR' failed, so the package would have no man pages.
This binary lacks the hidden \`flotilla man --out DIR\` subcommand (clap_mangen), or it
failed. Build flotilla from a tree that has it. Its output:
$(printf '%s\n' "$man_out" | tail -n 5 | sed 's/^/    /')"
fi
pages=0
for f in "$man_dir"/*; do
    [ -e "$f" ] || continue
    case "$f" in
        *.1) ;;
        *) die "flotilla man wrote $(basename "$f"), not a section-1 page (*.1)" ;;
    esac
    [ -s "$f" ] || die "flotilla man wrote an empty $(basename "$f")"
    chmod 0644 "$f"
    gzip -9n "$f"
    pages=$((pages + 1))
done
# The units' Documentation= names these.
for p in flotilla flotilla-server flotilla-worker; do
    [ -f "$man_dir/$p.1.gz" ] || die "flotilla man wrote no $p.1 (the systemd units' Documentation= names it)"
done

# --- Shell completions (`flotilla completions SHELL`).
"$bin" completions bash >"$st/usr/share/bash-completion/completions/flotilla" || die "flotilla completions bash failed"
"$bin" completions zsh >"$st/usr/share/zsh/vendor-completions/_flotilla" || die "flotilla completions zsh failed"
"$bin" completions fish >"$st/usr/share/fish/vendor_completions.d/flotilla.fish" || die "flotilla completions fish failed"
for f in "$st/usr/share/bash-completion/completions/flotilla" "$st/usr/share/zsh/vendor-completions/_flotilla" \
    "$st/usr/share/fish/vendor_completions.d/flotilla.fish"; do
    [ -s "$f" ] || die "$(basename "$f"): empty completion script"
    chmod 0644 "$f"
done

# --- Documentation.
doc="$st/usr/share/doc/flotilla"
gzip -9n <"$root/README.md" >"$doc/README.md.gz"
gzip -9n <"$root/docs/systemd.md" >"$doc/systemd.md.gz"
gzip -9n <"$root/docs/cluster.md" >"$doc/cluster.md.gz"
repository="$(toml_value "$root/Cargo.toml" workspace.package repository)"
cat >"$doc/copyright" <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: flotilla
Source: ${repository:-unknown}
Comment: The binaries are statically linked Rust programs: they include the Rust crates of
 the workspace's Cargo.lock, each under its own licence (mostly MIT or Apache-2.0; the full
 list is in the crates' Cargo.toml files and is not reproduced here).

Files: *
Copyright: The Flotilla authors
License: MIT or Apache-2.0

License: MIT
 Permission is hereby granted, free of charge, to any person obtaining a copy of this
 software and associated documentation files (the "Software"), to deal in the Software
 without restriction, including without limitation the rights to use, copy, modify, merge,
 publish, distribute, sublicense, and/or sell copies of the Software, and to permit persons
 to whom the Software is furnished to do so, subject to the following conditions:
 .
 The above copyright notice and this permission notice shall be included in all copies or
 substantial portions of the Software.
 .
 THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED,
 INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR
 PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE
 FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR
 OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER
 DEALINGS IN THE SOFTWARE.

License: Apache-2.0
 Licensed under the Apache License, Version 2.0 (the "License"); you may not use this file
 except in compliance with the License. You may obtain a copy of the License at
 https://www.apache.org/licenses/LICENSE-2.0
 .
 On Debian systems, the complete text of the Apache License, Version 2.0 can be found in
 /usr/share/common-licenses/Apache-2.0.
EOF
{
    printf 'flotilla (%s) unstable; urgency=medium\n\n' "$deb_version"
    printf '  * Built from the flotilla workspace by deploy/deb/build.sh.\n\n'
    printf ' -- %s  %s\n' "$maintainer" "$(LC_ALL=C date -u -R -d "@$SOURCE_DATE_EPOCH")"
} | gzip -9n >"$doc/changelog.Debian.gz"

# --- Dependencies of the binaries' shared libraries: dpkg-shlibdeps where it works (a Debian
# build machine with dpkg-dev), else libc6 at the newest GLIBC symbol version they use.
shlib_depends=""
if command -v dpkg-shlibdeps >/dev/null 2>&1; then
    mkdir -p "$work/src/debian"
    printf 'Source: flotilla\n\nPackage: flotilla\nArchitecture: any\n' >"$work/src/debian/control"
    if out="$(cd "$work/src" && dpkg-shlibdeps -O -e"$st/usr/bin/flotilla" -e"$st/usr/bin/flotilla-enter" 2>"$work/shlibdeps.err")"; then
        shlib_depends="$(printf '%s\n' "$out" | sed -n 's/^shlibs:Depends=//p')"
    else
        echo "deploy/deb/build.sh: dpkg-shlibdeps failed ($(head -n 1 "$work/shlibdeps.err")); falling back to the GLIBC symbol versions" >&2
    fi
fi
if [ -z "$shlib_depends" ]; then
    command -v readelf >/dev/null 2>&1 || die "readelf (binutils) or dpkg-shlibdeps (dpkg-dev) is needed for the dependencies"
    glibc="$(readelf -W --dyn-syms "$st/usr/bin/flotilla" "$st/usr/bin/flotilla-enter" |
        grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -t. -k1,1n -k2,2n -k3,3n | tail -n 1)"
    shlib_depends="libc6${glibc:+ (>= $glibc)}"
    needed="$(readelf -d "$st/usr/bin/flotilla" "$st/usr/bin/flotilla-enter" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort -u)"
    for lib in $needed; do
        case "$lib" in
            libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | ld-linux*) ;;
            libgcc_s.so.1) shlib_depends="$shlib_depends, libgcc-s1" ;;
            *) die "the binaries need $lib, which this fallback cannot map to a package: run on a machine with dpkg-dev (dpkg-shlibdeps)" ;;
        esac
    done
fi

installed_size="$(du -sk --apparent-size "$st" | cut -f1)"
# Depends: the shared libraries, and adduser for the postinst's system users.
# Recommends: bubblewrap (the workers' task sandbox; the default worker configuration,
# --isolation required, refuses to start without it, and coordinators and clients never
# need it, so it is not a hard dependency), ocl-icd-libopencl1 (OpenCL is loaded at run
# time, when present).
cat >"$st/DEBIAN/control" <<EOF
Package: flotilla
Version: $deb_version
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $installed_size
Depends: $shlib_depends, adduser
Recommends: bubblewrap, ocl-icd-libopencl1
Suggests: pocl-opencl-icd
Section: admin
Priority: optional
Description: distributed task runtime for heterogeneous machines
 Flotilla turns one machine, a rack, or a pool of shared machines into one
 parallel, heterogeneous computer: jobs are graphs of tasks placed on CPU cores,
 OpenCL devices and CUDA GPUs by learned performance models.
 .
 This package holds the flotilla program (coordinator, worker and client), the
 flotilla-enter helper of the workers' task sandbox, and systemd units for a
 coordinator (flotilla-server.service) and workers (flotilla-worker.service,
 flotilla-worker@.service). The units are not enabled on installation:
 /usr/share/doc/flotilla/systemd.md.gz says how to configure and start them.
EOF
printf '/etc/default/flotilla-server\n/etc/default/flotilla-worker\n' >"$st/DEBIAN/conffiles"

for s in postinst prerm postrm; do
    install -m 0755 "$here/$s" "$st/DEBIAN/$s"
done

# md5sums of everything but the conffiles (dpkg keeps theirs itself).
(cd "$st" && find . -path ./DEBIAN -prune -o -path ./etc -prune -o -type f -print | sed 's|^\./||' |
    LC_ALL=C sort | xargs -r md5sum) >"$st/DEBIAN/md5sums"
chmod 0644 "$st/DEBIAN/control" "$st/DEBIAN/conffiles" "$st/DEBIAN/md5sums"
find "$st" -type d -exec chmod 0755 {} +

mkdir -p "$out_dir"
deb="$out_dir/flotilla_${deb_version}_${arch}.deb"
case "$compress" in
    xz | zstd | gzip | none) ;;
    *) die "--compress $compress: one of xz, zstd, gzip, none" ;;
esac
dpkg-deb --root-owner-group -Z"$compress" --build "$st" "$deb" >&2
echo "deploy/deb/build.sh: $pages man pages, Depends: $shlib_depends, adduser" >&2
echo "$deb"
