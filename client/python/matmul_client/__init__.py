"""Python client for matmul-server (matmul.v1.MatmulService).

    from matmul_client import MatmulClient
    client = MatmulClient("localhost:50051")
    c = client.matmul(a, b)                       # numpy arrays in, numpy out

bfloat16 (NumPy has none): pass ``dtype="bfloat16"`` with float arrays
(rounded to bfloat16, nearest-even, before sending) or with uint16 arrays
holding raw bfloat16 bits; a bfloat16 result comes back as a float32 array
(every bfloat16 value is exact in float32), or as raw uint16 bits with
``raw_bfloat16=True``.
"""

from .client import (MatmulClient, MatmulError, bfloat16_to_float32, float32_to_bfloat16,
                     shm_matrix)

__all__ = ["MatmulClient", "MatmulError", "bfloat16_to_float32", "float32_to_bfloat16",
           "shm_matrix"]
