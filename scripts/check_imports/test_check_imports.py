"""Unit tests of scripts/check-imports, over small workspaces written to a temporary folder.
Run by `scripts/check-imports --self-test` (and so by `cargo test -p tools`)."""

import contextlib
import importlib.util
import io
import os
import tempfile
import textwrap
import unittest
from importlib.machinery import SourceFileLoader

from . import graph, rust
from . import workspace as cargo_workspace

_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "check-imports")
_loader = SourceFileLoader("check_imports_cli", _SCRIPT)
_spec = importlib.util.spec_from_loader("check_imports_cli", _loader)
cli = importlib.util.module_from_spec(_spec)
_loader.exec_module(cli)


class Workspace:
    """A workspace in a temporary folder: `files` maps paths to Rust source (dedented)."""

    def __init__(self, files, members=("app",)):
        self.dir = tempfile.TemporaryDirectory()
        self.root = self.dir.name
        quoted = ", ".join(f'"{m}"' for m in members)
        self.write("Cargo.toml", f"[workspace]\nmembers = [{quoted}]\n")
        for m in members:
            self.write(f"{m}/Cargo.toml", f'[package]\nname = "{m}"\nversion = "0.1.0"\n')
        for path, text in files.items():
            self.write(path, textwrap.dedent(text))

    def write(self, path, text):
        full = os.path.join(self.root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(text)

    def run(self, *args):
        """(exit code, stdout, stderr) of the script's main."""
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(["--root", self.root, *args])
        return code, out.getvalue(), err.getvalue()

    def circles(self):
        """The circle lines printed (without the indented reasons)."""
        code, out, _ = self.run()
        lines = [l for l in out.splitlines() if not l.startswith("  ")]
        self.assert_code(code, lines)
        return lines

    def assert_code(self, code, lines):
        assert code == (1 if lines else 0), (code, lines)

    def edges(self, member="app"):
        """{(from, to)} of every target of a member."""
        package = cargo_workspace.Package(member, os.path.join(self.root, member))
        parser = rust.Parser(package.path)
        found = set()
        for root_file in cargo_workspace.target_roots(package):
            found.update(graph.target_edges(parser.load_target(package, root_file)))
        return found

    def close(self):
        self.dir.cleanup()


def workspace(test, files, **kw):
    ws = Workspace(files, **kw)
    test.addCleanup(ws.close)
    return ws


class LexerTests(unittest.TestCase):
    def test_comments_strings_chars_and_lifetimes_name_no_path(self):
        toks = [t for t, _ in rust.lex(r'''
            // crate::a::X
            /* crate::b::Y /* nested */ crate::c::Z */
            let s = "crate::d::W \" crate::e::V";
            let r = r#"crate::f::U "# ;
            let c = '\''; let q = '"'; let u = '\u{1F600}';
            fn f<'a>(x: &'a str) -> &'a str { x }
            crate::g::T
        ''')]
        joined = " ".join(toks)
        for name in "XYZWVU":
            self.assertNotIn(f":: {name}", joined)
        self.assertIn("crate :: g :: T", joined)

    def test_lines_are_counted_through_comments_and_strings(self):
        toks = rust.lex('/* a\nb */ "x\ny"\nr"p\nq" z')
        self.assertEqual(toks[-1], ("z", 5))


class GraphTests(unittest.TestCase):
    def test_two_siblings_that_import_each_other_are_a_circle(self):
        ws = workspace(self, {
            "app/src/lib.rs": "mod request;\nmod validation;\n",
            "app/src/request.rs": "use crate::validation::check;\npub struct Request;\n",
            "app/src/validation.rs": "use crate::request::Request;\npub fn check() {}\n",
        })
        code, out, err = ws.run()
        self.assertEqual(code, 1)
        self.assertEqual(out.splitlines(), [
            "app: src/request.rs -> src/validation.rs -> src/request.rs",
            "  src/request.rs:1 crate::validation::check (src/validation.rs)",
            "  src/validation.rs:1 crate::request::Request (src/request.rs)",
        ])
        self.assertIn("1 import circle(s)", err)

    def test_no_circle_exits_zero(self):
        ws = workspace(self, {
            "app/src/lib.rs": "mod a;\nmod b;\n",
            "app/src/a.rs": "use crate::b::B;\npub struct A(B);\n",
            "app/src/b.rs": "pub struct B;\n",
        })
        self.assertEqual(ws.run()[0], 0)
        self.assertEqual(ws.edges(), {("src/a.rs", "src/b.rs")})

    def test_mod_declarations_are_not_edges(self):
        ws = workspace(self, {
            "app/src/lib.rs": "pub mod a;\n",
            "app/src/a/mod.rs": "mod b;\npub struct A;\n",
            "app/src/a/b.rs": "use super::A;\n",
        })
        self.assertEqual(ws.edges(), {("src/a/b.rs", "src/a/mod.rs")})
        self.assertEqual(ws.circles(), [])

    def test_a_facade_reexport_leads_to_the_child_that_defines_the_item(self):
        ws = workspace(self, {
            "app/src/lib.rs": "mod shapes;\nmod user;\npub use shapes::Square;\n",
            "app/src/shapes/mod.rs": "mod square;\npub use square::Square;\npub use self::square::*;\n",
            "app/src/shapes/square.rs": "use crate::user::helper;\npub struct Square;\n",
            "app/src/user.rs": "use crate::Square;\npub fn helper() {}\n",
        })
        self.assertEqual(ws.edges(), {("src/shapes/square.rs", "src/user.rs"),
                                      ("src/user.rs", "src/shapes/square.rs")})
        self.assertEqual(ws.circles(), ["app: src/shapes/square.rs -> src/user.rs -> src/shapes/square.rs"])

    def test_a_child_using_its_parent_while_the_parent_uses_the_child_is_a_circle(self):
        ws = workspace(self, {
            "app/src/lib.rs": "mod attention;\n",
            "app/src/attention/mod.rs": """
                mod split;
                pub struct Options;
                pub fn run(o: &Options) { split::go(o) }
            """,
            "app/src/attention/split.rs": "use super::Options;\npub fn go(_: &Options) {}\n",
        })
        self.assertEqual(ws.circles(), [
            "app: src/attention/mod.rs -> src/attention/split.rs -> src/attention/mod.rs"])

    def test_a_reexport_its_own_file_uses_is_an_edge_an_unused_one_is_not(self):
        files = {
            "app/src/lib.rs": "mod m;\n",
            "app/src/m/mod.rs": "mod child;\npub use child::go;\npub struct Options;\n",
            "app/src/m/child.rs": "use super::Options;\npub fn go(_: Options) {}\n",
        }
        self.assertEqual(workspace(self, files).circles(), [])
        files["app/src/m/mod.rs"] += "pub fn run() { go(Options) }\n"
        self.assertEqual(len(workspace(self, files).circles()), 1)

    def test_test_code_is_left_out(self):
        ws = workspace(self, {
            "app/src/lib.rs": "mod a;\nmod b;\n",
            "app/src/a.rs": """
                use crate::b::B;
                pub struct A(B);
                #[cfg(test)]
                mod tests;
                #[cfg(test)]
                mod more_tests { use crate::b::*; }
                mod tests { use crate::b::B; }
                #[cfg(test)]
                use crate::b::Other;
                #[cfg(test)]
                fn helper() { crate::b::f() }
                #[cfg(all(test, target_arch = "x86_64"))]
                fn x86_helper() { crate::b::f() }
                impl A {
                    #[cfg(test)]
                    fn method() { crate::b::f() }
                }
                #[cfg(any(test, feature = "testing"))]
                pub fn also_in_builds(_: A) {}
            """,
            "app/src/a/tests.rs": "use crate::b::B;\n",
            "app/src/b.rs": """
                pub struct B;
                pub fn f() {}
                #[cfg(test)]
                mod tests {
                    use super::*;
                    use crate::a::A;
                }
                #[cfg(test)]
                #[path = "b_tests.rs"]
                mod b_tests;
            """,
            "app/src/b_tests.rs": "use crate::a::A;\n",
        })
        self.assertEqual(ws.edges(), {("src/a.rs", "src/b.rs")})

    def test_use_trees_with_braces_self_renames_and_globs(self):
        ws = workspace(self, {
            "app/src/lib.rs": "mod a;\nmod b;\nmod c;\nmod d;\nmod e;\n",
            "app/src/a.rs": """
                use crate::{b::{self, B as Bee}, c::*, d::{D}};
                use crate::e::{self as ee};
                pub fn f(_: Bee, _: C) { b::g(); ee::h(); }
            """,
            "app/src/b.rs": "pub struct B;\npub fn g() {}\n",
            "app/src/c.rs": "pub struct C;\npub struct Unused;\n",
            "app/src/d.rs": "pub struct D;\n",
            "app/src/e.rs": "pub fn h() {}\n",
        })
        self.assertEqual(ws.edges(), {("src/a.rs", f"src/{x}.rs") for x in "bcde"})

    def test_a_glob_is_an_edge_only_through_the_names_the_file_uses(self):
        files = {
            "app/src/lib.rs": "mod a;\nmod b;\n",
            "app/src/a.rs": "use crate::b::B;\npub struct A;\n",
            "app/src/b.rs": "use crate::a::*;\npub struct B;\n",
        }
        self.assertEqual(workspace(self, files).circles(), [])
        files["app/src/b.rs"] += "pub fn f(_: A) {}\n"
        self.assertEqual(workspace(self, files).circles(), ["app: src/a.rs -> src/b.rs -> src/a.rs"])

    def test_globs_that_lead_back_resolve_to_the_definition(self):
        ws = workspace(self, {
            "app/src/lib.rs": "mod a;\nmod b;\nuse a::*;\nuse b::*;\nfn f() { from_b() }\n",
            "app/src/a.rs": "use super::*;\npub fn from_a() {}\n",
            "app/src/b.rs": "use super::*;\npub fn from_b() {}\n",
        })
        self.assertEqual(ws.edges(), {("src/lib.rs", "src/b.rs")})

    def test_qualified_paths_in_code(self):
        ws = workspace(self, {
            "app/src/lib.rs": "mod a;\nmod b;\nmod c;\nmod d;\n",
            "app/src/a.rs": """
                mod inner;
                use super::d;
                pub fn f() -> crate::b::B {
                    let _ = self::inner::x();
                    let _ = inner::y();
                    let _ = <crate::c::C as Default>::default();
                    d::g();
                    std::process::exit(0);
                    Self::nothing; T::also_nothing;
                    crate::b::B
                }
            """,
            "app/src/a/inner.rs": "pub fn x() {}\npub fn y() { super::super::d::g() }\n",
            "app/src/b.rs": "pub struct B;\n",
            "app/src/c.rs": "#[derive(Default)]\npub struct C;\n",
            "app/src/d.rs": "pub fn g() {}\n",
        })
        self.assertEqual(ws.edges(), {
            ("src/a.rs", "src/a/inner.rs"), ("src/a.rs", "src/b.rs"), ("src/a.rs", "src/c.rs"),
            ("src/a.rs", "src/d.rs"), ("src/a/inner.rs", "src/d.rs")})

    def test_other_crates_and_std_are_not_edges(self):
        ws = workspace(self, {
            "app/src/lib.rs": "mod a;\n",
            "app/src/a.rs": """
                use std::fmt;
                use serde::Serialize;
                use ::other::Thing;
                pub fn f(_: &dyn fmt::Display) { fmt::Write::write_str; serde::de::x(); }
            """,
        })
        self.assertEqual(ws.edges(), set())

    def test_inline_modules_belong_to_their_file(self):
        ws = workspace(self, {
            "app/src/lib.rs": "mod a;\nmod b;\n",
            "app/src/a.rs": "pub mod inner { pub struct X; }\n",
            "app/src/b.rs": "mod local { use crate::a::inner::X; pub fn f(_: X) {} }\n",
        })
        self.assertEqual(ws.edges(), {("src/b.rs", "src/a.rs")})

    def test_an_unknown_name_resolves_to_the_deepest_module_with_a_file(self):
        ws = workspace(self, {
            "app/src/lib.rs": "mod a;\nmod b;\n",
            "app/src/a/mod.rs": "mod inner;\n",
            "app/src/a/inner.rs": "generated!();\n",
            "app/src/b.rs": "fn f() { crate::a::inner::made_by_a_macro(); }\n",
        })
        self.assertEqual(ws.edges(), {("src/b.rs", "src/a/inner.rs")})

    def test_a_function_named_like_its_module(self):
        ws = workspace(self, {
            "app/src/lib.rs": "mod a;\nmod user;\n",
            "app/src/a/mod.rs": "mod attend;\npub use attend::attend;\n",
            "app/src/a/attend.rs": "pub fn attend() {}\n",
            "app/src/user.rs": "use crate::a::attend;\nfn f() { attend() }\n",
        })
        self.assertEqual(ws.edges(), {("src/user.rs", "src/a/attend.rs")})

    def test_path_attributes_and_test_targets(self):
        ws = workspace(self, {
            "app/src/lib.rs": "pub struct L;\n",
            "app/tests/gpu.rs": """
                #[path = "gpu/formats.rs"]
                mod formats;
                pub struct G;
                fn t() { formats::f() }
            """,
            "app/tests/gpu/formats.rs": "use super::G;\npub fn f() {}\n",
            "app/tests/common/mod.rs": "pub fn c() {}\n",
        })
        self.assertEqual(ws.circles(), ["app: tests/gpu.rs -> tests/gpu/formats.rs -> tests/gpu.rs"])

    def test_each_file_of_a_knot_is_on_a_printed_circle(self):
        ws = workspace(self, {
            "app/src/lib.rs": "mod a;\nmod b;\nmod c;\nmod d;\n",
            "app/src/a.rs": "use crate::b::B;\npub struct A;\n",
            "app/src/b.rs": "use crate::c::C;\nuse crate::a::A;\npub struct B;\n",
            "app/src/c.rs": "use crate::d::D;\npub struct C;\n",
            "app/src/d.rs": "use crate::b::B;\npub struct D;\n",
        })
        self.assertEqual(ws.circles(), [
            "app: src/a.rs -> src/b.rs -> src/a.rs",
            "app: src/b.rs -> src/c.rs -> src/d.rs -> src/b.rs",
        ])

    def test_each_member_is_labelled_and_a_binary_is_its_own_graph(self):
        ws = workspace(self, {
            "one/src/lib.rs": "mod a;\nmod b;\n",
            "one/src/a.rs": "use crate::b::B;\npub struct A;\n",
            "one/src/b.rs": "use crate::a::A;\npub struct B;\n",
            "two/src/main.rs": "mod x;\nuse two::Y;\npub struct M;\n",
            "two/src/x.rs": "use crate::M;\n",
            "two/src/lib.rs": "mod x2;\npub struct Y;\n",
            "two/src/x2.rs": "use crate::Y;\n",
        }, members=("one", "two"))
        self.assertEqual(ws.circles(), ["one: src/a.rs -> src/b.rs -> src/a.rs"])


class ErrorTests(unittest.TestCase):
    def test_a_missing_module_file_is_an_error(self):
        ws = workspace(self, {"app/src/lib.rs": "mod gone;\n#[cfg(feature = \"x\")]\nmod optional;\n"})
        code, _, err = ws.run()
        self.assertEqual(code, 2)
        self.assertIn("src/gone.rs: file of `mod gone` not found", err)
        self.assertNotIn("optional", err)

    def test_no_workspace_is_an_error(self):
        with tempfile.TemporaryDirectory() as d:
            with contextlib.redirect_stderr(io.StringIO()):
                self.assertEqual(cli.main(["--root", d]), 2)

    def test_test_only_attributes(self):
        self.assertTrue(rust.test_only("cfg(test)"))
        self.assertTrue(rust.test_only('cfg(all(test,target_arch="x86_64"))'))
        self.assertFalse(rust.test_only('cfg(any(test,feature="x"))'))
        self.assertFalse(rust.test_only('cfg(all(not(test),unix))'))

    def test_an_internal_error_is_exit_2_not_a_circle(self):
        def broken(root):
            raise IndexError("a bug")

        real = cli.check_workspace
        cli.check_workspace = broken
        try:
            with contextlib.redirect_stderr(io.StringIO()) as err:
                self.assertEqual(cli.main(["--root", "."]), 2)
        finally:
            cli.check_workspace = real
        self.assertIn("internal error", err.getvalue())

    def test_an_unknown_argument_is_an_error(self):
        with contextlib.redirect_stderr(io.StringIO()):
            self.assertEqual(cli.main(["--nonsense"]), 2)


if __name__ == "__main__":
    unittest.main()
