# Builds llama.cpp tools once into .cache/llamacpp-<version>/build (sourced, not run).
#
#   llamacpp_build TARGET...   builds the cmake targets that are not built yet (llama-bench,
#                              llama-server, llama-quantize, ...)
#   llamacpp_bin NAME          prints the path of a built binary (nothing when absent)
#
# The source is the llama.cpp that the PyPI sdist of llama-cpp-python vendors
# (`pip download --no-binary llama-cpp-python --no-deps`); cmake comes from its PyPI wheel when the
# machine has none. The caller sets `root` (the repository) and may set LLAMACPP_VERSION (0.3.36),
# THREADS (build jobs; default nproc) and LLAMACPP_SIMD (below).

llamacpp_version="${LLAMACPP_VERSION:-0.3.36}"
llamacpp_cache="$root/.cache/llamacpp-$llamacpp_version"
# LLAMACPP_SIMD=avx2: a second build without AVX-512 (GGML_NATIVE off; AVX, AVX2, FMA, F16C, BMI2
# on) in build-avx2, the anchor for our AVX2 path forced with WORKER_SIMD=avx2 on an AVX-512
# machine: a stand-in for the AVX2-only machine kind (the same instructions, not the same core).
case "${LLAMACPP_SIMD:-native}" in
  native)
    llamacpp_build_dir="$llamacpp_cache/build"
    llamacpp_simd_flags=(-DGGML_NATIVE=ON)
    ;;
  avx2)
    llamacpp_build_dir="$llamacpp_cache/build-avx2"
    llamacpp_simd_flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
      -DGGML_BMI2=ON -DGGML_AVX512=OFF)
    ;;
  *)
    echo "LLAMACPP_SIMD is native or avx2, not ${LLAMACPP_SIMD}" >&2
    return 2 2>/dev/null || exit 2
    ;;
esac

llamacpp_bin() {
  find "$llamacpp_build_dir" -type f -name "$1" -perm -u+x 2>/dev/null | head -n 1
}

llamacpp_build() {
  # GGML_NATIVE compiles for the CPU it builds on, and the cache outlives the machine: a build
  # made on another machine kind (say AVX2 only, when this one has AVX-512 VNNI) would make a weak
  # anchor or crash, so it is started over when the CPU's model name or SIMD flags differ.
  local cpu_key
  cpu_key=$(grep -E '^(model name|flags)' /proc/cpuinfo | sort -u | sha256sum | cut -c1-16)
  if [[ -d "$llamacpp_build_dir" && "$(cat "$llamacpp_build_dir/.cpu-key" 2>/dev/null)" != "$cpu_key" ]]; then
    echo "llama.cpp build: made for another CPU (or not recorded); rebuilding for this one" >&2
    rm -rf "$llamacpp_build_dir"
  fi
  local missing=() t
  for t in "$@"; do [[ -n "$(llamacpp_bin "$t")" ]] || missing+=("$t"); done
  [[ ${#missing[@]} -gt 0 ]] || return 0
  local src_dir="$llamacpp_cache/src"
  if [[ ! -d "$src_dir" ]]; then
    mkdir -p "$llamacpp_cache/sdist"
    # The source distribution only (its build tools come as wheels; `--no-binary :all:` would
    # also compile cmake itself from source just to read the package's metadata).
    pip download "llama-cpp-python==$llamacpp_version" --no-binary llama-cpp-python --no-deps \
      -d "$llamacpp_cache/sdist"
    local tarball
    tarball=$(find "$llamacpp_cache/sdist" -name "llama_cpp_python-$llamacpp_version.tar.gz" -o -name "llama-cpp-python-$llamacpp_version.tar.gz" | head -n 1)
    [[ -n "$tarball" ]] || { echo "llama.cpp build: sdist not found in $llamacpp_cache/sdist" >&2; return 2; }
    mkdir -p "$src_dir.tmp"
    tar -xzf "$tarball" -C "$src_dir.tmp" --strip-components=1
    mv "$src_dir.tmp" "$src_dir"
  fi
  local llama_src="$src_dir/vendor/llama.cpp"
  [[ -f "$llama_src/CMakeLists.txt" ]] || { echo "llama.cpp build: no llama.cpp in $llama_src" >&2; return 2; }
  if ! command -v cmake >/dev/null; then # cmake from its PyPI wheel, in a venv in the cache
    "$llamacpp_cache/tools/bin/cmake" --version >/dev/null 2>&1 || {
      rm -rf "$llamacpp_cache/tools"
      python3 -m venv "$llamacpp_cache/tools" && "$llamacpp_cache/tools/bin/pip" install -q cmake
    }
    export PATH="$llamacpp_cache/tools/bin:$PATH"
  fi
  # A build folder configured from another checkout's path cannot be reconfigured: start it over.
  if [[ -f "$llamacpp_build_dir/CMakeCache.txt" ]] &&
    ! grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$llama_src" "$llamacpp_build_dir/CMakeCache.txt"; then
    rm -rf "$llamacpp_build_dir/CMakeCache.txt" "$llamacpp_build_dir/CMakeFiles"
  fi
  cmake -S "$llama_src" -B "$llamacpp_build_dir" -DCMAKE_BUILD_TYPE=Release "${llamacpp_simd_flags[@]}" \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DBUILD_SHARED_LIBS=OFF
  cmake --build "$llamacpp_build_dir" --config Release -j "${THREADS:-$(nproc)}" --target "${missing[@]}"
  echo "$cpu_key" >"$llamacpp_build_dir/.cpu-key"
}
