"""Static checks of the compose stack (no container engine runs here): both
profiles, the GPU reservation, build targets that exist in the Dockerfile,
and bind mounts that point at files in the repository."""

import os
import re
import unittest

import yaml

SOURCE = os.environ["MATMUL_SOURCE_DIR"]
COMPOSE = os.path.join(SOURCE, "deploy/compose/docker-compose.yml")


class ComposeTest(unittest.TestCase):
    def setUp(self):
        with open(COMPOSE) as f:
            self.stack = yaml.safe_load(f)
        self.services = self.stack["services"]
        with open(os.path.join(SOURCE, "Dockerfile")) as f:
            self.targets = set(re.findall(r"^FROM \S+ AS (\S+)", f.read(), re.M))

    def test_gpu_and_cpu_profiles(self):
        gpu, cpu = self.services["matmul-server"], self.services["matmul-server-cpu"]
        self.assertEqual(gpu["profiles"], ["gpu"])
        self.assertEqual(cpu["profiles"], ["cpu"])
        devices = gpu["deploy"]["resources"]["reservations"]["devices"]
        self.assertEqual(devices[0]["driver"], "nvidia")
        self.assertIn("gpu", devices[0]["capabilities"])
        self.assertIn("matmul-server", cpu["networks"]["default"]["aliases"])

    def test_build_targets_exist(self):
        for name, service in self.services.items():
            if "build" in service:
                self.assertIn(service["build"]["target"], self.targets, name)
                context = os.path.normpath(os.path.join(os.path.dirname(COMPOSE), service["build"]["context"]))
                self.assertTrue(os.path.exists(os.path.join(context, "Dockerfile")), name)

    def test_mounts_point_into_the_repository(self):
        for name, service in self.services.items():
            for volume in service.get("volumes", []):
                host = volume.split(":")[0]
                path = os.path.normpath(os.path.join(os.path.dirname(COMPOSE), host))
                self.assertTrue(os.path.exists(path), f"{name}: {host}")
        prometheus = self.services["prometheus"]
        self.assertIn("--config.file=/etc/prometheus/prometheus.yml", prometheus["command"])
        with open(os.path.join(SOURCE, "deploy/prometheus/prometheus.yml")) as f:
            config = yaml.safe_load(f)
        target = config["scrape_configs"][0]["static_configs"][0]["targets"][0]
        self.assertEqual(target, "matmul-server:9090")


if __name__ == "__main__":
    unittest.main()
