#!/usr/bin/env bash
# Prepares a run on a lent GPU machine (docs/GPU.md, "A run on a lent GPU machine"), here, without a
# GPU: builds the CUDA plugin of the working tree and of a base commit for one architecture, and
# copies what scripts/gpu-run.sh needs into one ignored folder that travels with the run:
#   gpu-stage/new/   libflashattn.so(.0), libflashattn-cuda.so, test_gpu_backends (working tree)
#   gpu-stage/base/  libflashattn.so(.0), libflashattn-cuda.so (base commit)
#   gpu-stage/lib/   shared libraries the binaries need beyond the C library (libcmocka, libgomp)
#   gpu-stage/STAGE.txt  commits, architectures, compiler, file sizes and checksums
# Each plugin folder holds its own core library, so that both plugins load in one process (the core
# finds the plugin beside itself). gpu-run.sh sets LD_LIBRARY_PATH; nothing is installed.
#
# Usage: scripts/gpu-stage.sh [--no-base] [BASE_COMMIT]
#   BASE_COMMIT  default: the merge-base of HEAD and main (HEAD itself on main, which makes the
#                comparison a null one: base and new are the same plugin, the spread is the noise)
#   --no-base    stage the working tree only; gpu-run.sh then times new against PyTorch alone
# Environment:
#   FA_STAGE_ARCHS  CUDA targets, meson's gpu_cuda_archs (default 90: sm_90 SASS and compute_90 PTX)
#   FA_STAGE_DIR    the staging folder (default gpu-stage, ignored by git)
#   FA_STAGE_JOBS   parallel compile jobs (default: meson's choice)
# Builds go to build-gpu-stage/{new,base} (ignored), the base commit's source to a git worktree at
# build-gpu-stage/base-src; both are kept, so a second staging only recompiles what changed (nvcc
# compiles a plugin in one call: 10-20 minutes on a 2-core machine). A base commit whose src/,
# include/ and top-level meson files are the working tree's is not built again: its plugin is the
# new one. `git worktree remove build-gpu-stage/base-src` unregisters the base's worktree.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
stage=${FA_STAGE_DIR:-gpu-stage}
archs=${FA_STAGE_ARCHS:-90}
builds=build-gpu-stage
with_base=1
base_arg=
for arg in "$@"; do
  case $arg in
    --no-base) with_base=0 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gpu-stage: unknown option $arg" >&2; exit 2 ;;
    *) base_arg=$arg ;;
  esac
done
jobs=()
[ -n "${FA_STAGE_JOBS:-}" ] && jobs=(-j "$FA_STAGE_JOBS")

command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] ||
  { echo "gpu-stage: nvcc not found (PATH or /usr/local/cuda/bin)" >&2; exit 1; }

# Options a commit's meson_options.txt knows (an older base may lack some of them).
options_for() { # source dir
  local src=$1 opt out=()
  for opt in "-Dbuildtype=release" -Dcuda=enabled -Dhip=disabled "-Dgpu_cuda_archs=$archs" \
             -Dtests=true -Dbench=false -Dexamples=false -Dpython=disabled -Dmpi=disabled -Dnccl=disabled; do
    local name=${opt#-D}; name=${name%%=*}
    if [ "$name" = buildtype ] || grep -q "option('$name'" "$src/meson_options.txt"; then out+=("$opt"); fi
  done
  printf '%s\n' "${out[@]}"
}

build() { # source dir, build dir, meson targets...
  local src=$1 dir=$2; shift 2
  local opts
  mapfile -t opts < <(options_for "$src")
  if [ -f "$dir/build.ninja" ]; then
    meson setup --reconfigure "$dir" "$src" "${opts[@]}" >"$dir.setup.log" 2>&1 ||
      { cat "$dir.setup.log" >&2; return 1; }
  else
    mkdir -p "$(dirname "$dir")"
    meson setup "$dir" "$src" "${opts[@]}" >"$dir.setup.log" 2>&1 || { cat "$dir.setup.log" >&2; return 1; }
  fi
  local start=$SECONDS
  meson compile -C "$dir" "${jobs[@]}" "$@"
  echo "gpu-stage: built $* in $dir ($((SECONDS - start)) s)"
}

# Copies a build's core library and plugin (and the named test programs) into a stage folder.
collect() { # build dir, stage subfolder, test programs (paths in the build dir)...
  local dir=$1 to=$2; shift 2
  mkdir -p "$to"
  cp -L "$dir/src/libflashattn.so.0" "$to/libflashattn.so.0"
  ln -sf libflashattn.so.0 "$to/libflashattn.so"
  cp "$dir/src/libflashattn-cuda.so" "$to/"
  local exe
  for exe in "$@"; do cp "$dir/$exe" "$to/"; done
}

new_build=$builds/new
core_targets=(src/flashattn:shared_library src/flashattn-cuda:custom)
# What the core library and the plugin are built from: a base without changes there is not rebuilt.
build_inputs=(src include meson.build meson_options.txt)
base_commit=
if [ "$with_base" = 1 ]; then
  if [ -n "$base_arg" ]; then
    base_commit=$(git rev-parse --verify "$base_arg^{commit}")
  else
    base_commit=$(git merge-base HEAD main)
  fi
fi

echo "gpu-stage: working tree $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' (modified)'), sm targets: $archs"
build "$root" "$new_build" "${core_targets[@]}" tests/gpu/test_gpu_backends:executable

base_build=
if [ -n "$base_commit" ]; then
  if git diff --quiet "$base_commit" -- "${build_inputs[@]}"; then
    echo "gpu-stage: base $(git rev-parse --short "$base_commit") has the working tree's sources: its plugin is the new one"
    base_build=$new_build
  else
    base_src=$builds/base-src
    if [ -e "$base_src/.git" ]; then
      git -C "$base_src" checkout -q --detach --force "$base_commit"
    else
      mkdir -p "$builds"
      git worktree add -q --detach "$base_src" "$base_commit"
    fi
    base_build=$builds/base
    echo "gpu-stage: base $(git rev-parse --short "$base_commit") in $base_src"
    build "$root/$base_src" "$base_build" "${core_targets[@]}"
  fi
fi

rm -rf "$stage"
mkdir -p "$stage/lib"
collect "$new_build" "$stage/new" tests/gpu/test_gpu_backends
[ -n "$base_build" ] && collect "$base_build" "$stage/base"

# Shared libraries beyond the C library and the compiler's runtime, which the GPU machine's image
# may lack (it has no cmocka); the C library itself must be no newer there than here.
for f in "$stage"/new/* "$stage"/base/*; do
  [ -L "$f" ] && continue
  ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r name path; do
  case $name in
    libflashattn*|libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) ;;
    *) cp -L "$path" "$stage/lib/$name" ;;
  esac
done

{
  echo "staged: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), glibc $(ldd --version | head -n 1 | awk '{print $NF}')"
  echo "new:    $(git rev-parse HEAD)$(git diff --quiet HEAD || echo ' + uncommitted changes')"
  if [ -z "$base_commit" ]; then echo "base:   none (--no-base)"
  else echo "base:   $base_commit ($(git log -1 --format=%s "$base_commit" | cut -c1-100))"; fi
  echo "archs:  gpu_cuda_archs=$archs"
  echo "nvcc:   $(PATH=$PATH:/usr/local/cuda/bin nvcc --version | grep -m 1 release)"
  echo
  (cd "$stage" && find . -type f ! -name STAGE.txt | sort | xargs sha256sum | while read -r sum file; do
    printf '%10d  %s  %s\n' "$(stat -c %s "$file")" "${sum:0:16}" "$file"
  done)
} > "$stage/STAGE.txt"

if command -v cuobjdump >/dev/null || [ -x /usr/local/cuda/bin/cuobjdump ]; then
  for p in "$stage"/*/libflashattn-cuda.so; do
    echo "gpu-stage: $p: $(PATH=$PATH:/usr/local/cuda/bin cuobjdump --list-elf "$p" 2>/dev/null | grep -o 'sm_[0-9a-z]*' | sort | uniq -c | tr -s ' \n' ' ')"
  done
fi
cat "$stage/STAGE.txt"
bytes=$(du -sb "$stage" | cut -f1)
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -n 1 | cut -f1)
echo "gpu-stage: $stage is $((bytes / 1024 / 1024)) MiB; with the tracked tree ($((tree / 1024 / 1024)) MiB), $(((bytes + tree) / 1024 / 1024)) of the 64 MiB a run carries"
if [ $((bytes + tree)) -gt $((60 * 1024 * 1024)) ]; then
  echo "gpu-stage: too large to carry: fewer FA_STAGE_ARCHS, or stage without a base" >&2
  exit 1
fi
echo "gpu-stage: ready; on the GPU machine: scripts/gpu-run.sh quick (carry: $stage)"
