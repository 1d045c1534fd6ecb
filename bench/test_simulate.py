#!/usr/bin/python3
"""Unit tests of bench/simulate.py's pure parts (windows, per-period rows), standard library only:
    /usr/bin/python3 -m unittest discover -s bench -p 'test_*.py'"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import simulate  # noqa: E402


class Windows(unittest.TestCase):
    def test_overlaps(self):
        windows = [(10.0, 11.0), (20.0, 20.5)]
        self.assertTrue(simulate.overlaps(9.0, 10.0, windows))   # ends as one starts
        self.assertTrue(simulate.overlaps(10.2, 10.3, windows))  # inside
        self.assertTrue(simulate.overlaps(19.0, 25.0, windows))  # around
        self.assertFalse(simulate.overlaps(11.5, 19.9, windows))  # between
        self.assertFalse(simulate.overlaps(30.0, 31.0, windows))
        self.assertFalse(simulate.overlaps(1.0, 2.0, []))

    def test_split_by_windows(self):
        claims = [(9.0, 9.5, 500.0, 1.0), (10.5, 10.6, 100.0, 100.0), (12.0, 12.1, 100.0, 100.0)]
        during, without = simulate.split_by_windows(claims, [(10.0, 11.0)])
        self.assertEqual((during, without), ([100.0], [500.0, 100.0]))

    def test_pct(self):
        self.assertEqual(simulate.pct(list(range(1, 101)), 99), 99)
        self.assertEqual(simulate.pct([3, 1, 2], 50), 2)
        self.assertIsNone(simulate.pct([], 99))


class Periods(unittest.TestCase):
    def test_table_deltas_count_new_tables_and_leave_dropped_ones_out(self):
        prev = {"1": {"autovacuums": "2"}, "2": {"autovacuums": "5"}}
        cur = {"1": {"autovacuums": "3"}, "3": {"autovacuums": "1"}}  # 2 dropped, 3 new
        self.assertEqual(simulate.table_deltas(prev, cur, "autovacuums"), 2)

    def test_period_rows(self):
        run = {"t0": 100.0, "period": 10.0, "periods": 2}
        samples = [{"k": "0", "wal": "1000"}, {"k": "1", "wal": "3000"}, {"k": "2", "wal": "3500"}]
        table = {"relname": "keys_x", "live": "5", "dead": "1", "autovacuums": "0", "total_bytes": "8192",
                 "index_bytes": "4096"}
        tables = [{"k": "1", "relid": "7", **table}, {"k": "2", "relid": "7", **table, "autovacuums": "1"}]
        sweeps = [{"start": "105.0", "ms": "2.5", "deleted": "0", "dropped": "1", "made": "1"}]
        claims = [(101.0, 101.002, 2.0, 2.0), (102.0, 102.004, 4.0, 3.0), (111.0, 111.001, 1.0, 1.0)]
        first, second = simulate.period_rows("partitions", run, samples, tables, sweeps, claims)
        self.assertEqual((first["period"], first["day"], first["claims"], first["p99_ms"]), (1, 0.5, 2, 4.0))
        self.assertEqual((first["wal_bytes"], first["dropped"], first["expiry_ms"]), (2000, 1, 2.5))
        self.assertEqual((second["claims"], second["wal_bytes"], second["autovacuums"]), (1, 500, 1))
        self.assertEqual(second["sweeps"], 0)
        self.assertEqual(second["total_bytes"], 8192)


if __name__ == "__main__":
    unittest.main()
