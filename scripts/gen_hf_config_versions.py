#!/usr/bin/env python3
"""Writes config.json for the tiny "bf16" model of tests/data/models/hf_bf16
with transformers' own BitNetConfig.save_pretrained, once per major version
of transformers, so the loader is tested against files that transformers
really writes rather than against a hand-made imitation.

    python3 -m venv /tmp/tf4 && /tmp/tf4/bin/pip install "transformers<5"
    python3 -m venv /tmp/tf5 && /tmp/tf5/bin/pip install "transformers>=5"
    /tmp/tf4/bin/python scripts/gen_hf_config_versions.py tests/data/models/hf_bf16_configs
    /tmp/tf5/bin/python scripts/gen_hf_config_versions.py tests/data/models/hf_bf16_configs

Each run writes OUT/transformers<MAJOR>.json (no PyTorch needed: only the
configuration classes are used). The committed files were written by
transformers 4.57.6 and 5.24.0. The two layouts differ where it matters:

  4.x  "rope_theta": 10000.0 at the top level
  5.x  "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}
       and no top-level rope_theta (also "pad_token_id": null)

The hyper-parameters are those of hf_bf16/config.json, including its RoPE
base of 10000 (BitNetConfig's default is 500000, so a reader that misses
the base is caught) and its separate LM head (tie_word_embeddings false,
which is also BitNetConfig's default). architectures, dtype and the
quantization_config are set as saving the model itself would set them.
"""
import os
import sys

import transformers
from transformers import BitNetConfig, BitNetQuantConfig


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: gen_hf_config_versions.py OUT_DIR")
    out = sys.argv[1]
    major = transformers.__version__.split(".")[0]
    quant = BitNetQuantConfig(linear_class="autobitlinear", quantization_mode="online")
    cfg = BitNetConfig(
        vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, hidden_act="relu2",
        max_position_embeddings=128, rms_norm_eps=1e-5, bos_token_id=297, eos_token_id=298,
        rope_theta=10000.0, tie_word_embeddings=False,
        architectures=["BitNetForCausalLM"], dtype="bfloat16",
        quantization_config=quant.to_dict())
    tmp = os.path.join(out, f".tmp-transformers{major}")
    cfg.save_pretrained(tmp)
    dst = os.path.join(out, f"transformers{major}.json")
    os.replace(os.path.join(tmp, "config.json"), dst)
    os.rmdir(tmp)
    print(f"{dst}: written by transformers {transformers.__version__}")


if __name__ == "__main__":
    main()
