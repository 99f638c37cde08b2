#!/usr/bin/python3
"""Writes the fuzzer's seed corpus: valid requests of every dtype, layout and
scalar setting, plus a few malformed ones.

    PYTHONPATH=build/python /usr/bin/python3 tests/fuzz/make_corpus.py DIR
"""
import os
import sys

import numpy as np

from matmul.v1 import matmul_pb2 as pb

SIZES = {pb.DTYPE_FLOAT32: 4, pb.DTYPE_FLOAT64: 8, pb.DTYPE_FLOAT16: 2, pb.DTYPE_BFLOAT16: 2}


def matrix(rows, cols, dtype, rng):
    data = rng.integers(1, 255, rows * cols * SIZES[dtype], dtype=np.uint8).tobytes()
    return pb.Matrix(rows=rows, cols=cols, dtype=dtype, data=data)


def main(out):
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(1)
    n = 0
    for dtype in SIZES:
        for ta in (False, True):
            for tb in (False, True):
                m, k, nn = 3, 5, 4
                r = pb.MultiplyRequest(
                    a=matrix(k, m, dtype, rng) if ta else matrix(m, k, dtype, rng),
                    b=matrix(nn, k, dtype, rng) if tb else matrix(k, nn, dtype, rng),
                    transpose_a=ta, transpose_b=tb, request_id=f"seed{n}")
                if ta and tb:
                    r.c.CopyFrom(matrix(m, nn, dtype, rng))
                    r.alpha, r.beta = 2.0, -0.5
                with open(os.path.join(out, f"seed-{n:03d}"), "wb") as f:
                    f.write(r.SerializeToString())
                n += 1
    bad = pb.MultiplyRequest(a=matrix(2, 3, pb.DTYPE_FLOAT32, rng), b=matrix(4, 2, pb.DTYPE_FLOAT32, rng))
    with open(os.path.join(out, "bad-inner"), "wb") as f:
        f.write(bad.SerializeToString())
    bad.a.data = bad.a.data[:-1]
    with open(os.path.join(out, "bad-short"), "wb") as f:
        f.write(bad.SerializeToString())
    # Kept matrices ("k1" is 8 x 8 float32 in the fuzzer's stand-in store) and
    # shared memory (region "s"), with and without store_result. Padded to an
    # even length where needed: the fuzzer enables them for even inputs.
    f32 = pb.DTYPE_FLOAT32
    extras = [
        pb.MultiplyRequest(a=matrix(4, 8, f32, rng), b=pb.Matrix(handle="k1")),
        pb.MultiplyRequest(a=pb.Matrix(handle="k1"), b=pb.Matrix(handle="k1"), store_result=True),
        pb.MultiplyRequest(a=pb.Matrix(rows=4, cols=8, dtype=f32,
                                       shm=pb.SharedMemoryRef(region="s", offset=64, bytes=128)),
                           b=pb.Matrix(handle="k1"),
                           output_shm=pb.SharedMemoryRef(region="s", offset=4096, bytes=128)),
        pb.MultiplyRequest(a=matrix(8, 8, f32, rng), b=matrix(8, 8, f32, rng),
                           c=pb.Matrix(handle="k1"), beta=1.0),
    ]
    for i, r in enumerate(extras):
        data = r.SerializeToString()
        if len(data) % 2:
            r.request_id = "x"
            data = r.SerializeToString()
        if len(data) % 2:
            r.request_id = "xx"
            data = r.SerializeToString()
        with open(os.path.join(out, f"extra-{i}"), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main(sys.argv[1])
