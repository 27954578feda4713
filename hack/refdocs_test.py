#!/usr/bin/env python3
"""Tests of hack/refdocs.py and its YAML reader on small made-up inputs
(stdlib unittest; no binary, no cluster)."""

import os
import stat
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import refdocs  # noqa: E402
import refdocs_yaml  # noqa: E402

TOP_HELP = """GPU memory profiling

Usage: memprof <COMMAND>

Cluster commands (also as `kubectl memprof …`):
  top         Profiled jobs by risk
  compare     Two Jobs side by side

Local commands (this machine's GPUs and files):
  profile     Profile this machine's GPUs
  compare     Two Jobs side by side
  help        Print this message or the help of the given subcommand(s)

Options:
  -h, --help     Print help

Examples:
  kubectl memprof top
"""


class CliHelpTest(unittest.TestCase):
    def test_subcommands_come_from_every_heading_once_without_help(self):
        self.assertEqual(refdocs.subcommands(TOP_HELP), ["top", "compare", "profile"])

    def test_a_command_without_subcommands_has_none(self):
        self.assertEqual(refdocs.subcommands("Usage: memprof top\n\nOptions:\n  -A  all namespaces\n"), [])

    def test_the_tree_walks_nested_subcommands_depth_first(self):
        helps = {(): "Commands:\n  policy  Policies\n  top  Top\n",
                 ("policy",): "Commands:\n  explain  Explain\n  help  Help\n",
                 ("policy", "explain"): "Usage: memprof policy explain JOB\n",
                 ("top",): "Usage: memprof top\n"}
        tree = refdocs.command_tree(lambda path: helps[path])
        self.assertEqual([p for p, _ in tree], [(), ("policy",), ("policy", "explain"), ("top",)])
        page = refdocs.cli_page(tree, "memprof", "You want X. Run: Y.")
        self.assertIn("- [`memprof policy explain`](#memprof-policy-explain)", page)
        self.assertIn("## memprof policy explain\n\n```text\nUsage: memprof policy explain JOB\n```", page)

    def test_the_help_does_not_depend_on_the_callers_environment(self):
        # clap prints `[env: NAME=value]` with the value of a variable that is set.
        with tempfile.TemporaryDirectory() as d:
            fake = os.path.join(d, "memprof")
            with open(fake, "w") as f:
                f.write("#!/bin/sh\necho \"[env: MEMPROF_PYTHON=$MEMPROF_PYTHON] $*\"\n")
            os.chmod(fake, stat.S_IRWXU)
            os.environ["MEMPROF_PYTHON"] = "python3.12"
            try:
                out = refdocs.run_help(fake, ["estimate"])
            finally:
                del os.environ["MEMPROF_PYTHON"]
        self.assertEqual(out, "[env: MEMPROF_PYTHON=] estimate --help\n")

    def test_the_binary_page_adds_the_commands_help_hides_and_fails_when_one_is_gone(self):
        with tempfile.TemporaryDirectory() as d:
            fake = os.path.join(d, "memprof")
            with open(fake, "w") as f:
                f.write("#!/bin/sh\ncase \"$1\" in\n--help) printf 'Commands:\\n  top  Top\\n';;\n"
                        "top|crd|agent-schema|install-agent) echo \"Usage: memprof $1\";;\n"
                        "*) echo \"unrecognized subcommand '$1'\" >&2; exit 2;;\nesac\n")
            os.chmod(fake, stat.S_IRWXU)
            page = refdocs.binary_page(d, "memprof")
            for name in ("top", "crd", "agent-schema", "install-agent"):
                self.assertIn("## memprof %s\n\n```text\nUsage: memprof %s\n```" % (name, name), page)
            with open(fake, "w") as f:
                f.write("#!/bin/sh\ncase \"$1\" in\n--help) echo Usage;;\n"
                        "*) echo \"unrecognized subcommand '$1'\" >&2; exit 2;;\nesac\n")
            with self.assertRaisesRegex(refdocs.RefdocsError, "crd --help exited 2: unrecognized subcommand 'crd'"):
                refdocs.binary_page(d, "memprof")

    def test_a_missing_binary_says_to_run_make_docs(self):
        with self.assertRaisesRegex(refdocs.RefdocsError, "make docs"):
            refdocs.run_help("/nonexistent/memprof", [])


class YamlTest(unittest.TestCase):
    def test_the_subset_serde_yaml_writes(self):
        text = ("---\nkind: A\nnames:\n  shortNames:\n  - a\n  - b\nschema:\n"
                "  description: |-\n    first line\n\n    after a blank\n"
                "  keep: |\n    with newline\n"
                "  quoted: 'it''s: fine'\n  dq: \"tab\\tx\"\n  n: 3\n  f: 0.0\n  t: true\n  z: null\n"
                "  empty: []\n  obj: {}\nitems:\n- name: x\n  type: string\n- plain\n---\nkind: B\n")
        self.assertEqual(refdocs_yaml.load_all(text), [
            {"kind": "A", "names": {"shortNames": ["a", "b"]},
             "schema": {"description": "first line\n\nafter a blank", "keep": "with newline\n",
                        "quoted": "it's: fine", "dq": "tab\tx", "n": 3, "f": 0.0, "t": True, "z": None,
                        "empty": [], "obj": {}},
             "items": [{"name": "x", "type": "string"}, "plain"]},
            {"kind": "B"}])

    def test_yaml_outside_the_subset_is_refused_with_its_line(self):
        for text, line in (("a: [1, 2]\n", "line 1"), ("a: 1\n  b: 2\n", "line 2"), ("a: &x 1\n", "line 1")):
            with self.assertRaisesRegex(refdocs_yaml.YamlError, line):
                refdocs_yaml.load_all(text)

    def test_the_committed_crds_read_as_pyyaml_reads_them(self):
        try:
            import yaml
        except ImportError:
            self.skipTest("PyYAML is not installed")
        with open(os.path.join(HERE, "..", "crds", "memprof.yaml"), encoding="utf-8") as f:
            text = f.read()
        self.assertEqual(refdocs_yaml.load_all(text), list(yaml.safe_load_all(text)))


class CrdFieldsTest(unittest.TestCase):
    def test_every_field_nested_and_in_arrays_with_type_bounds_and_required(self):
        schema = {"required": ["ranks"], "properties": {
            "ranks": {"type": "array", "maxItems": 8, "description": "Top ranks.",
                      "items": {"type": "object", "properties": {
                          "pod": {"type": "string", "maxLength": 253, "description": "Its pod | name."}}}},
            "risk": {"type": "string", "enum": ["low", "high"], "nullable": True, "description": "Worst\n risk."},
            "peak": {"type": "integer", "format": "uint64", "minimum": 0.0}}}
        self.assertEqual(refdocs.field_rows(schema, ".status"), [
            (".status.peak", "integer (uint64)", ""),
            (".status.ranks", "[]object, ≤ 8 items, required", "Top ranks."),
            (".status.ranks[].pod", "string, ≤ 253 chars", "Its pod \\| name."),
            (".status.risk", "string, one of `low`, `high`, nullable", "Worst risk.")])


class WireSchemaTest(unittest.TestCase):
    def test_types_link_to_named_types_and_say_null(self):
        self.assertEqual(refdocs.wire_type({"anyOf": [{"$ref": "#/$defs/Host"}, {"type": "null"}]}),
                         "[Host](#host) or null")
        self.assertEqual(refdocs.wire_type({"type": ["integer", "null"], "format": "uint32"}),
                         "integer (uint32) or null")
        self.assertEqual(refdocs.wire_type({"type": "array", "items": {"$ref": "#/$defs/Ack"}}),
                         "array of [Ack](#ack)")

    def test_an_enumeration_lists_its_values(self):
        lines = refdocs.wire_type_section("PushKind", {"description": "Why.", "oneOf": [
            {"const": "sample", "description": "Periodic."}, {"const": "oom", "description": "At an OOM."}]})
        self.assertIn("| `oom` | At an OOM. |", lines)

    def test_rustdoc_links_become_code(self):
        self.assertEqual(refdocs.one_line("must be [`VERSION`](super::VERSION)."), "must be `VERSION`.")


class OpeningTest(unittest.TestCase):
    def test_a_page_that_opens_with_the_task_and_a_command_passes(self):
        page = "# Install\n\nYou want memprof on a cluster. Run:\n\n```sh\nhelm install\n```\n\n## Install\n"
        self.assertEqual(refdocs.opening_problems("docs/install.md", page), [])

    def test_a_page_that_opens_with_the_machinery_is_named(self):
        page = "# Agent\n\nThis page is the contract.\n\n## Transport\n\n`POST /v1/agent`\n"
        self.assertEqual(refdocs.opening_problems("docs/agent.md", page), [
            'docs/agent.md: the first paragraph does not open with "You want" (the reader\'s task)',
            "docs/agent.md: no command (a code span) before the first section"])

    def test_a_page_without_a_title_is_named(self):
        self.assertEqual(refdocs.opening_problems("docs/x.md", "You want"), [
            "docs/x.md: the first line is not the page's `# ` title"])


class WriteTest(unittest.TestCase):
    def test_write_replaces_changed_pages_removes_others_and_then_changes_nothing(self):
        with tempfile.TemporaryDirectory() as root:
            out = os.path.join(root, refdocs.OUT)
            os.makedirs(out)
            for name, text in (("gone.md", "old\n"), ("cli.md", "stale\n")):
                with open(os.path.join(out, name), "w") as f:
                    f.write(text)
            pages = {"cli.md": "new\n", "crds.md": "fields\n"}
            self.assertEqual(refdocs.write(root, pages), ["gone.md", "cli.md", "crds.md"])
            self.assertEqual(sorted(os.listdir(out)), ["cli.md", "crds.md"])
            self.assertEqual(refdocs.write(root, pages), [])


if __name__ == "__main__":
    unittest.main()
