"""Builds a tiny random-weight Llama model that vLLM's CPU build can serve.

    python scripts/make-tiny-model.py DIR

writes DIR/{config.json, model.safetensors, tokenizer.json, ...}: a
LlamaForCausalLM with 2 layers, hidden size 128, 2 attention heads of 64,
2 KV heads, float32 (~1.4 M parameters), and a byte-level BPE tokenizer trained
here on generated text, wrapped as a PreTrainedTokenizerFast with a chat
template. No hub access: everything is made on this machine, in seconds, and
the same seed gives the same weights, so greedy output is the same from run
to run. Idempotent: a DIR that already holds a complete model is left as is.
Run by the real-engine suite (realengine/) with the venv that
scripts/install-vllm.sh makes.

float32, not bf16: on a CPU that advertises AMX, vLLM 0.32 serves a bf16
model with its AMX attention kernel (vllm/v1/attention/backends/cpu_attn.py,
_get_attn_isa), whose worker died with SIGILL (exit code -4) on its first
decode step on this project's machines; float32 takes the AVX-512 kernel.
The model's own dtype is also what an agent registers as the KV dtype of an
engine whose cache_dtype is "auto", so the engines run it as it is saved.
"""

import json
import os
import random
import sys

DONE = ".tiny-model-complete-f32"  # a model of an older recipe is built again

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

WORDS = (
    "the a prefill decode engine router cache block token page request stream "
    "memory transfer agent pair fleet model layer head key value prompt answer "
    "fast slow ready stale heal drain load queue batch rank region kind host "
    "one two three four five six seven eight nine ten hello world system user"
).split()


def corpus(n, rng):
    for _ in range(n):
        yield " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 24))) + "."


def main(out):
    if os.path.exists(os.path.join(out, DONE)):
        return
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    os.makedirs(out, exist_ok=True)
    rng = random.Random(20261203)
    specials = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus(4000, rng), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="</s>",
        chat_template=CHAT_TEMPLATE,
    )
    fast.save_pretrained(out)

    torch.manual_seed(20261203)
    cfg = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=1024,
        bos_token_id=tok.token_to_id("<s>"),
        eos_token_id=tok.token_to_id("</s>"),
        pad_token_id=tok.token_to_id("</s>"),
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id}, f)
    open(os.path.join(out, DONE), "w").close()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make-tiny-model.py DIR")
    main(sys.argv[1])
