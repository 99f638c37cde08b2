"""A real Prometheus (Debian's package) scrapes a real matmul-server under load;
every PromQL expression of the Grafana dashboard and of the alert rules must
evaluate without error and return data. promtool checks the rules and the
exposition format.

Environment: MATMUL_SERVER_BINARY, MATMUL_SOURCE_DIR (the repository root).
"""

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.parse
import urllib.request

import numpy as np
import yaml

from matmul_client import MatmulClient, MatmulError

SOURCE = os.environ["MATMUL_SOURCE_DIR"]
ALERTS = os.path.join(SOURCE, "deploy/prometheus/alerts.yml")
DASHBOARD = os.path.join(SOURCE, "deploy/grafana/dashboards/matmul-server.json")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


class PrometheusTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="matmul-prom-")
        port_file = os.path.join(cls.tmp, "ports")
        cls.server = subprocess.Popen([
            os.environ["MATMUL_SERVER_BINARY"], "--backend=cpu", "--listen=127.0.0.1:0",
            "--metrics_listen=127.0.0.1:0", f"--port_file={port_file}"],
            stderr=subprocess.DEVNULL)
        while not os.path.exists(port_file):
            if cls.server.poll() is not None:
                raise RuntimeError("matmul-server exited at start")
            time.sleep(0.01)
        with open(port_file) as f:
            cls.port, cls.metrics_port = (int(x) for x in f.read().split())
        shutil.copy(ALERTS, os.path.join(cls.tmp, "alerts.yml"))
        with open(os.path.join(cls.tmp, "prometheus.yml"), "w") as f:
            f.write(f"""
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [alerts.yml]
scrape_configs:
  - job_name: matmul-server
    static_configs:
      - targets: ["127.0.0.1:{cls.metrics_port}"]
""")
        cls.prom_port = free_port()
        cls.prometheus = subprocess.Popen([
            "prometheus", f"--config.file={cls.tmp}/prometheus.yml",
            f"--storage.tsdb.path={cls.tmp}/data", f"--web.listen-address=127.0.0.1:{cls.prom_port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cls.api = f"http://127.0.0.1:{cls.prom_port}/api/v1"
        for _ in range(600):
            try:
                http_get(f"http://127.0.0.1:{cls.prom_port}/-/ready", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        cls.load(seconds=12)

    @classmethod
    def load(cls, seconds):
        """Steady load: good requests from several threads, plus some bad ones."""
        stop = time.time() + seconds
        client = MatmulClient(f"127.0.0.1:{cls.port}", timeout=60)

        def work(seed):
            rng = np.random.default_rng(seed)
            i = 0
            while time.time() < stop:
                a = rng.uniform(-1, 1, (48, 32)).astype(np.float32)
                b = rng.uniform(-1, 1, (32, 40)).astype(np.float32)
                client.matmul(a, b, dtype="bfloat16" if i % 2 else None)
                if i % 10 == 0:
                    try:
                        client.matmul(a, a)  # 48x32 times 48x32: inner dimensions differ.
                    except MatmulError:
                        pass
                i += 1

        threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        client.close()
        time.sleep(3)  # Let the last scrapes land.

    @classmethod
    def tearDownClass(cls):
        cls.prometheus.terminate()
        cls.prometheus.wait(timeout=60)
        cls.server.terminate()
        cls.server.wait(timeout=60)
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def query(self, expr):
        url = f"{self.api}/query?" + urllib.parse.urlencode({"query": expr})
        body = json.loads(http_get(url))
        self.assertEqual(body["status"], "success", f"{expr}: {body}")
        return body["data"]["result"]

    def assert_has_data(self, expr, where):
        result = self.query(expr)
        self.assertTrue(result, f"{where}: no data for {expr}")
        for sample in result:
            value = float(sample["value"][1])
            self.assertFalse(value != value and "histogram_quantile" not in expr,
                             f"{where}: NaN from {expr}")

    def test_p99_latency_is_a_number(self):
        result = self.query("histogram_quantile(0.99, sum by (le) "
                            "(rate(matmul_request_duration_seconds_bucket[1m])))")
        self.assertEqual(len(result), 1)
        p99 = float(result[0]["value"][1])
        self.assertGreater(p99, 0)
        self.assertLess(p99, 60)

    def test_every_dashboard_expression_returns_data(self):
        with open(DASHBOARD) as f:
            dashboard = json.load(f)
        exprs = [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p["targets"]]
        self.assertGreaterEqual(len(exprs), 10)
        for title, expr in exprs:
            with self.subTest(panel=title, expr=expr):
                self.assert_has_data(expr, f"panel {title!r}")

    def test_every_alert_query_returns_data(self):
        with open(ALERTS) as f:
            rules = [r for g in yaml.safe_load(f)["groups"] for r in g["rules"]]
        self.assertGreaterEqual(len(rules), 5)
        for rule in rules:
            # "<query> <op> <threshold>": the query must return data.
            match = re.fullmatch(r"(.*\S)\s*(>=|<=|==|!=|>|<)\s*[-0-9.e]+", rule["expr"].strip(), re.S)
            self.assertIsNotNone(match, f"{rule['alert']}: expected '<query> <op> <number>'")
            with self.subTest(alert=rule["alert"]):
                self.assert_has_data(match.group(1), f"alert {rule['alert']}")

    def test_rules_are_loaded_and_healthy(self):
        body = json.loads(http_get(f"{self.api}/rules"))
        rules = [r for g in body["data"]["groups"] for r in g["rules"]]
        self.assertGreaterEqual(len(rules), 5)
        for r in rules:
            self.assertEqual(r["health"], "ok", r)

    def test_promtool_accepts_the_rules_and_the_metrics(self):
        subprocess.run(["promtool", "check", "rules", ALERTS], check=True, capture_output=True)
        subprocess.run(["promtool", "check", "config", os.path.join(SOURCE, "deploy/prometheus/prometheus.yml")],
                       check=True, capture_output=True)
        metrics = http_get(f"http://127.0.0.1:{self.metrics_port}/metrics")
        lint = subprocess.run(["promtool", "check", "metrics"], input=metrics.encode(),
                              capture_output=True)
        self.assertEqual(lint.returncode, 0, lint.stdout.decode() + lint.stderr.decode())

    def test_batch_metrics_saw_batches(self):
        self.assert_has_data("sum(matmul_batch_size_count) > 0", "batch count")


if __name__ == "__main__":
    unittest.main()
