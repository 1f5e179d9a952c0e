#!/usr/bin/python3
"""The ABI check itself (tools/sdk/abi.py check) catches what it must: against copies of the
list in the tree, each edited as an older or newer release's list would differ, it reports a
break (exit 1) or an addition (exit 2) naming the fact, and it rejects a library that exports a
symbol outside braid_* (a backend module stands in for such a library).
    abi_check_test.py <abi.py> <capi/abi/libbraid.so.N.abi> <abi_layout> <libbraid.so.N> <module>
"""

import os
import subprocess
import sys
import tempfile
import unittest

ABI_PY, ABI_LIST, LAYOUT, LIB, MODULE = sys.argv[1:6]
del sys.argv[1:6]


def check(lines, lib=LIB):
    """(exit code, stderr) of abi.py check with `lines` as the reference list."""
    with tempfile.NamedTemporaryFile("w", suffix=".abi", delete=False) as f:
        f.write("\n".join(lines) + "\n")
    try:
        r = subprocess.run([sys.executable, ABI_PY, "check", "--abi", f.name, "--layout", LAYOUT,
                            lib], capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    return r.returncode, r.stderr


def edited(old, new):
    """The list with the one line `old` replaced by `new` (None: dropped)."""
    lines = open(ABI_LIST).read().splitlines()
    assert old in lines, "the list has no line %r" % old
    return [(new if l == old else l) for l in lines if not (l == old and new is None)]


class AbiCheckTest(unittest.TestCase):
    def assertBreak(self, lines, *words):
        code, err = check(lines)
        self.assertEqual(code, 1, err)
        for w in words:
            self.assertIn(w, err)

    def assertAddition(self, lines, *words):
        code, err = check(lines)
        self.assertEqual(code, 2, err)
        self.assertIn("tools/bazelw run //capi:abi_update", err)
        for w in words:
            self.assertIn(w, err)

    def line(self, prefix):
        """The one line of the list that starts with `prefix`."""
        found = [l for l in open(ABI_LIST).read().splitlines() if l.startswith(prefix)]
        self.assertEqual(len(found), 1, prefix)
        return found[0]

    def test_the_list_matches_this_build(self):
        code, err = check(open(ABI_LIST).read().splitlines())
        self.assertEqual(code, 0, err)

    def test_a_symbol_the_release_had_is_gone(self):
        lines = open(ABI_LIST).read().splitlines() + ["libbraid symbol braid_retired_call"]
        self.assertBreak(lines, "removed: libbraid symbol braid_retired_call",
                         "bump BRAID_ABI_VERSION")

    def test_a_new_function_is_an_addition(self):
        self.assertAddition(edited("libbraid symbol braid_allreduce", None),
                            "added: libbraid symbol braid_allreduce")

    def test_a_changed_signature_is_a_break(self):
        old = self.line("braid.h function braid_work_wait ")
        self.assertBreak(edited(old, "braid.h function braid_work_wait braid_status "
                                "(braid_work*, int)"), "changed: braid.h function braid_work_wait")

    def test_a_field_moved_or_retyped_is_a_break(self):
        old = self.line("braid.h field braid_param_t.count ")
        self.assertBreak(edited(old, old.replace("type unsigned long", "type int")),
                         "braid_param_t.count")

    def test_a_fixed_struct_that_grew_is_a_break(self):
        old = self.line("braid.h struct braid_param_t ")
        size = int(old.split()[4])
        self.assertBreak(edited(old, old.replace("size %d" % size, "size %d" % (size - 8))),
                         "changed: braid.h struct braid_param_t")

    def test_an_option_struct_that_grew_at_its_end_is_an_addition(self):
        # An older release's list: braid_world_options_t without its last field.
        last = max((l for l in open(ABI_LIST).read().splitlines()
                    if l.startswith("braid.h field braid_world_options_t.")),
                   key=lambda l: int(l.split()[4]))
        struct = self.line("braid.h struct braid_world_options_t ")
        offset = int(last.split()[4])
        older = edited(struct, struct.replace(struct.split()[4], str(offset)))
        older.remove(last)
        self.assertAddition(older, "grew: braid.h struct braid_world_options_t",
                            "added: " + " ".join(last.split()[:3]))

    def test_an_option_struct_that_shrank_is_a_break(self):
        old = self.line("braid.h struct braid_reducer_options_t ")
        size = int(old.split()[4])
        self.assertBreak(edited(old, old.replace("size %d" % size, "size %d" % (size + 8))),
                         "changed: braid.h struct braid_reducer_options_t")

    def test_an_enumerator_renumbered_is_a_break(self):
        self.assertBreak(edited("braid.h enum BRAID_TIMEOUT 6", "braid.h enum BRAID_TIMEOUT 7"),
                         "BRAID_TIMEOUT")

    def test_a_plugin_struct_change_says_add_a_new_version(self):
        old = self.line("braid_backend_v1.h struct braid_backend_v1 ")
        size = int(old.split()[4])
        self.assertBreak(edited(old, old.replace("size %d" % size, "size %d" % (size - 8))),
                         "braid_backend_v2")

    def test_the_parts_of_braid_h_count_as_braid_h(self):
        # braid.h includes braid_world.h, braid_reducer.h and braid_optimizer.h; abi.py reads
        # them through it, so their facts are braid.h's (a declaration moved between parts is
        # no change) and none is missed (one the dumper did not see would read as removed).
        lines = subprocess.run([LAYOUT], check=True, capture_output=True,
                               text=True).stdout.splitlines()
        for function in ("braid_version", "braid_world_create", "braid_reducer_create",
                         "braid_optimizer_create", "braid_unit_enter"):
            self.assertTrue(any(l.startswith("braid.h function %s " % function) for l in lines),
                            function)
        self.assertEqual([l for l in lines if l.split(" ")[0] not in
                          ("braid.h", "braid_backend_v1.h")], [])

    def test_a_library_exporting_other_symbols_is_rejected(self):
        code, err = check(open(ABI_LIST).read().splitlines(), lib=MODULE)
        self.assertEqual(code, 1, err)
        self.assertIn("exports braidBackendModule_v1, outside the C API", err)
        self.assertIn("does not export braid_allreduce", err)


if __name__ == "__main__":
    unittest.main()
