"""The Python client against a real matmul-server (started here on loopback ports)."""

import os
import subprocess
import tempfile
import threading
import time
import unittest
from multiprocessing import shared_memory

import grpc
import numpy as np

from matmul_client import (MatmulClient, MatmulError, bfloat16_to_float32, float32_to_bfloat16,
                           shm_matrix)
from matmul.v1 import matmul_pb2

BOUNDS = {np.float64: 1e-12, np.float32: 1e-5, np.float16: 1e-2, "bfloat16": 1e-2}


# cpu (default) or cuda: which engine the tests start the server with.
BACKEND = os.environ.get("MATMUL_TEST_BACKEND", "cpu")


def start_server(*flags):
    tmp = tempfile.mkdtemp(prefix="matmul-py-")
    port_file = os.path.join(tmp, "ports")
    proc = subprocess.Popen([os.environ["MATMUL_SERVER_BINARY"], "--listen=127.0.0.1:0",
                             "--metrics_listen=127.0.0.1:0", f"--port_file={port_file}",
                             f"--backend={BACKEND}", *flags])
    while not os.path.exists(port_file):
        if proc.poll() is not None:
            raise RuntimeError("matmul-server exited at start")
        time.sleep(0.01)
    with open(port_file) as f:
        port, metrics_port = (int(x) for x in f.read().split())
    return proc, port, metrics_port


def rel_err(out, ref):
    out = np.asarray(out, dtype=np.float64)
    if not np.all(np.isfinite(out)):
        return float("inf")
    return np.linalg.norm(out - ref) / np.linalg.norm(ref)


def rand(rng, shape, dtype=np.float32):
    x = rng.uniform(-1, 1, size=shape)
    x[np.abs(x) < 1e-3] = 0.5  # Never zeros.
    return x.astype(dtype)


class MatmulClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.proc, cls.port, cls.metrics_port = start_server()
        cls.client = MatmulClient(f"127.0.0.1:{cls.port}", timeout=120)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.proc.terminate()
        code = cls.proc.wait(timeout=120)
        if code != 0:
            raise AssertionError(f"matmul-server exited with {code} after SIGTERM")

    def setUp(self):
        self.rng = np.random.default_rng()

    def test_float_dtypes_transposes_and_scalars(self):
        for dtype in (np.float32, np.float64, np.float16):
            for ta in (False, True):
                for tb in (False, True):
                    m, n, k = 37, 23, 51
                    a = rand(self.rng, (k, m) if ta else (m, k), dtype)
                    b = rand(self.rng, (n, k) if tb else (k, n), dtype)
                    c = rand(self.rng, (m, n), dtype)
                    out = self.client.matmul(a, b, transpose_a=ta, transpose_b=tb, c=c,
                                             alpha=0.5, beta=-2.0)
                    self.assertEqual(out.dtype, dtype)
                    self.assertEqual(out.shape, (m, n))
                    opa = a.astype(np.float64).T if ta else a.astype(np.float64)
                    opb = b.astype(np.float64).T if tb else b.astype(np.float64)
                    ref = 0.5 * opa @ opb - 2.0 * c.astype(np.float64)
                    self.assertLessEqual(rel_err(out, ref), BOUNDS[dtype], (dtype, ta, tb))

    def test_bfloat16_convention(self):
        a = rand(self.rng, (16, 32))
        b = rand(self.rng, (32, 8))
        out = self.client.matmul(a, b, dtype="bfloat16")
        self.assertEqual(out.dtype, np.float32)  # bfloat16 values, exact in float32
        # The server multiplied the bfloat16-rounded inputs.
        a16 = bfloat16_to_float32(float32_to_bfloat16(a)).astype(np.float64)
        b16 = bfloat16_to_float32(float32_to_bfloat16(b)).astype(np.float64)
        self.assertLessEqual(rel_err(out, a16 @ b16), 1e-2)
        # Every value is a bfloat16: its low 16 bits are zero.
        self.assertTrue(np.all(out.view(np.uint32) & 0xFFFF == 0))
        raw = self.client.matmul(a, b, dtype="bfloat16", raw_bfloat16=True)
        self.assertEqual(raw.dtype, np.uint16)
        np.testing.assert_array_equal(bfloat16_to_float32(raw), out)
        wide = self.client.matmul(a, b, dtype="bfloat16", output_dtype="float32")
        self.assertEqual(wide.dtype, np.float32)
        self.assertLessEqual(rel_err(wide, a16 @ b16), 1e-5)

    def test_bfloat16_rounding_is_nearest_even(self):
        x = np.array([1.0, 1.00390625, 1.01171875, -2.5, np.inf, np.nan], dtype=np.float32)
        bits = float32_to_bfloat16(x)
        # 1 + 2^-8 is a tie between 1 and 1 + 2^-7: to even (1.0);
        # 1 + 3 * 2^-8 ties up to 1 + 2^-6.
        self.assertEqual(list(bits[:5]), [0x3F80, 0x3F80, 0x3F82, 0xC020, 0x7F80])
        self.assertTrue(np.isnan(bfloat16_to_float32(bits)[5]))

    def test_tf32_precision_is_accepted(self):
        a = rand(self.rng, (64, 64))
        b = rand(self.rng, (64, 64))
        out = self.client.matmul(a, b, precision="tf32")
        self.assertLessEqual(rel_err(out, a.astype(np.float64) @ b), 2e-3)

    def test_errors_raise_with_code_and_message(self):
        with self.assertRaises(MatmulError) as caught:
            self.client.matmul(rand(self.rng, (3, 4)), rand(self.rng, (5, 6)))
        self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("inner dimensions differ", caught.exception.details)
        with self.assertRaises(MatmulError) as caught:
            self.client.matmul(rand(self.rng, (3, 4)), rand(self.rng, (4, 2)), beta=1.0)
        self.assertIn("c: required", caught.exception.details)
        with self.assertRaises(ValueError):
            self.client.matmul(np.zeros((2, 2), dtype=np.int32), np.zeros((2, 2), dtype=np.int32))
        with self.assertRaisesRegex(ValueError, "precision 'fast'"):
            self.client.matmul(rand(self.rng, (2, 3)), rand(self.rng, (3, 2)), precision="fast")
        # Still serving.
        a, b = rand(self.rng, (2, 3)), rand(self.rng, (3, 2))
        self.assertLessEqual(rel_err(self.client.matmul(a, b), a.astype(np.float64) @ b), 1e-5)

    def test_stream_answers_every_item(self):
        requests, refs = [], {}
        for i in range(50):
            a, b = rand(self.rng, (1 + i % 9, 7)), rand(self.rng, (7, 1 + i % 5))
            request = self.client.build_request(a, b, request_id=f"r{i}")
            if i % 10 == 4:
                request.b.rows = 8  # Bad item.
            requests.append(request)
            refs[f"r{i}"] = a.astype(np.float64) @ b
        responses = self.client.multiply_stream(requests)
        self.assertEqual(sorted(r.request_id for r in responses), sorted(refs))
        for r in responses:
            index = int(r.request_id[1:])
            if index % 10 == 4:
                self.assertEqual(r.error.code, grpc.StatusCode.INVALID_ARGUMENT.value[0])
            else:
                self.assertEqual(r.error.code, 0)
                self.assertLessEqual(rel_err(MatmulClient.result_array(r), refs[r.request_id]),
                                     1e-5)

    def test_concurrent_threads_share_a_client(self):
        failures = []

        def work(seed):
            rng = np.random.default_rng(seed)
            for _ in range(10):
                a, b = rand(rng, (20, 30)), rand(rng, (30, 10))
                if rel_err(self.client.matmul(a, b), a.astype(np.float64) @ b) > 1e-5:
                    failures.append(seed)

        threads = [threading.Thread(target=work, args=(s,)) for s in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(failures, [])

    def test_kept_matrices_by_handle_chunked_and_chained(self):
        for dtype in (np.float32, "bfloat16"):
            np_dtype = np.float32
            a = rand(self.rng, (33, 70), np_dtype)
            b = rand(self.rng, (70, 45), np_dtype)
            e = rand(self.rng, (45, 20), np_dtype)
            # Chunks of 1 KiB force the streaming upload for b.
            hb = self.client.put_matrix(b, dtype=dtype, chunk_bytes=1024)
            he = self.client.put_matrix(e, dtype=dtype)
            self.assertEqual((hb.rows, hb.cols), (70, 45))
            wire_b = self.client.get_matrix(hb)
            wire_a = bfloat16_to_float32(float32_to_bfloat16(a)) if dtype == "bfloat16" else a
            ref = wire_a.astype(np.float64) @ wire_b.astype(np.float64)
            bound = BOUNDS["bfloat16"] if dtype == "bfloat16" else BOUNDS[np.float32]
            inline = self.client.matmul(a, wire_b, dtype=dtype)
            by_handle = self.client.matmul(a, hb, dtype=dtype)
            self.assertLess(rel_err(by_handle, ref), bound)
            np.testing.assert_array_equal(by_handle, inline)
            # A chain kept on the server: (a @ b) @ e, downloaded once.
            ha = self.client.put_matrix(a, dtype=dtype)
            hc = self.client.matmul(ha, hb, store_result=True)
            self.assertTrue(hc.id)
            hd = self.client.matmul(hc, he, store_result=True)
            c = self.client.get_matrix(hc)
            d = self.client.get_matrix(hd)
            self.assertLess(rel_err(c, ref), bound)
            ref_d = c.astype(np.float64) @ self.client.get_matrix(he).astype(np.float64)
            self.assertLess(rel_err(d, ref_d), bound)
            ids = {h.id for h in self.client.list_matrices()}
            self.assertTrue({ha.id, hb.id, hc.id, hd.id, he.id} <= ids)
            for h in (ha, hb, hc, hd, he):
                self.client.delete_matrix(h)
            with self.assertRaises(MatmulError) as cm:
                self.client.matmul(a, hb, dtype=dtype)
            self.assertEqual(cm.exception.code, grpc.StatusCode.NOT_FOUND)
            self.assertIn(hb.id, cm.exception.details)

    def test_server_info(self):
        info = self.client.server_info()
        self.assertTrue(info.engine.startswith("cpu" if BACKEND == "cpu" else "cuda"), info.engine)
        self.assertEqual(info.devices[0].id, f"{BACKEND}:0")
        self.assertIn(matmul_pb2.DTYPE_BFLOAT16, info.supported_dtypes)
        self.assertGreater(info.limits.max_request_bytes, 4096 * 4096 * 4 * 2)

    def test_health_and_reflection(self):
        import health_v1_pb2
        import health_v1_pb2_grpc
        import reflection_v1alpha_pb2 as refl
        import reflection_v1alpha_pb2_grpc as refl_grpc
        channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        health = health_v1_pb2_grpc.HealthStub(channel)
        for service in ("", "matmul.v1.MatmulService"):
            status = health.Check(health_v1_pb2.HealthCheckRequest(service=service)).status
            self.assertEqual(status, health_v1_pb2.HealthCheckResponse.SERVING, service)
        stub = refl_grpc.ServerReflectionStub(channel)
        requests = [refl.ServerReflectionRequest(list_services=""),
                    refl.ServerReflectionRequest(
                        file_containing_symbol="matmul.v1.MatmulService")]
        responses = list(stub.ServerReflectionInfo(iter(requests)))
        names = {s.name for s in responses[0].list_services_response.service}
        self.assertIn("matmul.v1.MatmulService", names)
        self.assertIn("grpc.health.v1.Health", names)
        self.assertGreater(len(responses[1].file_descriptor_response.file_descriptor_proto), 0)
        channel.close()

    def test_timing_in_raw_response(self):
        request = self.client.build_request(rand(self.rng, (8, 8)), rand(self.rng, (8, 8)),
                                            request_id="timed")
        response = self.client.multiply(request)
        self.assertEqual(response.request_id, "timed")
        self.assertEqual(response.timing.device, f"{BACKEND}:0")
        self.assertGreaterEqual(response.timing.total_us, response.timing.compute_us)


class SharedMemoryTest(unittest.TestCase):
    """Operands and results through POSIX shared memory (same host)."""

    @classmethod
    def setUpClass(cls):
        cls.proc, cls.port, _ = start_server("--shared_memory")
        cls.client = MatmulClient(f"127.0.0.1:{cls.port}", timeout=120)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.proc.terminate()
        cls.proc.wait(timeout=120)

    def test_operands_and_result_in_shared_memory(self):
        rng = np.random.default_rng()
        a, b = rand(rng, (40, 64)), rand(rng, (64, 24))
        region = shared_memory.SharedMemory(create=True, size=1 << 20)
        try:
            buf = np.ndarray((1 << 20,), dtype=np.uint8, buffer=region.buf)
            buf[:a.nbytes] = a.view(np.uint8).ravel()
            buf[65536:65536 + b.nbytes] = b.view(np.uint8).ravel()
            self.client.register_shared_memory("r", "/" + region.name, 1 << 20)
            out = matmul_pb2.SharedMemoryRef(region="r", offset=131072, bytes=40 * 24 * 4)
            response = self.client.multiply(self.client.build_request(
                shm_matrix("r", 0, 40, 64, np.float32), shm_matrix("r", 65536, 64, 24, np.float32),
                output_shm=out))
            self.assertEqual(len(response.c.data), 0)
            result = np.frombuffer(bytes(region.buf[131072:131072 + 40 * 24 * 4]),
                                   dtype=np.float32).reshape(40, 24)
            ref = a.astype(np.float64) @ b.astype(np.float64)
            self.assertLess(rel_err(result, ref), BOUNDS[np.float32])
            with self.assertRaises(MatmulError) as cm:
                self.client.matmul(shm_matrix("r", (1 << 20) - 100, 40, 64, np.float32), b)
            self.assertEqual(cm.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            self.client.unregister_shared_memory("r")
            del buf
        finally:
            region.close()
            region.unlink()


if __name__ == "__main__":
    unittest.main()
