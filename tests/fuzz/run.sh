#!/usr/bin/env bash
# Builds the request fuzzer and the .npy reader's fuzzer with clang
# (libFuzzer + ASan + UBSan) and runs each for a bounded time from its seed
# corpus (the .npy one for a quarter of SECONDS); any crash fails the test
# and leaves its input in WORK_DIR (make it a regression test).
#
#   run.sh WORK_DIR SOURCE_DIR BUILD_DIR [SECONDS]
set -euo pipefail
work=$1 src=$2 build=$3 seconds=${4:-60}
mkdir -p "$work/corpus" "$work/artifacts"
command -v clang++ >/dev/null || { echo "fuzz test: clang++ is required" >&2; exit 1; }
gen="$build/generated"
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -I"$src" -I"$gen" $(pkg-config --cflags protobuf openblas))
libs=($(pkg-config --libs absl_status absl_statusor absl_strings absl_str_format absl_synchronization \
      protobuf openblas))
clang++ "${flags[@]}" "$src/tests/fuzz/request_fuzzer.cc" "$src/server/request_validation.cc" \
    "$src/server/request_parser.cc" "$src/kernels/host_buffer.cc" \
    "$src/kernels/cpu/cpu_engine.cc" "$src/kernels/dtype.cc" "$src/kernels/half.cc" \
    "$src/kernels/engine.cc" "$gen/matmul/v1/matmul.pb.cc" "${libs[@]}" -o "$work/request_fuzzer"
PYTHONPATH="$build/python" /usr/bin/python3 "$src/tests/fuzz/make_corpus.py" "$work/seeds"
# Inputs past the seeds and the committed regression inputs.
cp "$work/seeds"/* "$work/corpus/"
[[ -d $src/tests/fuzz/regressions ]] && cp "$src/tests/fuzz/regressions"/* "$work/corpus/" 2>/dev/null || true
ASAN_OPTIONS=detect_leaks=1 "$work/request_fuzzer" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -artifact_prefix="$work/artifacts/" -print_final_stats=1 "$work/corpus"

# The .npy reader matmul-cli sends files through, for a quarter of the time,
# from NumPy's own files (versions 1 and 2, both orders, every dtype).
clang++ "${flags[@]}" "$src/tests/fuzz/npy_fuzzer.cc" "$src/client/npy.cc" "$src/kernels/dtype.cc" \
    "${libs[@]}" -o "$work/npy_fuzzer"
mkdir -p "$work/npy_corpus"
/usr/bin/python3 - "$work/npy_corpus" <<'PY'
import io, sys
import numpy as np
for i, (shape, dtype, fortran) in enumerate(
        [((2, 3), "<f4", False), ((3, 2), "<f8", True), ((1, 1), "<f2", False),
         ((4, 5), "<u2", True), ((0, 3), "<f4", False)]):
    a = np.ones(shape, dtype=dtype)
    if fortran:
        a = np.asfortranarray(a)
    for version in ((1, 0), (2, 0)):
        out = io.BytesIO()
        np.lib.format.write_array(out, a, version=version)
        open(f"{sys.argv[1]}/seed{i}_v{version[0]}", "wb").write(out.getvalue())
PY
[[ -d $src/tests/fuzz/npy_regressions ]] && cp "$src/tests/fuzz/npy_regressions"/* "$work/npy_corpus/" 2>/dev/null || true
ASAN_OPTIONS=detect_leaks=1 "$work/npy_fuzzer" -max_total_time=$(( (seconds + 3) / 4 )) -timeout=10 \
    -rss_limit_mb=2048 -artifact_prefix="$work/artifacts/" -print_final_stats=1 "$work/npy_corpus"
