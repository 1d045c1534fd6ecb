"""Unit tests of docsql.py (run by tests/docs/run.py, or: python3 -m unittest discover tests/docs)."""
import unittest

import docsql

PAGE = """Intro.

```sql
CREATE TABLE t (a int);     -- a trailing comment
-- prose above a statement
SELECT 1 AS one,
       'x;y -- not a comment' AS two;
--  one | two
-- -----+-----
--    1 | x;y -- not a comment

SELECT 2;

-- prose after a blank line: not output
SELECT token FROM t \\gset
\\echo :token
-- 6f1c0a4e-3b8e-4c55-9d0e-0d6f3a1e2b77
DO $$ BEGIN
  PERFORM 1;
END $$;
```

```sh
echo not sql;
```
"""


class Parse(unittest.TestCase):
    def test_blocks_and_statements(self):
        blocks = docsql.sql_blocks(PAGE)
        self.assertEqual(len(blocks), 1)
        self.assertEqual(blocks[0].line, 4)
        stmts = docsql.statements(blocks[0])
        self.assertEqual([s.line for s in stmts], [4, 6, 12, 15, 16, 18])
        self.assertEqual(stmts[1].expected, ["  one | two", " -----+-----", "    1 | x;y -- not a comment"])
        self.assertEqual(stmts[2].expected, [])
        self.assertEqual(stmts[4].expected, [" 6f1c0a4e-3b8e-4c55-9d0e-0d6f3a1e2b77"])
        self.assertTrue(stmts[4].meta_only)
        self.assertFalse(stmts[3].meta_only)
        self.assertEqual(stmts[5].sql.count("\n"), 2)

    def test_unterminated_statement_is_kept(self):
        stmts = docsql.statements(docsql.Block(1, "SELECT 1"))
        self.assertEqual(len(stmts), 1)


class Match(unittest.TestCase):
    ACTUAL = [" outcome |                token", "---------+--------------------------------------",
              " claimed | 0b7e1d0c-9f0a-4b55-8a77-2c1f3a1e2b11"]

    def test_header_optional(self):
        self.assertTrue(docsql.matches([" claimed | 6f1c0a4e-3b8e-4c55-9d0e-0d6f3a1e2b77"], self.ACTUAL))
        self.assertTrue(docsql.matches([" outcome | token", "---+---",
                                        " claimed | 6f1c0a4e-3b8e-4c55-9d0e-0d6f3a1e2b77"], self.ACTUAL))

    def test_differences_are_caught(self):
        self.assertFalse(docsql.matches([" in_progress | 6f1c0a4e-3b8e-4c55-9d0e-0d6f3a1e2b77"], self.ACTUAL))
        self.assertFalse(docsql.matches([" claimed | 6f1c0a4e-..."], self.ACTUAL))
        self.assertFalse(docsql.matches([" claimed | 6f1c0a4e-3b8e-4c55-9d0e-0d6f3a1e2b77", " more"], self.ACTUAL))
        self.assertFalse(docsql.matches([" outcome | tok", "---+---", " claimed | ..."], self.ACTUAL))

    def test_ellipsis_and_timestamps(self):
        self.assertTrue(docsql.matches(["ERROR:  IK002: ..."], ["ERROR:  IK002: token does not own it"]))
        self.assertTrue(docsql.matches([" 2026-01-01 00:00:00+00"], [" 2026-12-01 15:40:12.123456+00"]))
        self.assertFalse(docsql.matches(["ERROR:  IK002: ..."], ["ERROR:  IK001: no record"]))


if __name__ == "__main__":
    unittest.main()
