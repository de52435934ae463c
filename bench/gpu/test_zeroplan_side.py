"""Reading zeroplan's output, the GPU profile, the memory sampler (`run.sh --self-test`).

`testdata/train_log.jsonl` is recorded `zeroplan train PLAN --backend cpu
--steps 5 --log-json` output; `testdata/explain_rewrite.txt` recorded
`zeroplan graph models/mosaicbert-base.ron --explain rewrite` standard error.
"""

import io
import os
import time
import unittest

import gpu_memory
import zeroplan_side

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata")


def recorded_log():
    with open(os.path.join(DATA, "train_log.jsonl")) as f:
        return zeroplan_side.read_steps(f, iter(range(100, 200)).__next__)


class ZeroplanSideTest(unittest.TestCase):
    def test_timed_steps_exclude_the_warm_up_and_weigh_by_time(self):
        lines = recorded_log()
        self.assertEqual(len(lines), 5)
        s = zeroplan_side.summarise_steps(lines, warmup=2, steps=3)
        timed = lines[2:]
        seconds = sum(line["step_seconds"] for line in timed)
        tokens = sum(line["tokens_per_s"] * line["step_seconds"] for line in timed)
        self.assertEqual((s["status"], s["timed_steps"], s["steps_run"]), ("ok", 3, 5))
        self.assertAlmostEqual(s["tokens_per_s"], tokens / seconds)
        self.assertAlmostEqual(s["step_ms"], 1e3 * seconds / 3)
        # Each line's tokens are the plan's batch × seq.
        self.assertTrue(all(abs(line["tokens_per_s"] * line["step_seconds"] - tokens / 3) < 1e-6 * tokens
                            for line in timed))

    def test_setup_and_first_step_come_from_the_first_line(self):
        lines = recorded_log()
        s = zeroplan_side.summarise_steps(lines, warmup=2, steps=3)
        self.assertIsNone(s["setup_compile_s"], "a plan file was compiled beforehand")
        self.assertGreater(s["setup_load_s"], 0)
        self.assertEqual(s["first_step_s"], lines[0]["step_seconds"])
        self.assertEqual(s["to_first_step_end_s"], 100, "the clock reading at the first line")
        self.assertTrue(all("setup" not in line for line in lines[1:]))
        self.assertGreater(s["arena_high_water_bytes"], 0)

    def test_too_few_steps_is_an_error(self):
        s = zeroplan_side.summarise_steps(recorded_log()[:3], warmup=2, steps=3)
        self.assertEqual(s["status"], "error")
        self.assertIn("1 timed steps of 3", s["error"])

    def test_non_json_lines_are_skipped(self):
        lines = zeroplan_side.read_steps(io.StringIO('note: x\n{"step": 1}\n'), lambda: 0.5)
        self.assertEqual(lines, [{"step": 1, "_arrived_s": 0.5}])

    def test_explanations_of_the_glu_group(self):
        with open(os.path.join(DATA, "explain_rewrite.txt")) as f:
            groups = zeroplan_side.parse_explanations(f.read())
        glu = [g for g in groups if any(".ffn.gate" in n for n in g["members"])]
        qkv = [g for g in groups if any(".attn.q" in n for n in g["members"])]
        self.assertTrue(glu and qkv, groups)
        g = glu[0]
        self.assertEqual(len(g["members"]), 2)
        self.assertEqual(g["m"], 32 * 128)
        self.assertGreater(g["separate_us"], 0)
        self.assertGreater(g["merged_us"], 0)
        self.assertIn(g["decision"].split()[0], ("merge", "keep"))

    def test_gpu_profiles_from_nvidia_smi_names(self):
        self.assertEqual(zeroplan_side.gpu_profile("NVIDIA H100 80GB HBM3"), "h100-80gb-sxm")
        self.assertEqual(zeroplan_side.gpu_profile("NVIDIA H200"), "h200")
        self.assertEqual(zeroplan_side.gpu_profile("NVIDIA A100-SXM4-80GB"), "a100-80gb")
        self.assertEqual(zeroplan_side.gpu_profile("NVIDIA A100-SXM4-40GB"), "a100-40gb")
        self.assertIsNone(zeroplan_side.gpu_profile("NVIDIA GeForce RTX 4090"))

    def test_the_sampler_reports_the_peak_above_the_baseline(self):
        readings = [100, 150, 400, 250]

        def read():
            return readings.pop(0) if len(readings) > 1 else readings[0]

        with gpu_memory.PeakSampler(read, interval_s=0.001) as s:
            time.sleep(0.05)
        self.assertEqual(s.baseline, 100)
        self.assertEqual(s.peak_bytes, 300)


if __name__ == "__main__":
    unittest.main()
