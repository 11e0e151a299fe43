"""The published configs the sizing tests read, written as config.json files (the fields the
arithmetic reads, as the model cards' config.json have them)."""

import json
from pathlib import Path

# canopylabs/orpheus-3b-0.1-ft: Llama 3.2 3B with its audio tokens added to the vocabulary
ORPHEUS_3B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
              "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128,
              "vocab_size": 156940, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
              "max_position_embeddings": 131072}
# maya-research/maya1: the same Llama 3.2 3B, 20 more tokens
MAYA1_3B = {**ORPHEUS_3B, "vocab_size": 156960}
# SparkAudio/Spark-TTS-0.5B's LLM/: Qwen2.5-0.5B with the BiCodec tokens added
SPARK_05B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
             "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
             "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 166000,
             "tie_word_embeddings": True, "torch_dtype": "bfloat16",
             "max_position_embeddings": 32768}


def write_config(folder: Path, config: dict, subfolder: str = "") -> Path:
    target = folder / subfolder if subfolder else folder
    target.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text(json.dumps(config))
    return folder
