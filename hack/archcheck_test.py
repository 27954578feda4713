#!/usr/bin/env python3
"""Tests of hack/archcheck.py on small made-up crates (stdlib unittest)."""

import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import archcheck  # noqa: E402


def crate(root, files):
    for path, text in files.items():
        p = os.path.join(root, path)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w", encoding="utf-8") as f:
            f.write(text)


class ArchcheckTest(unittest.TestCase):
    def run_on(self, files):
        with tempfile.TemporaryDirectory() as d:
            crate(d, files)
            cwd = os.getcwd()
            os.chdir(d)
            try:
                return archcheck.check()[0]
            finally:
                os.chdir(cwd)

    def test_a_clean_crate_passes(self):
        problems = self.run_on({
            "src/lib.rs": "pub mod a;\npub mod b;\n",
            "src/a/mod.rs": "mod x;\nmod y;\npub use x::X;\npub struct Shared;\n",
            # Children name their parent's items; the parent uses its children.
            "src/a/x.rs": "use super::Shared;\nuse super::y::Y;\npub struct X;\n",
            "src/a/y.rs": "pub struct Y(super::Shared);\n#[cfg(test)]\nmod tests { use super::*; }\n",
            "src/b.rs": "use crate::a::X;\n// crate::b::nothing in a comment\n",
        })
        self.assertEqual(problems, [])

    def test_a_file_cycle_between_siblings_is_reported(self):
        problems = self.run_on({
            "src/lib.rs": "pub mod a;\n",
            "src/a/mod.rs": "mod x;\nmod y;\n",
            "src/a/x.rs": "use super::y::Y;\npub struct X;\n",
            "src/a/y.rs": "pub struct Y;\nfn f() { let _ = crate::a::x::X; }\n",
        })
        self.assertEqual(problems, ["file cycle: src/a/x.rs <-> src/a/y.rs"])

    def test_folders_importing_each_other_are_reported_through_subfolders(self):
        problems = self.run_on({
            "src/lib.rs": "pub mod a;\npub mod b;\n",
            "src/a/mod.rs": "pub mod deep;\npub const A: u8 = 1;\n",
            "src/a/deep/mod.rs": "pub fn f() -> u8 { crate::b::B }\n",
            "src/b/mod.rs": "pub const B: u8 = crate::a::A;\n",
        })
        self.assertIn("folders import each other: src/a/ <-> src/b/", problems)

    def test_a_path_attribute_is_reported_but_not_in_a_comment(self):
        problems = self.run_on({
            "src/lib.rs": "pub mod a;\n",
            "src/a.rs": "// once #[path = \"old.rs\"]\npub fn f() {}\n#[cfg(test)]\n#[path = \"a_tests.rs\"]\nmod tests;\n",
            "src/a_tests.rs": "use super::*;\n",
            "examples/x.rs": "#[path = \"y/setup.rs\"]\nmod setup;\nfn main() {}\n",
        })
        self.assertEqual(len(problems), 2, problems)
        self.assertIn("#[path] in examples/x.rs", problems[0])
        self.assertIn("#[path] in src/a.rs", problems[1])

    def test_a_module_as_a_folder_passes(self):
        problems = self.run_on({
            "src/lib.rs": "pub mod a;\n",
            "src/a.rs": "// was mounted with #[path]\n#[cfg(test)]\nmod tests;\n",
            "src/a/tests.rs": "use super::*;\n",
            "tests/t.rs": "mod t_support;\n",
            "tests/t_support/mod.rs": "pub fn f() {}\n",
        })
        self.assertEqual(problems, [])

    def test_the_old_remediation_cycle_is_no_longer_allowed(self):
        # The one controller dissolved it: the allow-list is empty.
        remediation = "crates/controller/src/remediation"
        files = {
            "crates/controller/src/lib.rs": "pub mod remediation;\n",
            f"{remediation}/mod.rs": "mod controller;\nmod execute;\nmod status;\n",
            f"{remediation}/controller.rs": "use super::execute::E;\npub struct C;\n",
            f"{remediation}/execute.rs": "use super::status::S;\npub struct E;\n",
            f"{remediation}/status.rs": "use super::controller::C;\npub struct S;\n",
        }
        self.assertEqual(len(self.run_on(files)), 1)


def package(name, *deps):
    """A package of `cargo metadata`: deps as (name, kind, features, default features)."""
    return {"name": name, "dependencies": [
        {"name": d[0], "kind": d[1], "features": d[2], "uses_default_features": d[3]}
        for d in deps]}


def workspace(*packages):
    return {"packages": list(packages)}


class CrateLayerTest(unittest.TestCase):
    def test_todays_layering_passes(self):
        problems = archcheck.crate_problems(workspace(
            package("memprof-api", ("kube", None, ["derive"], False), ("tokio", None, ["sync"], False)),
            package("memprof-analysis", ("memprof-api", None, [], True)),
            package("memprof-policy", ("memprof-api", None, [], True),
                    ("memprof-analysis", None, [], True), ("kube", None, [], False)),
            package("memprof-runtime", ("backon", None, [], True)),
            package("memprof-cli", ("memprof-policy", None, [], True), ("hyper", None, ["client"], True),
                    ("memprof-api", "dev", ["test-support"], True)),
            package("memprof-sidecar", ("memprof-runtime", None, [], True)),
            package("memprof", ("memprof-cli", None, [], True), ("memprof-controller", None, [], True)),
            package("serde", ("serde_derive", None, [], True)),
        ))
        self.assertEqual(problems, [])

    def test_a_role_depending_on_another_role_is_refused(self):
        problems = archcheck.crate_problems(workspace(
            package("memprof-cli", ("memprof-controller", None, [], True))))
        self.assertEqual(len(problems), 1)
        self.assertIn("memprof-cli may not depend on memprof-controller", problems[0])

    def test_the_runtime_kit_may_not_depend_on_a_role(self):
        problems = archcheck.crate_problems(workspace(
            package("memprof-runtime", ("memprof-sidecar", None, [], True))))
        self.assertEqual(len(problems), 1)
        self.assertIn("memprof-runtime may not depend on memprof-sidecar", problems[0])

    def test_a_pure_crate_depending_upward_is_refused_even_for_its_tests(self):
        problems = archcheck.crate_problems(workspace(
            package("memprof-analysis", ("memprof-policy", "dev", [], True))))
        self.assertEqual(len(problems), 1)
        self.assertIn("memprof-analysis may not depend on memprof-policy (dev)", problems[0])

    def test_a_crate_without_a_layer_is_refused(self):
        problems = archcheck.crate_problems(workspace(package("memprof-new")))
        self.assertEqual(len(problems), 1)
        self.assertIn("crate memprof-new has no layer", problems[0])

    def test_a_pure_crate_that_talks_to_the_network_is_refused(self):
        cases = [
            (("kube", None, ["derive", "client"], False), "kube features ['client']"),
            (("kube", None, ["derive"], True), "kube features ['default']"),
            (("kube-runtime", None, [], True), "kube-runtime"),
            (("hyper", None, [], True), "hyper"),
            (("rustls", "build", [], False), "rustls"),
            (("tokio", None, ["sync", "net"], False), "tokio features ['net']"),
        ]
        for dep, why in cases:
            problems = archcheck.crate_problems(workspace(package("memprof-policy", dep)))
            self.assertEqual(len(problems), 1, dep)
            self.assertIn(f"pure crate memprof-policy depends on {why}", problems[0])

    def test_analysis_enables_no_feature_of_the_api_crate(self):
        problems = archcheck.crate_problems(workspace(
            package("memprof-analysis", ("memprof-api", None, ["crd"], True)),
            package("memprof-policy", ("memprof-api", None, ["crd"], True))))
        self.assertEqual(len(problems), 1)
        self.assertIn("memprof-analysis uses memprof-api's types only", problems[0])

    def test_tests_of_a_pure_crate_and_role_crates_may_use_the_network(self):
        problems = archcheck.crate_problems(workspace(
            package("memprof-api", ("hyper", "dev", ["client"], True)),
            package("memprof-sidecar", ("kube", None, ["client", "runtime"], True))))
        self.assertEqual(problems, [])


if __name__ == "__main__":
    unittest.main()
