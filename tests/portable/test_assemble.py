"""Unit tests of scripts/assemble_portable.py on small hand-written sources.

    /usr/bin/python3 -m unittest -v tests/portable/test_assemble.py
(tests/portable/assembly.sh runs them, then checks the committed files.)
"""

import importlib.util
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
_spec = importlib.util.spec_from_file_location("assemble_portable", ROOT / "scripts/assemble_portable.py")
ap = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ap)

SHARED = """-- A file header, not a statement's comment.

-- The table.
CREATE TABLE s.t (a int);

CREATE FUNCTION s.f() RETURNS int
LANGUAGE plpgsql
AS $$
BEGIN
    RETURN 1;
END
$$;
-- Right above it.
SELECT pg_catalog.pg_extension_config_dump('s.t', '');
"""


OWN = "-- own\nCREATE FUNCTION s.g() RETURNS int LANGUAGE sql AS $$ SELECT 2 $$;\n"


def files(**extra):
    found = {"shared.sql": SHARED, "own.sql": OWN}
    found.update(extra)
    return found.__getitem__


def assemble(template, read=None, release_text=None):
    return ap.assemble(template, "9.9.9", read or files(), ["shared.sql"], release_text)


COMPLETE = """-- release {{version}}
--@ statement shared.sql: CREATE TABLE s.t
--@ -- a note: not copied
--@ include own.sql
--@ commented-statement shared.sql: CREATE FUNCTION s.f()
--@ native-only shared.sql: SELECT pg_catalog.pg_extension_config_dump('s.t'
"""


class SplitStatements(unittest.TestCase):
    def test_a_dollar_quoted_body_is_one_statement(self):
        statements = ap.split_statements(SHARED)
        self.assertEqual([s.first_line for s in statements],
                         ["CREATE TABLE s.t (a int);", "CREATE FUNCTION s.f() RETURNS int",
                          "SELECT pg_catalog.pg_extension_config_dump('s.t', '');"])
        self.assertTrue(statements[1].text.endswith("END\n$$;\n"))

    def test_the_comment_is_the_lines_right_above(self):
        statements = ap.split_statements(SHARED)
        self.assertEqual(statements[0].comment, "-- The table.\n")
        self.assertEqual(statements[1].comment, "")
        self.assertEqual(statements[2].comment, "-- Right above it.\n")

    def test_an_unterminated_statement_is_an_error(self):
        with self.assertRaisesRegex(ap.AssemblyError, "unterminated statement: CREATE TABLE x"):
            ap.split_statements("CREATE TABLE x (a int)\n")


class Assemble(unittest.TestCase):
    def test_every_directive(self):
        self.assertEqual(assemble(COMPLETE),
                         "-- release 9.9.9\nCREATE TABLE s.t (a int);\n-- own\n"
                         "CREATE FUNCTION s.g() RETURNS int LANGUAGE sql AS $$ SELECT 2 $$;\n"
                         + SHARED[SHARED.index("CREATE FUNCTION s.f()"):SHARED.index("-- Right above")])

    def test_replace_with_edits_the_statement_above(self):
        edit = "--@ replace: (a int)\n--@ with: (a bigint)\n"
        got = assemble(COMPLETE.replace("--@ -- a note: not copied\n", edit))
        self.assertIn("CREATE TABLE s.t (a bigint);\n", got)

    def test_replace_must_match_once(self):
        with self.assertRaisesRegex(ap.AssemblyError, r"line 3: '\(b int\)' occurs 0 times"):
            assemble(COMPLETE.replace("--@ -- a note: not copied\n", "--@ replace: (b int)\n--@ with: x\n"))
        with self.assertRaisesRegex(ap.AssemblyError, "'RETURN 1' occurs 2 times"):
            edit = "CREATE FUNCTION s.f()\n--@ replace: RETURN 1\n--@ with: x\n"
            twice = SHARED.replace("RETURN 1;", "RETURN 1; -- RETURN 1")
            assemble(COMPLETE.replace("CREATE FUNCTION s.f()\n", edit), read=files(**{"shared.sql": twice}))

    def test_replace_needs_with_and_a_statement(self):
        with self.assertRaisesRegex(ap.AssemblyError, "line 4: 'replace:' without 'with:'"):
            assemble(COMPLETE.replace("--@ -- a note: not copied\n", "--@ replace: (a int)\n"))
        with self.assertRaisesRegex(ap.AssemblyError, "line 2: 'replace:' must follow a statement"):
            assemble("-- x\n--@ replace: x\n--@ with: y\n" + COMPLETE)

    def test_a_statement_left_out_is_an_error(self):
        with self.assertRaisesRegex(ap.AssemblyError, "names neither.*\n  shared.sql: SELECT pg_catalog"):
            assemble("\n".join(COMPLETE.splitlines()[:-1]) + "\n")

    def test_a_statement_named_twice_is_an_error(self):
        named_twice = "line 7: shared.sql: 'CREATE TABLE s.t' is already named at line 2"
        with self.assertRaisesRegex(ap.AssemblyError, named_twice):
            assemble(COMPLETE + "--@ statement shared.sql: CREATE TABLE s.t\n")

    def test_start_must_name_exactly_one_statement(self):
        with self.assertRaisesRegex(ap.AssemblyError, "line 7: 2 statements start with 'CREATE'"):
            assemble(COMPLETE + "--@ statement shared.sql: CREATE\n")
        with self.assertRaisesRegex(ap.AssemblyError, "line 7: 0 statements start with 'DROP'"):
            assemble(COMPLETE + "--@ native-only shared.sql: DROP\n")

    def test_only_shared_ddl_files(self):
        with self.assertRaisesRegex(ap.AssemblyError, "line 7: own.sql is not a shared DDL file"):
            assemble(COMPLETE + "--@ statement own.sql: CREATE FUNCTION s.g()\n")

    def test_an_included_file_has_no_version_mark(self):
        with self.assertRaisesRegex(ap.AssemblyError, "line 4: own.sql holds {{version}}"):
            assemble(COMPLETE, read=files(**{"own.sql": "SELECT '{{version}}';\n"}))

    def test_unknown_directive(self):
        with self.assertRaisesRegex(ap.AssemblyError, "line 7: unknown directive 'inclde'"):
            assemble(COMPLETE + "--@ inclde own.sql\n")

    def test_release_is_for_the_pgtle_template(self):
        self.assertEqual(assemble("x {{version}}\n--@ release\ny\n", release_text="R\n"), "x 9.9.9\nR\ny\n")
        with self.assertRaisesRegex(ap.AssemblyError, "'release' is for the pgtle.sql template"):
            assemble(COMPLETE + "--@ release\n")


class Repository(unittest.TestCase):
    def test_the_shared_ddl_is_what_the_native_build_reads(self):
        self.assertEqual(ap.shared_ddl_files(),
                         ["sql/bootstrap.sql", "sql/citus.sql", "sql/finalize.sql", "sql/partitions.sql",
                          "sql/send.sql"])

    def test_the_version_is_cargo_tomls(self):
        cargo = (ROOT / "Cargo.toml").read_text()
        self.assertIn(f'\nversion = "{ap.cargo_version()}"\n', cargo)


if __name__ == "__main__":
    unittest.main()
