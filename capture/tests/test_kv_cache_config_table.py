"""The shared table of good and bad KV cache configs (tests/data/kv_cache_configs.json) through the
Python reader and the config's JSON schema (docs/kv-cache-config.schema.json); the C++ reader reads
the same table in tests/core/format/tst_kv_cache_config.cpp, so that the two readers and the schema agree."""

import json
import os
import unittest

from kvscope_capture.kv_cache_config import KvCacheConfig

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TABLE = os.path.join(ROOT, "tests", "data", "kv_cache_configs.json")
SCHEMA = os.path.join(ROOT, "docs", "kv-cache-config.schema.json")


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class KvCacheConfigTable(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.table = load(TABLE)

    def test_table_is_well_formed(self):
        names = [entry["name"] for entry in self.table]
        self.assertEqual(len(names), len(set(names)), "entry names must be unique")
        for entry in self.table:
            self.assertEqual(set(entry), {"name", "valid", "schema", "config"}, entry["name"])
            self.assertIsInstance(entry["valid"], bool, entry["name"])
            self.assertIsInstance(entry["schema"], bool, entry["name"])
            # "schema": whether the schema alone refuses it, which it never does for a good one.
            if entry["valid"]:
                self.assertFalse(entry["schema"], entry["name"])
        self.assertGreaterEqual(sum(e["valid"] for e in self.table), 15)
        self.assertGreaterEqual(sum(not e["valid"] for e in self.table), 25)

    def test_python_reader(self):
        for entry in self.table:
            with self.subTest(entry["name"]):
                config = entry["config"]
                if not entry["valid"]:
                    with self.assertRaises(ValueError):
                        KvCacheConfig(config)
                    continue
                cfg = KvCacheConfig(config)
                self.assertEqual(len(cfg.groups), len(config["groups"]))
                for group, listed in zip(cfg.groups, config["groups"]):
                    self.assertEqual(group["layer_names"], listed["layer_names"])
                    if group["compared"]:
                        self.assertEqual(group["block_size"], listed["block_size"])
                        self.assertEqual(group["head_size"], listed["head_size"])
                self.assertEqual(cfg.num_blocks, config["num_blocks"])
                self.assertEqual(cfg.tp_size, config["tp_size"])
                self.assertEqual(cfg.dcp_size, config.get("dcp_size") or 1)

    def test_schema(self):
        # CI installs jsonschema (packaging/setup-debian.sh): without it this fails, never skips.
        try:
            import jsonschema
        except ImportError as e:
            self.fail(f"the schema check needs the jsonschema package (Debian: python3-jsonschema): {e}")
        schema = load(SCHEMA)
        jsonschema.Draft202012Validator.check_schema(schema)
        validator = jsonschema.Draft202012Validator(schema)
        for entry in self.table:
            with self.subTest(entry["name"]):
                errors = [e.message for e in validator.iter_errors(entry["config"])]
                if entry["valid"] or not entry["schema"]:
                    # Good configs pass; bad ones marked "schema": false are what only the readers catch.
                    self.assertEqual(errors, [], "the schema refuses it")
                else:
                    self.assertNotEqual(errors, [], "the schema accepts it")


if __name__ == "__main__":
    unittest.main()
