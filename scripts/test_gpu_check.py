"""The GPU check's own logic, without a GPU: the comparisons, the test
counts, the report (run by tests/gpu_check.rs, so in CI)."""

import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_check  # noqa: E402


def log(losses, norms):
    return [{"loss": l, "grad_norm": n, "tokens_per_s": 1.0} for l, n in zip(losses, norms)]


class Agreement(unittest.TestCase):
    def test_within_tolerance_passes_with_the_worst_error(self):
        figures = gpu_check.agreement(log([4.0, 3.0], [1.0, 1.0]), log([4.0, 3.00001], [1.0, 1.0]), 1e-5)
        self.assertAlmostEqual(figures["loss_rel_err"], 1e-5 / 3.00001, places=9)
        self.assertEqual(figures["grad_norm_rel_err"], 0.0)

    def test_past_tolerance_fails_naming_the_figure(self):
        with self.assertRaises(gpu_check.StepFailed) as e:
            gpu_check.agreement(log([4.0], [1.0]), log([4.0], [1.1]), 1e-2)
        self.assertIn("grad_norm", str(e.exception))
        self.assertGreater(e.exception.figures["grad_norm_rel_err"], 0.09)

    def test_logs_of_different_length_fail(self):
        with self.assertRaises(gpu_check.StepFailed):
            gpu_check.agreement(log([4.0], [1.0]), log([4.0, 3.0], [1.0, 1.0]), 1e-2)
        with self.assertRaises(gpu_check.StepFailed):
            gpu_check.agreement([], [], 1e-2)


class TestCounts(unittest.TestCase):
    def test_sums_every_result_line_and_names_failures(self):
        out = ("test a ... ok\ntest b ... FAILED\n"
               "test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out\n"
               "test result: ok. 4 passed; 0 failed; 2 ignored; 0 measured; 0 filtered out\n")
        self.assertEqual(gpu_check._test_counts(out), (5, 1))
        self.assertEqual(gpu_check._failed_names(out), "b")

    def test_names_failures_whose_line_the_output_split(self):
        # --nocapture: a test's own printing lands between its name and its outcome.
        out = ("test a ... attention 0.5 ms\nok\ntest b ... worst error 3e-1\nFAILED\n\nfailures:\n\n"
               "---- b stdout ----\npanicked\n\nfailures:\n    b\n\n"
               "test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out\n")
        self.assertEqual(gpu_check._test_counts(out), (1, 1))
        self.assertEqual(gpu_check._failed_names(out), "b")


class Kernels(unittest.TestCase):
    def test_reads_each_kernels_first_launch_in_its_units(self):
        # A table in ncu's `--csv --page raw` layout (ids, then a units row),
        # made by hand: ncu's own messages first, a kernel launched twice.
        with open(os.path.join(gpu_check.TESTDATA, "constructed_ncu_raw.csv"), encoding="utf-8") as f:
            figures = gpu_check.ncu_figures(f.read())
        self.assertEqual(sorted(figures), ["zp_layer11_ffn_norm_back0_fused", "zp_sum_to_bf16_bf16_cols"])
        self.assertEqual(figures["zp_layer11_ffn_norm_back0_fused"],
                         "85.1 µs, 0.0315 GB, DRAM 18 %, occupancy 9 %, 76 registers, 264 × 96")
        # The first launch's figures, its thousands separator read.
        self.assertEqual(figures["zp_sum_to_bf16_bf16_cols"],
                         "3.3 µs, 0.0084 GB, DRAM 62 %, occupancy 81 %, 40 registers, 1026 × 256")

    def test_an_output_without_a_table_fails_the_step(self):
        with self.assertRaises(gpu_check.StepFailed):
            gpu_check.ncu_figures("==PROF== No kernels were profiled.\n")


class Report(unittest.TestCase):
    def test_a_subset_merges_into_the_existing_report(self):
        with tempfile.TemporaryDirectory() as out:
            self.assertEqual(gpu_check.main(["--out", out, "--dry-run", "--steps", "environment"]), 0)
            self.assertEqual(gpu_check.main(["--out", out, "--dry-run", "--steps", "nccl", "--fail", "nccl"]), 1)
            with open(os.path.join(out, "report.json")) as f:
                report = json.load(f)
            self.assertEqual(report["steps"]["environment"]["outcome"], "passed")
            self.assertEqual(report["steps"]["nccl"]["outcome"], "failed")
            with open(os.path.join(out, "report.md")) as f:
                self.assertIn("1 of 2 steps passed", f.read())

    def test_an_unknown_step_is_refused(self):
        with tempfile.TemporaryDirectory() as out:
            self.assertEqual(gpu_check.main(["--out", out, "--dry-run", "--steps", "nope"]), 2)


if __name__ == "__main__":
    unittest.main()
