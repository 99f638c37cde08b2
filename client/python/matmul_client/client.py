"""The MatmulClient class; see the package docstring."""

import json

import grpc
import numpy as np

from matmul.v1 import matmul_pb2, matmul_pb2_grpc

_DTYPES = {
    "float32": matmul_pb2.DTYPE_FLOAT32,
    "float64": matmul_pb2.DTYPE_FLOAT64,
    "float16": matmul_pb2.DTYPE_FLOAT16,
    "bfloat16": matmul_pb2.DTYPE_BFLOAT16,
}
_NUMPY_OF = {
    matmul_pb2.DTYPE_FLOAT32: np.dtype("<f4"),
    matmul_pb2.DTYPE_FLOAT64: np.dtype("<f8"),
    matmul_pb2.DTYPE_FLOAT16: np.dtype("<f2"),
    matmul_pb2.DTYPE_BFLOAT16: np.dtype("<u2"),
}
_PRECISIONS = {
    "default": matmul_pb2.PRECISION_DEFAULT,
    "tf32": matmul_pb2.PRECISION_TF32,
}


class MatmulError(Exception):
    """A failed call: ``code`` is the grpc.StatusCode, ``details`` the server's message."""

    def __init__(self, code, details):
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


def float32_to_bfloat16(x):
    """Rounds an array to bfloat16 (nearest, ties to even); returns the raw uint16 bits."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        bits[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return bits


def bfloat16_to_float32(bits):
    """Widens raw bfloat16 bits (uint16) to float32, exactly."""
    bits = np.ascontiguousarray(bits, dtype=np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _wire_dtype(name_or_dtype):
    if name_or_dtype is None:
        return None
    if isinstance(name_or_dtype, str) and name_or_dtype.lower() in ("bfloat16", "bf16"):
        return matmul_pb2.DTYPE_BFLOAT16
    if isinstance(name_or_dtype, int) and name_or_dtype in _NUMPY_OF:
        return name_or_dtype
    np_dtype = np.dtype(name_or_dtype)
    for wire, candidate in _NUMPY_OF.items():
        if wire != matmul_pb2.DTYPE_BFLOAT16 and candidate == np_dtype.newbyteorder("<"):
            return wire
    raise ValueError(f"unsupported dtype {name_or_dtype!r}: expected float32, float64, "
                     "float16 or bfloat16")


def _to_matrix(array, wire_dtype):
    array = np.asarray(array)
    if array.ndim != 2:
        raise ValueError(f"expected a 2-D array, got shape {array.shape}")
    if wire_dtype == matmul_pb2.DTYPE_BFLOAT16:
        data = array if array.dtype == np.uint16 else float32_to_bfloat16(array)
    else:
        data = np.ascontiguousarray(array, dtype=_NUMPY_OF[wire_dtype])
    return matmul_pb2.Matrix(rows=array.shape[0], cols=array.shape[1], dtype=wire_dtype,
                             data=np.ascontiguousarray(data).tobytes())


def _from_matrix(matrix, raw_bfloat16=False):
    array = np.frombuffer(matrix.data, dtype=_NUMPY_OF[matrix.dtype]).reshape(matrix.rows,
                                                                              matrix.cols)
    if matrix.dtype == matmul_pb2.DTYPE_BFLOAT16 and not raw_bfloat16:
        return bfloat16_to_float32(array).reshape(matrix.rows, matrix.cols)
    return array.copy()


def _precision(name_or_enum):
    if not isinstance(name_or_enum, str):
        return name_or_enum
    if name_or_enum not in _PRECISIONS:
        raise ValueError(f"unsupported precision {name_or_enum!r}: expected "
                         + " or ".join(repr(p) for p in _PRECISIONS))
    return _PRECISIONS[name_or_enum]


def _is_handle(x):
    return isinstance(x, matmul_pb2.MatrixHandle)


def _handle_id(handle):
    return handle.id if _is_handle(handle) else str(handle)


def _operand(x, wire_dtype):
    """An inline Matrix for an array; a by-handle Matrix for a MatrixHandle; a
    Matrix message (e.g. from shm_matrix) as it is."""
    if _is_handle(x):
        return matmul_pb2.Matrix(handle=x.id)
    if isinstance(x, matmul_pb2.Matrix):
        return x
    return _to_matrix(x, wire_dtype)


def shm_matrix(region, offset, rows, cols, dtype):
    """An operand whose bytes are in a registered shared-memory region (same host;
    see MatmulClient.register_shared_memory), row-major, little-endian."""
    wire = _wire_dtype(dtype)
    size = np.dtype(_NUMPY_OF[wire]).itemsize
    return matmul_pb2.Matrix(rows=rows, cols=cols, dtype=wire,
                             shm=matmul_pb2.SharedMemoryRef(region=region, offset=offset,
                                                            bytes=rows * cols * size))


class MatmulClient:
    """A connection to matmul-server.

    ``target`` is any gRPC target: "host:port", "dns:///name:port" (every address
    the name resolves to, e.g. a headless Kubernetes Service) or
    "ipv4:10.0.0.1:50051,10.0.0.2:50051". ``load_balancing`` is "pick_first" or
    "round_robin"; ``max_attempts`` > 1 retries calls answered UNAVAILABLE.
    TLS: ``tls_ca`` (a PEM file to verify the server with) turns it on;
    ``tls_cert``/``tls_key`` (PEM files) add a client certificate for mutual TLS;
    ``tls_server_name`` overrides the name expected in the server's certificate.
    ``token`` is sent as "authorization: Bearer <token>" on every call.
    A client may be shared by threads.
    """

    def __init__(self, target, *, timeout=None, load_balancing="pick_first", max_attempts=1,
                 max_message_bytes=1 << 30, tls_ca=None, tls_cert=None, tls_key=None,
                 tls_server_name=None, token=None):
        if load_balancing not in ("pick_first", "round_robin"):
            raise ValueError("load_balancing must be pick_first or round_robin")
        config = {"loadBalancingConfig": [{load_balancing: {}}]}
        if load_balancing == "round_robin":
            # Skip replicas whose health service says NOT_SERVING (draining).
            config["healthCheckConfig"] = {"serviceName": "matmul.v1.MatmulService"}
        if max_attempts > 1:
            config["methodConfig"] = [{
                "name": [{"service": "matmul.v1.MatmulService"}],
                "retryPolicy": {"maxAttempts": max_attempts, "initialBackoff": "0.05s",
                                "maxBackoff": "1s", "backoffMultiplier": 2,
                                "retryableStatusCodes": ["UNAVAILABLE"]},
            }]
        options = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.service_config", json.dumps(config)),
            ("grpc.enable_retries", 1 if max_attempts > 1 else 0),
            ("grpc.per_rpc_retry_buffer_size", max_message_bytes),
            # Results arrive in HTTP/2 frames of up to 1 MiB instead of 16 KiB
            # (less per-frame work on both ends; see docs/BENCHMARKS.md).
            ("grpc.http2.max_frame_size", 1 << 20),
        ]
        if tls_server_name:
            options.append(("grpc.ssl_target_name_override", tls_server_name))
        if tls_ca:
            def read(path):
                with open(path, "rb") as f:
                    return f.read()
            credentials = grpc.ssl_channel_credentials(
                root_certificates=read(tls_ca),
                private_key=read(tls_key) if tls_key else None,
                certificate_chain=read(tls_cert) if tls_cert else None)
            self._channel = grpc.secure_channel(target, credentials, options=options)
        else:
            if tls_cert or tls_key:
                raise ValueError("a client certificate needs tls_ca (TLS) too")
            self._channel = grpc.insecure_channel(target, options=options)
        self._stub = matmul_pb2_grpc.MatmulServiceStub(self._channel)
        self._timeout = timeout
        self._metadata = [("authorization", f"Bearer {token}")] if token else None

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method, request, timeout):
        try:
            return method(request, timeout=timeout if timeout is not None else self._timeout,
                          metadata=self._metadata)
        except grpc.RpcError as e:
            raise MatmulError(e.code(), e.details()) from None

    def build_request(self, a, b, *, transpose_a=False, transpose_b=False, precision="default",
                      c=None, alpha=1.0, beta=0.0, dtype=None, output_dtype=None, priority=0,
                      request_id="", store_result=False, result_ttl_seconds=0,
                      output_shm=None):
        """The MultiplyRequest that matmul() sends (for streams and raw calls).

        ``a``, ``b`` and ``c`` are arrays, or MatrixHandles of matrices kept on the
        server (put_matrix, or a result kept with store_result)."""
        if dtype is not None:
            wire = _wire_dtype(dtype)
        else:
            described = next((x for x in (a, b)
                              if _is_handle(x) or isinstance(x, matmul_pb2.Matrix)), None)
            wire = described.dtype if described is not None else _wire_dtype(np.asarray(a).dtype)
        out = _wire_dtype(output_dtype)
        request = matmul_pb2.MultiplyRequest(
            a=_operand(a, wire), b=_operand(b, wire), transpose_a=transpose_a,
            transpose_b=transpose_b,
            precision=_precision(precision),
            output_dtype=out or matmul_pb2.DTYPE_UNSPECIFIED, priority=priority,
            request_id=request_id, alpha=alpha, beta=beta, store_result=store_result,
            result_ttl_seconds=result_ttl_seconds)
        if c is not None:
            request.c.CopyFrom(_operand(c, out or wire))
        if output_shm is not None:
            request.output_shm.CopyFrom(output_shm)
        return request

    def matmul(self, a, b, *, transpose_a=False, transpose_b=False, precision="default", c=None,
               alpha=1.0, beta=0.0, dtype=None, output_dtype=None, priority=0, timeout=None,
               raw_bfloat16=False, store_result=False, result_ttl_seconds=0):
        """alpha * op(a) @ op(b) + beta * c on the server, as a numpy array.

        ``dtype`` overrides the arrays' dtype on the wire ("bfloat16" for bfloat16);
        ``precision`` is "default" (exact float32) or "tf32". Operands may be
        MatrixHandles (see put_matrix). With ``store_result`` the result stays on the
        server and its MatrixHandle is returned instead. Raises MatmulError.
        """
        request = self.build_request(a, b, transpose_a=transpose_a, transpose_b=transpose_b,
                                     precision=precision, c=c, alpha=alpha, beta=beta,
                                     dtype=dtype, output_dtype=output_dtype, priority=priority,
                                     store_result=store_result,
                                     result_ttl_seconds=result_ttl_seconds)
        response = self._call(self._stub.Multiply, request, timeout)
        if store_result:
            return response.result_handle
        return _from_matrix(response.c, raw_bfloat16)

    def put_matrix(self, array, *, dtype=None, ttl_seconds=0, chunk_bytes=4 << 20, timeout=None):
        """Keeps a matrix on the server; returns its MatrixHandle (id, shape, dtype,
        bytes, expire_time_ms). Matrices larger than ``chunk_bytes`` go in chunks
        (UploadMatrix), so any size up to the server's store budget works."""
        wire = _wire_dtype(dtype) if dtype is not None else _wire_dtype(np.asarray(array).dtype)
        matrix = _to_matrix(array, wire)
        if len(matrix.data) <= chunk_bytes:
            return self._call(self._stub.PutMatrix,
                              matmul_pb2.PutMatrixRequest(matrix=matrix, ttl_seconds=ttl_seconds),
                              timeout)

        def chunks():
            data = matrix.data
            for offset in range(0, len(data), chunk_bytes):
                chunk = matmul_pb2.UploadMatrixChunk(data=data[offset:offset + chunk_bytes])
                if offset == 0:
                    chunk.rows, chunk.cols, chunk.dtype = matrix.rows, matrix.cols, matrix.dtype
                    chunk.ttl_seconds = ttl_seconds
                yield chunk
        return self._call(self._stub.UploadMatrix, chunks(), timeout)

    def get_matrix(self, handle, *, raw_bfloat16=False, timeout=None):
        """Downloads a kept matrix (a MatrixHandle or its id) as a numpy array."""
        request = matmul_pb2.GetMatrixRequest(id=_handle_id(handle))
        try:
            parts = list(self._stub.GetMatrix(
                request, timeout=timeout if timeout is not None else self._timeout,
                metadata=self._metadata))
        except grpc.RpcError as e:
            raise MatmulError(e.code(), e.details()) from None
        h = parts[0].handle
        matrix = matmul_pb2.Matrix(rows=h.rows, cols=h.cols, dtype=h.dtype,
                                   data=b"".join(p.data for p in parts))
        return _from_matrix(matrix, raw_bfloat16)

    def delete_matrix(self, handle, timeout=None):
        """Deletes a kept matrix (a MatrixHandle or its id)."""
        self._call(self._stub.DeleteMatrix, matmul_pb2.DeleteMatrixRequest(id=_handle_id(handle)),
                   timeout)

    def register_shared_memory(self, name, key, byte_size, offset=0, timeout=None):
        """Lets the server map [offset, offset + byte_size) of the POSIX shared-memory
        object ``key`` ("/name"; for multiprocessing.shared_memory.SharedMemory that is
        "/" + shm.name) as region ``name``, for shm_matrix operands and output_shm
        results. Same host only; the server must run with --shared_memory."""
        self._call(self._stub.RegisterSharedMemory,
                   matmul_pb2.RegisterSharedMemoryRequest(name=name, key=key, offset=offset,
                                                          byte_size=byte_size), timeout)

    def unregister_shared_memory(self, name, timeout=None):
        self._call(self._stub.UnregisterSharedMemory,
                   matmul_pb2.UnregisterSharedMemoryRequest(name=name), timeout)

    def list_matrices(self, timeout=None):
        """The caller's kept matrices, as MatrixHandles."""
        return list(self._call(self._stub.ListMatrices, matmul_pb2.ListMatricesRequest(),
                               timeout).matrices)

    def multiply(self, request, timeout=None):
        """Sends a MultiplyRequest; returns the MultiplyResponse (timing included)."""
        return self._call(self._stub.Multiply, request, timeout)

    def multiply_stream(self, requests, timeout=None):
        """Sends requests over one MultiplyStream; returns the responses as they came
        (match by request_id; failed items have ``error`` set)."""
        try:
            return list(self._stub.MultiplyStream(
                iter(requests), timeout=timeout if timeout is not None else self._timeout,
                metadata=self._metadata))
        except grpc.RpcError as e:
            raise MatmulError(e.code(), e.details()) from None

    def server_info(self, timeout=None):
        """The server's ServerInfo message."""
        return self._call(self._stub.GetServerInfo, matmul_pb2.GetServerInfoRequest(), timeout)

    @staticmethod
    def result_array(response, raw_bfloat16=False):
        """The result of a MultiplyResponse as a numpy array."""
        return _from_matrix(response.c, raw_bfloat16)

