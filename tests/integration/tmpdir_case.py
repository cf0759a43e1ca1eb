"""The test case the integration tests share: a temporary directory per test, and JSON (or
text) files written into it."""
import json
import os
import tempfile
import unittest


class TempDirCase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, name, doc):
        """Writes `doc` (a string as it is, anything else as JSON) to dir/name; returns the path."""
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(doc if isinstance(doc, str) else json.dumps(doc))
        return path
