"""Stand-in for the `expecttest` package (PyPI only; no Debian package), which torch 1.13's
torch/testing/_internal/common_utils.py imports for its TestCase base class and ACCEPT flag.
ddp_rank.py puts this folder on sys.path only when the real package is missing. The DDP tests
use no expect-file assertion (assertExpectedInline), so a plain unittest.TestCase base is all
they need; one that did would fail with AttributeError, not pass silently."""

import unittest

ACCEPT = False


class TestCase(unittest.TestCase):
    """expecttest.TestCase without the expect-file assertions."""

