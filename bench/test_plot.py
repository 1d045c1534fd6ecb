#!/usr/bin/python3
"""Unit tests of bench/plot.py's drawing (scales, ticks, the two charts), standard library only:
    /usr/bin/python3 -m unittest discover -s bench -p 'test_*.py'
(the suite bench-smoke runs them)."""
import math
import os
import sys
import unittest
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plot  # noqa: E402

SVG = "{http://www.w3.org/2000/svg}"


class Ticks(unittest.TestCase):
    def test_nice_ticks_cover_the_range_in_round_steps(self):
        self.assertEqual(plot.nice_ticks(0, 97), [0, 20, 40, 60, 80, 100])
        self.assertEqual(plot.nice_ticks(0, 1), [0, 0.2, 0.4, 0.6, 0.8, 1.0])
        ticks = plot.nice_ticks(3.3, 7.9)
        self.assertLessEqual(ticks[0], 3.3)
        self.assertGreaterEqual(ticks[-1], 7.9)

    def test_nice_ticks_of_a_single_value_or_reversed_bounds(self):
        self.assertEqual(plot.nice_ticks(5, 5)[0], 5)
        self.assertGreater(len(plot.nice_ticks(5, 5)), 1)
        self.assertEqual(plot.nice_ticks(97, 0), plot.nice_ticks(0, 97))

    def test_log_ticks(self):
        self.assertEqual(plot.log_ticks(0.05, 30), [0.01, 0.1, 1, 10, 100])
        self.assertEqual(plot.log_ticks(2, 30), [1, 2, 5, 10, 20, 50, 100])
        self.assertEqual(plot.log_ticks(1, 1), [1, 2, 5, 10])

    def test_nines(self):
        self.assertAlmostEqual(plot.nines(90), 1)
        self.assertAlmostEqual(plot.nines(99.9), 3)
        self.assertEqual(plot.nines(0), 0)
        self.assertTrue(math.isfinite(plot.nines(100)))

    def test_labels(self):
        self.assertEqual([plot.label(v) for v in (0, 0.05, 12, 1500, 2_000_000)], ["0", "0.05", "12", "1.5k", "2M"])


class Scales(unittest.TestCase):
    def test_linear_and_log_map_the_bounds_to_the_pixels(self):
        s = plot.Scale(0, 100, 300, 40)  # a y axis: up is smaller
        self.assertEqual((s(0), s(100), s(50)), (300, 40, 170))
        g = plot.Scale(1, 100, 0, 200, "log")
        self.assertAlmostEqual(g(10), 100)

    def test_an_empty_range_does_not_divide_by_zero(self):
        self.assertEqual(plot.Scale(5, 5, 0, 100)(5), 0)


class Charts(unittest.TestCase):
    def parse(self, svg):
        return ET.fromstring(svg)

    def test_bar_chart_draws_one_bar_per_value_and_skips_missing(self):
        values = {("2 clients", "a"): 10.0, ("2 clients", "b"): 20.0, ("16 clients", "a"): float("nan")}
        root = self.parse(plot.bar_chart("t & <x>", ["2 clients", "16 clients"], ["a", "b"], values, "tps"))
        bars = [r for r in root.iter(SVG + "rect") if r.find(SVG + "title") is not None]
        self.assertEqual(len(bars), 2)
        heights = sorted(float(r.get("height")) for r in bars)
        self.assertAlmostEqual(heights[1], 2 * heights[0], delta=1)
        self.assertIn("t & <x>", [t.text for t in root.iter(SVG + "text")])

    def test_colours_follow_the_names(self):
        svg = plot.bar_chart("t", ["c"], ["a", "b"], {("c", "a"): 1, ("c", "b"): 2}, "y", colours={"b": "#123456"})
        self.assertIn('fill="#123456"', svg)

    def test_line_chart_on_log_axes_leaves_out_what_it_cannot_place(self):
        lines = [("x", [(50, 0.1), (90, 0.0), (99, 2.0)]), ("empty", [])]
        root = self.parse(plot.line_chart("t", lines, "ms", x_kind="nines", y_kind="log", x_ticks=[50, 90, 99],
                                          x_labels=["p50", "p90", "p99"]))
        self.assertEqual(len(list(root.iter(SVG + "circle"))), 2)
        self.assertEqual(len(list(root.iter(SVG + "polyline"))), 1)
        self.assertTrue({"p50", "p90", "p99"} <= {t.text for t in root.iter(SVG + "text")})


if __name__ == "__main__":
    unittest.main()
