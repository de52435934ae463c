"""The spec reader, the Hugging Face mapping and Ψ (`run.sh --self-test`)."""

import json
import os
import unittest

import spec as specs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata")


def model(name):
    return specs.load(os.path.join(ROOT, "models", name))


class SpecTest(unittest.TestCase):
    def test_bert_base_maps_onto_bert_base_uncased_config(self):
        # bert-base-uncased's config.json, the fields BertConfig takes.
        want = {"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                "intermediate_size": 3072, "hidden_act": "gelu", "max_position_embeddings": 512,
                "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_dropout_prob": 0.1,
                "attention_probs_dropout_prob": 0.1, "initializer_range": 0.02, "tie_word_embeddings": True}
        self.assertEqual(specs.hf_bert_config(model("bert-base.ron")), want)

    def test_parameter_counts_are_hugging_faces_bert_for_masked_lm(self):
        # BertForMaskedLM (no pooler; decoder tied to the word embeddings):
        # bert-base-uncased 109,514,298 and bert-large-uncased 335,174,458 parameters.
        self.assertEqual(specs.params(model("bert-base.ron")), 109_514_298)
        self.assertEqual(specs.params(model("bert-large.ron")), 335_174_458)

    def test_parameter_counts_are_zeroplans(self):
        # `zeroplan compile SPEC ... --json`'s `params`, recorded for each bundled spec.
        with open(os.path.join(DATA, "zeroplan_params.json")) as f:
            recorded = json.load(f)
        self.assertGreaterEqual(len(recorded), 3)
        for path, params in recorded.items():
            with self.subTest(path):
                self.assertEqual(specs.params(specs.load(os.path.join(ROOT, path))), params)

    def test_mosaicbert_is_refused_with_the_reason(self):
        with self.assertRaises(specs.SpecError) as e:
            specs.hf_bert_config(model("mosaicbert-base.ron"))
        message = str(e.exception)
        self.assertIn("feed_forward: Glu", message)
        self.assertIn("position: Alibi", message)
        self.assertIn("trust_remote_code", message)

    def test_comments_options_and_nested_values_parse(self):
        text = """// a comment
        ( name: "x", vocab_size: 10, hidden: 4, layers: 1, heads: 2, intermediate: 8, // trailing
          max_position: 16, activation: GeluTanh, feed_forward: Mlp, position: Learned, norm: Post,
          layer_norm_eps: 1e-5, hidden_dropout: 0.0, attention_dropout: 0.0, embedding_size: Some(4),
          head: Mlm )"""
        s = specs.parse(text)
        self.assertEqual((s["name"], s["embedding_size"], s["layer_norm_eps"]), ("x", 4, 1e-5))
        self.assertEqual(s["type_vocab"], 2, "defaults fill in")
        self.assertEqual(specs.hf_bert_config(s)["hidden_act"], "gelu_pytorch_tanh")

    def test_a_missing_field_is_named(self):
        with self.assertRaises(specs.SpecError) as e:
            specs.parse('( name: "x", vocab_size: 10 )', "m.ron")
        self.assertIn("m.ron: the field `hidden` is missing", str(e.exception))
        with self.assertRaises(specs.SpecError):
            specs.parse("[1, 2]", "m.ron")


if __name__ == "__main__":
    unittest.main()
