#!/usr/bin/env bash
# Installs what building courier needs on a Debian machine: a C++ compiler for RocksDB
# and libclang for bindgen. Idempotent and quiet when everything is already there.
#
# Sourcing this file with COURIER_SETUP_LIB=1 only defines the functions (the test of the
# libclang check drives `libclang_in` over fake directories).
set -euo pipefail

# libclang_in DIR: true when DIR holds a library bindgen can load: libclang.so,
# libclang.so.<N>, libclang-<N>.so or libclang-<N>.so.<M>. Never libclang-cpp: that is
# the C++ library (package libclang-cpp<N>), which bindgen rejects, and a machine can have
# it without libclang itself.
libclang_in() {
  local dir="$1" f name ver
  [ -d "$dir" ] || return 1
  # Only the names bindgen loads; `libclang-cpp.so.14` matches the last glob, so the part
  # after `libclang-` must be a version number (digits and dots), never `cpp`.
  for f in "$dir"/libclang.so "$dir"/libclang.so.[0-9]* "$dir"/libclang-*.so "$dir"/libclang-*.so.[0-9]*; do
    [ -e "$f" ] || continue
    name="${f##*/}"
    case "$name" in
      libclang.so | libclang.so.[0-9]*) return 0 ;;
    esac
    ver="${name#libclang-}"
    ver="${ver%%.so*}"
    [[ "$ver" =~ ^[0-9][0-9.]*$ ]] && return 0
  done
  return 1
}

# libclang_dirs: the directories bindgen searches, in its order: LIBCLANG_PATH when set,
# llvm-config's library directory, then the system's.
libclang_dirs() {
  if [ -n "${LIBCLANG_PATH:-}" ]; then echo "$LIBCLANG_PATH"; fi
  if command -v llvm-config >/dev/null 2>&1; then llvm-config --libdir 2>/dev/null || true; fi
  local d
  for d in /usr/lib/llvm-*/lib /usr/local/lib /usr/lib /usr/lib64 /usr/lib/*-linux-gnu; do
    [ -d "$d" ] && echo "$d"
  done
  return 0
}

# have_libclang: true when any directory bindgen searches has a loadable libclang.
have_libclang() {
  local d
  while IFS= read -r d; do
    libclang_in "$d" && return 0
  done < <(libclang_dirs)
  return 1
}

if [ "${COURIER_SETUP_LIB:-}" = 1 ]; then
  return 0 2>/dev/null || exit 0
fi

need=()
command -v c++ >/dev/null 2>&1 || need+=(g++)
command -v make >/dev/null 2>&1 || need+=(make)
if [ -n "${LIBCLANG_PATH:-}" ] && ! libclang_in "$LIBCLANG_PATH"; then
  echo "setup: LIBCLANG_PATH=$LIBCLANG_PATH holds no libclang.so; looking elsewhere" >&2
fi
have_libclang || need+=(libclang-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
  if ! have_libclang; then
    echo "setup: libclang-dev installed but no libclang.so found; set LIBCLANG_PATH" >&2
    exit 1
  fi
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo not found; install Rust (https://rustup.rs) and run this again" >&2
  exit 1
fi
