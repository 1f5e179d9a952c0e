"""braid's modules import each other one way: no cycle among the package's own imports, lazy
(inside a function) ones included, so each module can be read knowing only those below it."""

import ast
import os
import unittest

import braid

PACKAGE = os.path.dirname(braid.__file__)


def _edges():
    """module -> the package modules it imports (at any depth of its code)."""
    edges = {}
    for name in sorted(os.listdir(PACKAGE)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(PACKAGE, name)) as f:
            tree = ast.parse(f.read())
        out = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                out.update([node.module.split(".")[0]] if node.module else
                           [a.name for a in node.names])
        edges[name[:-3]] = out
    return edges


class ImportGraphTest(unittest.TestCase):
    def test_no_cycle(self):
        edges, cycles = _edges(), []
        self.assertIn("core", edges["pytorch"])  # the graph is read at all
        for start in edges:
            stack = [(start, [start])]
            while stack:
                node, path = stack.pop()
                for nxt in edges.get(node, ()):
                    if nxt == start:
                        cycles.append(" -> ".join(path + [start]))
                    elif nxt not in path and nxt in edges:
                        stack.append((nxt, path + [nxt]))
        self.assertEqual(cycles, [], "imports in a circle")


if __name__ == "__main__":
    unittest.main()
