"""The tables, on recorded records (`run.sh --self-test`).

`testdata/constructed_gpu_run.jsonl` holds records of the shapes the workers
write with round numbers chosen so every cell can be worked out by hand (they
are not measurements); `testdata/cpu_dry_run.jsonl` is what a real
`run.sh --backend cpu` dry run wrote.
"""

import os
import unittest

import report

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata")


def rows(table):
    """Body rows of a Markdown table as lists of cells."""
    lines = [line for line in table.strip().splitlines() if line.startswith("|")][2:]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines]


def row(table, *key):
    for r in rows(table):
        if tuple(r[: len(key)]) == tuple(str(k) for k in key):
            return r
    raise AssertionError(f"no row {key} in\n{table}")


class ReportTest(unittest.TestCase):
    def setUp(self):
        self.rec = report.Records(report.load(os.path.join(DATA, "constructed_gpu_run.jsonl")))

    def test_mfu_is_six_psi_tokens_over_the_measured_peak(self):
        self.assertAlmostEqual(report.mfu(1e5, 1e8, 1000.0), 6 * 1e8 * 1e5 / 1e15)
        self.assertIsNone(report.mfu(1e5, 1e8, None), "no peak measured, no MFU")

    def test_throughput_row_has_rates_mfu_peaks_and_ratios(self):
        r = row(report.throughput(self.rec), "bert-base", 32)
        self.assertEqual(r[2:6], ["100,000,000", "40,960", "81,920", "102,400"])
        # 6 · 1e8 · 40,960 / 1e15 = 2.46 %; 4.92 %; 6.14 %.
        self.assertEqual(r[6:9], ["2.5 %", "4.9 %", "6.1 %"])
        self.assertEqual(r[9:12], ["5.00", "8.00", "7.00"])
        self.assertEqual(r[12:], ["0.50", "0.40"])

    def test_failed_and_skipped_runs_say_so_and_give_no_ratio(self):
        r = row(report.throughput(self.rec), "bert-base", 64)
        self.assertEqual(r[3:6], ["error", "oom", "102,400"])
        self.assertEqual(r[12:], ["—", "—"])
        r = row(report.throughput(self.rec), "mosaicbert-base", 32)
        self.assertEqual(r[3:6], ["—", "skipped", "—"])

    def test_fidelity_sets_the_plan_against_the_run(self):
        r = row(report.fidelity(self.rec), "bert-base", 32)
        self.assertEqual(r[2:], ["50.0", "100.0", "2.00", "81,920", "4.00", "5.00", "1.25", "3.00", "3.00"])
        r = row(report.fidelity(self.rec), "bert-base", 64)
        self.assertEqual(r[2:5], ["90.0", "error", "—"], "the prediction stays, the measurement is missing")

    def test_compile_time_row(self):
        r = row(report.compile_time(self.rec), "bert-base", 32)
        self.assertEqual(r[2:], ["2.50", "12.00", "cold", "0.50", "14.00", "45.00", "1.50"])

    def test_glu_rows_compare_the_cost_models_choice_with_the_faster_form(self):
        table = report.glu(self.rec)
        self.assertEqual(row(table, "mosaicbert-base", 32)[2:], ["4,096", "60.0", "55.0", "merge", "70.0", "80.0",
                                                                 "keep", "no"])
        self.assertEqual(row(table, "mosaicbert-base", 64)[5:], ["keep", "—", "—", "—", "—"])

    def test_every_failure_is_listed(self):
        text = report.problems(self.rec)
        self.assertIn("- zeroplan bert-base batch 64: error: node `layer0.attn.qkv.mm`: cuBLAS failed", text)
        self.assertIn("- eager bert-base batch 64: oom:", text)
        self.assertIn("- eager mosaicbert-base batch 32: skipped:", text)
        self.assertIn("- GLU mosaicbert-base batch 64: not measured: no torch", text)

    def test_section_header_names_date_device_commit_command_and_peak(self):
        text = report.section(report.load(os.path.join(DATA, "constructed_gpu_run.jsonl")))
        self.assertTrue(text.startswith("## 2000-01-01 · NVIDIA H100 80GB HBM3 · constructed\n"), text[:80])
        self.assertIn("Command: `constructed for test_report.py: not a measurement`", text)
        self.assertIn("bf16 GEMM peak 1000 TFLOP/s", text)
        self.assertEqual(text.count("| model | batch |"), 5, "throughput, memory, fidelity, compile, GLU")

    def test_the_recorded_cpu_dry_run_makes_a_section_without_pytorch(self):
        records = report.load(os.path.join(DATA, "cpu_dry_run.jsonl"))
        text = report.section(records)
        rec = report.Records(records)
        self.assertIn("no bf16 GEMM peak measured", text)
        zeroplan = [r for r in rec.runs if r["side"] == "zeroplan"]
        self.assertTrue(zeroplan and all(r["status"] == "ok" for r in zeroplan), "the dry run's zeroplan runs")
        for r in zeroplan:
            cells = row(report.throughput(rec), r["model"], r["batch"])
            self.assertEqual(cells[3], f"{r['tokens_per_s']:,.0f}")
            self.assertEqual(cells[4:6], ["skipped", "skipped"])
            self.assertEqual(r["timed_steps"], rec.meta["steps"])
            # The planner rounds each buffer up to 256 bytes; the high water ends at the last one's real end.
            arena = r["predicted"]["arena_bytes"]
            self.assertTrue(arena - 256 < r["arena_high_water_bytes"] <= arena, "the run wrote the plan's arena")


if __name__ == "__main__":
    unittest.main()
