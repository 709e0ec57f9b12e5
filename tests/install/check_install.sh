#!/usr/bin/env bash
# The installed C packages, as a user builds on them: install this build tree
# to a temporary prefix, then build examples/c/dps_example.c against it four
# ways (pkg-config shared and static, CMake find_package shared and static),
# with no flags beyond what the packages give and no LD_LIBRARY_PATH, and run
# each with 1 rank. With a GPU the example must pass; without one it must
# fail cleanly with the library's "no usable CUDA device" message.
#   check_install.sh BUILD_DIR SOURCE_DIR [C_COMPILER]
set -euo pipefail
build=$1 src=$2 cc=${3:-cc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log"
libdir=$(dirname "$(find "$prefix" -name dpsampling.pc -path '*pkgconfig*' | head -n1)")
export PKG_CONFIG_PATH=$libdir
ex=$src/examples/c/dps_example.c
fail() { echo "check_install: $*" >&2; exit 1; }

"$cc" -std=c11 -Wall -Wextra -Werror "$ex" -o "$tmp/pc_shared" \
  $(pkg-config --cflags --libs dpsampling) || fail "pkg-config dpsampling: link failed"
"$cc" -std=c11 -Wall -Wextra -Werror "$ex" -o "$tmp/pc_static" \
  $(pkg-config --static --cflags --libs dpsampling_static) ||
  fail "pkg-config --static dpsampling_static: link failed"
for kind in shared static; do
  opt=OFF; [[ $kind == static ]] && opt=ON
  # -Werror=dev: a warning from the installed package files fails the check.
  cmake -S "$src/examples/c" -B "$tmp/cmake_$kind" -Werror=dev -DCMAKE_C_COMPILER="$cc" \
    -DCMAKE_PREFIX_PATH="$prefix" -DDPS_EXAMPLE_STATIC=$opt >"$tmp/cmake_$kind.log" 2>&1 ||
    { cat "$tmp/cmake_$kind.log"; fail "find_package(dpsampling) ($kind) failed"; }
  if grep -q -i 'warning' "$tmp/cmake_$kind.log"; then
    cat "$tmp/cmake_$kind.log"; fail "find_package(dpsampling) printed a warning"
  fi
  cmake --build "$tmp/cmake_$kind" >"$tmp/build_$kind.log" 2>&1 ||
    { cat "$tmp/build_$kind.log"; fail "CMake consumer ($kind): build failed"; }
  cp "$tmp/cmake_$kind/dps_example" "$tmp/cmake_${kind}_bin"
done

for b in pc_shared pc_static cmake_shared_bin cmake_static_bin; do
  needed=$(readelf -d "$tmp/$b" | grep NEEDED || true)
  case $b in
    *static*) ! grep -q 'libdpsampling\.so' <<<"$needed" || fail "$b links libdpsampling.so" ;;
    *) grep -q 'libdpsampling\.so' <<<"$needed" || fail "$b does not link libdpsampling.so" ;;
  esac
  rc=0
  env -u LD_LIBRARY_PATH "$tmp/$b" 1 >"$tmp/$b.out" 2>&1 || rc=$?
  if [[ $rc == 0 ]]; then
    echo "check_install: $b: passed on this machine's GPU"
  elif grep -q 'no usable CUDA device' "$tmp/$b.out" && ! grep -q -E '\.c:[0-9]' "$tmp/$b.out"; then
    echo "check_install: $b: ran, no GPU here: $(grep -m1 'no usable' "$tmp/$b.out")"
  else
    cat "$tmp/$b.out"; fail "$b 1: exit status $rc"
  fi
done
echo "check_install: pkg-config (shared, static) and CMake (dpsampling::dpsampling, dpsampling::dpsampling_static) consumers built and ran"
